"""HTTP worker hardening (#11.2, #11.3, #11.4): the drain stops the driver, bad ids write
nothing, a failing token source is a typed error naming the execution."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from pathlib import Path

import httpx
import pytest

import loom
from loom.model import ExecutionStatus
from loom.placement import ExecutionPackage, LocalWorkerRuntime
from loom.placement.http import (
    CloudRunWorkerRuntime,
    NoAuth,
    RemoteWorkerError,
    RemoteWorkerRuntime,
    create_worker_app,
)
from loom.storage import InMemoryStore, SQLiteStore
from tests.support.http_rig import BASE, Effects, Rig, pkg, rig_flows


async def test_a_loser_whose_rival_finished_gets_the_superseded_409(rig: Rig) -> None:
    """docs/deploy.md (#11.6): the loser is told 409 even when its rival already finished."""
    package = pkg("race-done", "slow")
    first = asyncio.ensure_future(rig.post(package.to_dict()))
    await rig.effects.reach("gated-step", 1)
    second = asyncio.ensure_future(rig.post(package.to_dict()))
    await rig.effects.reach("gated-step", 2)
    rig.later_gate.set()  # the rival (newer fence) finishes first...
    won = await second
    assert won.status_code == 200 and won.json()["status"] == "completed"
    rig.gate.set()  # ...then the loser's step ends and its write is refused
    lost = await first
    assert lost.status_code == 409 and lost.json()["code"] == "superseded"
    assert rig.effects == {"one": 1, "gated-step": 2, "two": 1}


async def test_an_attempt_stopped_at_the_drain_deadline_stops_running(tmp_path: Path) -> None:
    effects = Effects()
    gate = asyncio.Event()
    runtime = loom.WorkflowRuntime(SQLiteStore(tmp_path / "drain.db"))
    runtime.register(*rig_flows(effects, gate))
    app = create_worker_app(runtime, auth=NoAuth(), drain_timeout=0.2, close_runtime=False)
    service = app.state.loom_worker
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client,
        app.router.lifespan_context(app),
    ):
        in_flight = asyncio.ensure_future(
            client.post("/execute", content=pkg("d-1", "slow").to_json())
        )
        await effects.reach("gated-step", 1)
        driving = runtime.handle("d-1")
        # SIGTERM with a slow connection still open: the lifespan shutdown (and so
        # runtime.close()) has not run yet when the attempt's deadline passes.
        service.begin_drain()
        response = await in_flight
        assert response.status_code == 503 and response.json()["execution_id"] == "d-1"
        gate.set()  # the in-flight step ends now: its holder must not record it or go on
        with contextlib.suppress(loom.LoomError):
            await driving.settled(10)
        assert effects == {"one": 1, "gated-step": 1}
        state = await runtime.load_state("d-1")
        assert state is not None and state.status is ExecutionStatus.RUNNING
        assert [op.name for op in state.ops.values() if op.status == "completed"] == ["one"]
    await runtime.close()


BAD_IDS = ["new\nline", "nul\x00", "esc\x1b[31m", "sep\u2028arator"]


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_a_malformed_execution_id_takes_no_fence(bad: str) -> None:
    store = InMemoryStore()
    runtime = loom.WorkflowRuntime(store)
    runtime.register(*rig_flows(Effects(), asyncio.Event()))
    app = create_worker_app(runtime, auth=NoAuth())
    body = json.dumps(pkg("placeholder").to_dict()).replace("placeholder", json.dumps(bad)[1:-1])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        response = await c.post(
            "/execute", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    assert await store.current_fence(bad) == 0  # "writes nothing": not even a fence
    assert [eid async for eid in store.iterate_execution_ids()] == []
    with pytest.raises(loom.LoomError):
        await LocalWorkerRuntime(runtime).allocate(_unchecked_package(bad))
    assert await store.current_fence(bad) == 0
    await runtime.close()


def _unchecked_package(eid: str) -> ExecutionPackage:
    """A package built without the wire decoder (a programmatic caller)."""
    package = copy.copy(pkg("x"))
    object.__setattr__(package, "execution_id", eid)
    return package


class Boom(RuntimeError):
    pass


def _raising_source(*_: object) -> str:
    raise Boom("metadata server unreachable")


async def _oserror_source(*_: object) -> str:
    raise OSError("no route to host")


@pytest.mark.parametrize("source", [_raising_source, _oserror_source])
async def test_a_token_source_that_raises_is_a_typed_error_naming_the_execution(
    source: object,
) -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        remote = RemoteWorkerRuntime(BASE, token_source=source, client=client)  # type: ignore[arg-type]
        cloud = CloudRunWorkerRuntime(BASE, token_source=source, client=client)  # type: ignore[arg-type]
        for worker in (remote, cloud):
            package = pkg("tok-1")
            lease = await worker.allocate(package)
            with pytest.raises(RemoteWorkerError) as caught:
                await worker.execute(lease, package)
            assert caught.value.execution_id == "tok-1"
            assert "token" in str(caught.value)
            assert isinstance(caught.value.__cause__, (Boom, OSError))
    assert sent == []  # nothing was sent without credentials
