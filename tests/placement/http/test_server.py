"""The worker app (loom.placement.http._server): outcomes, typed 4xx refusals that store
nothing, health and drain, fuzzed bodies.

Every refused request is checked for its typed body AND for an untouched store: refused
before the attempt takes its fence, nothing is written at all.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loom
from loom.errors import FlowNotFoundError, InvalidInputError, ResumeValidationError
from loom.model import EventType, ExecutionStatus
from loom.placement import ExecutionResult, LocalDispatcher, ResumeEvent
from loom.placement.http import NoAuth, RemoteWorkerRuntime, create_worker_app
from loom.storage import InMemoryStore, SQLiteStore
from tests.support.http_rig import BASE, SECRET, Effects, Rig, pkg, rig_flows

# ------------------------------------------------------------------------------ outcomes


async def test_execute_runs_a_package_and_a_redispatch_reruns_nothing(rig: Rig) -> None:
    response = await rig.post(pkg().to_dict())
    assert response.status_code == 200, response.text
    result = ExecutionResult.from_json(response.content)
    assert result.status is ExecutionStatus.COMPLETED and result.output == 4
    assert rig.effects == {"one": 1, "two": 1, "three": 1}
    events = await rig.store.read("e-1")
    # Lost-response redispatch: the same package again returns the same result, runs nothing.
    again = await rig.remote().execute(await rig.remote().allocate(pkg()), pkg())
    assert again == result
    assert rig.effects == {"one": 1, "two": 1, "three": 1}
    assert await rig.store.read("e-1") == events
    assert rig.errors == [] and rig.superseded == []


async def test_a_flow_failure_is_an_outcome_never_retried(rig: Rig) -> None:
    dispatcher = LocalDispatcher(rig.remote(), max_attempts=3)
    result = await dispatcher.dispatch(pkg("f-1", "fails"))
    assert result.status is ExecutionStatus.FAILED
    assert result.error is not None and "flow-level failure" in result.error["message"]
    assert dispatcher.attempts == 1 and rig.effects == {"one": 1}


async def test_suspend_then_resume_by_a_fresh_dispatch(rig: Rig) -> None:
    dispatcher = LocalDispatcher(rig.remote())
    suspended = await dispatcher.dispatch(pkg("g-1", "approve", 10))
    assert suspended.status is ExecutionStatus.SUSPENDED
    before = await rig.store.read("g-1")
    # A wrongly shaped decision is refused with its type across the wire; nothing appended.
    with pytest.raises(ResumeValidationError):
        await dispatcher.dispatch(
            pkg("g-1", "approve", 10, resume_event=ResumeEvent("Go", {"approved": "maybe"}))
        )
    assert await rig.store.read("g-1") == before
    done = await dispatcher.dispatch(
        pkg("g-1", "approve", 10, resume_event=ResumeEvent("Go", {"approved": True}))
    )
    assert done.status is ExecutionStatus.COMPLETED and done.output == 12
    assert [type(e) for _, e in rig.errors] == [ResumeValidationError]


# ------------------------------------------------------------------------------ refusals


def _bad_requests() -> list[Any]:
    good = pkg().to_dict()
    return [
        pytest.param(b"{not json", {}, 400, "wire_format", id="malformed-json"),
        pytest.param(b"\xff\xfe\x00", {}, 400, "wire_format", id="invalid-utf8"),
        pytest.param(b'{"a": NaN}', {}, 400, "wire_format", id="nan"),
        pytest.param(b"[1, 2]", {}, 400, "wire_format", id="not-an-object"),
        pytest.param(b"[" * 200 + b"]" * 200, {}, 400, "wire_format", id="deeply-nested"),
        pytest.param(
            json.dumps({**good, "wire_version": 3}), {}, 400, "wire_format", id="wire-version-3"
        ),
        pytest.param(
            json.dumps({**good, "wire_version": None}), {}, 400, "wire_format", id="no-version"
        ),
        pytest.param(
            json.dumps({**good, "execution_id": ""}), {}, 400, "wire_format", id="empty-id"
        ),
        pytest.param(
            json.dumps({**good, "execution_id": "x" * 300}), {}, 400, "wire_format", id="long-id"
        ),
        pytest.param(
            json.dumps({**good, "execution_id": 7}), {}, 400, "wire_format", id="id-not-a-string"
        ),
        pytest.param(
            json.dumps({**good, "flow_id": "no-such-flow"}),
            {},
            404,
            "flow_not_found",
            id="unknown-flow",
        ),
        pytest.param(
            json.dumps({**good, "flow_version": "9"}), {}, 404, "flow_not_found", id="unknown-ver"
        ),
        pytest.param(
            json.dumps({**good, "input": "x" * 5000}),
            {},
            413,
            "payload",
            id="oversized-by-content-length",
        ),
        pytest.param(
            None,
            {"chunks": [b'{"wire_version": 1, "input": "', b"x" * 3000, b"y" * 3000, b'"}']},
            413,
            "payload",
            id="oversized-streamed-chunked",
        ),
        pytest.param(
            json.dumps(good),
            {"headers": {"content-type": "text/plain"}},
            415,
            "wire_format",
            id="not-json-media-type",
        ),
        pytest.param(
            json.dumps({**good, "input": "not-an-int"}),
            {},
            422,
            "invalid_input",
            id="invalid-input",
        ),
        pytest.param(
            json.dumps(
                {**good, "intent": "resume", "resume_event": {"event_type": "Go", "payload": {}}}
            ),
            {},
            404,
            "execution_not_found",
            id="resume-unknown-execution",
        ),
    ]


@pytest.mark.parametrize(("body", "extra", "status", "code"), _bad_requests())
async def test_bad_requests_get_typed_4xx_and_store_nothing(
    rig: Rig, body: Any, extra: dict[str, Any], status: int, code: str
) -> None:
    kw: dict[str, Any] = {}
    if "chunks" in extra:
        chunks = extra["chunks"]

        async def stream() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        kw["content"] = stream()  # no Content-Length: only the streamed size can tell
        kw["headers"] = {"content-type": "application/json"}
    if "headers" in extra:
        kw["headers"] = extra["headers"]
    response = await rig.post(body, **kw)
    assert response.status_code == status, response.text
    data = response.json()
    assert data["code"] == code
    assert data["detail"]["code"] == code and data["detail"]["type"]
    assert isinstance(data["error"], str) and data["error"]
    await rig.assert_nothing_stored()
    assert rig.effects == {}
    assert len(rig.errors) == 1 and rig.superseded == []


async def test_a_lying_content_length_is_caught_by_the_streamed_size(rig: Rig) -> None:
    async def stream() -> AsyncIterator[bytes]:
        yield b'{"wire_version": 1, "pad": "' + b"x" * 5000 + b'"}'

    response = await rig.post(
        None,
        content=stream(),
        headers={"content-type": "application/json", "content-length": "10"},
    )
    assert response.status_code == 413
    await rig.assert_nothing_stored()


async def test_typed_refusals_are_rebuilt_by_the_remote_runtime(rig: Rig) -> None:
    remote = rig.remote()
    lease = await remote.allocate(pkg())
    with pytest.raises(FlowNotFoundError):
        await remote.execute(lease, pkg(flow="no-such-flow"))
    with pytest.raises(InvalidInputError):
        await remote.execute(lease, pkg(n="not-an-int"))
    await rig.assert_nothing_stored()


# ------------------------------------------------------------------------------ health, drain


async def test_health_and_readiness(rig: Rig) -> None:
    assert (await rig.client.get("/healthz")).json() == {"status": "alive"}
    ready = await rig.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    health = await rig.remote().health()
    assert health.healthy and health.detail["status"] == 200
    assert (await rig.client.get("/nowhere")).status_code == 404
    assert (await rig.client.get("/execute")).status_code == 405


async def test_readiness_fails_when_the_store_does_not_answer(tmp_path: Path) -> None:
    class DeadStore(InMemoryStore):
        async def last_sequence(self, execution_id: str) -> int:
            raise loom.errors.StorageError("connection refused")

    runtime = loom.WorkflowRuntime(DeadStore())
    app = create_worker_app(runtime, auth=NoAuth())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        assert (await c.get("/healthz")).status_code == 200  # alive, but not ready
        ready = await c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["code"] == "storage"
        assert not (await RemoteWorkerRuntime(BASE, client=c).health()).healthy
    await runtime.close()


async def test_drain_lets_in_flight_attempts_finish_and_refuses_new_work(rig: Rig) -> None:
    service = rig.app.state.loom_worker
    async with rig.app.router.lifespan_context(rig.app):
        in_flight = asyncio.ensure_future(rig.post(pkg("d-1", "slow").to_dict()))
        await rig.effects.reach("gated-step", 1)
        inflight = await rig.client.get("/inflight", headers={"authorization": f"Bearer {SECRET}"})
        assert inflight.json() == {"execution_ids": ["d-1"], "draining": False}
        service.begin_drain()  # what SIGTERM does under `loom worker serve`
        refused = await rig.post(pkg("d-2").to_dict())
        assert refused.status_code == 503
        assert (await rig.client.get("/readyz")).status_code == 503
        rig.gate.set()  # the in-flight step finishes within the drain bound
    response = await in_flight
    assert response.status_code == 200
    assert ExecutionResult.from_json(response.content).status is ExecutionStatus.COMPLETED
    assert rig.effects == {"one": 1, "gated-step": 1, "two": 1}


async def test_drain_bound_leaves_the_execution_resumable(tmp_path: Path) -> None:
    effects = Effects()
    gate = asyncio.Event()
    db = tmp_path / "drain.db"
    runtime = loom.WorkflowRuntime(SQLiteStore(db))
    runtime.register(*rig_flows(effects, gate))
    app = create_worker_app(runtime, auth=NoAuth(), drain_timeout=0.2, close_runtime=True)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)
    async with app.router.lifespan_context(app):
        in_flight = asyncio.ensure_future(
            client.post("/execute", content=pkg("d-3", "slow").to_json())
        )
        await effects.reach("gated-step", 1)
    # The step never finished within the bound: the attempt was stopped, the caller told so.
    response = await in_flight
    assert response.status_code == 503 and response.json()["execution_id"] == "d-3"
    await client.aclose()
    # Nothing half-written: the execution is running in the log and a fresh runtime finishes it.
    gate.set()
    fresh = loom.WorkflowRuntime(SQLiteStore(db))
    fresh.register(*rig_flows(effects, gate))
    state = await fresh.load_state("d-3")
    assert state is not None and state.status is ExecutionStatus.RUNNING
    report = await loom.recover_abandoned(fresh, is_abandoned=lambda s: True, timeout=10)
    assert report.outcomes["d-3"].status is ExecutionStatus.COMPLETED
    assert effects == {"one": 1, "gated-step": 2, "two": 1}
    types = [e.type for e in await fresh.store.read("d-3")]
    assert types.count(EventType.EXECUTION_STARTED) == 1
    await fresh.close()


# ------------------------------------------------------------------------------ fuzz


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.one_of(
        st.binary(max_size=600),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
            lambda children: st.lists(children) | st.dictionaries(st.text(), children),
            max_leaves=30,
        ).map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries(
            {
                "wire_version": st.sampled_from([1, 1, 2, "1", None]),
                "execution_id": st.one_of(st.text(max_size=300), st.integers()),
                "flow_id": st.sampled_from(["three", "nope", "../etc/passwd", "'; DROP TABLE"]),
                "input": st.one_of(st.integers(-(2**70), 2**70), st.text(), st.none()),
                "resume_event": st.one_of(st.none(), st.integers(), st.just({"event_type": 1})),
            }
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_fuzzed_bodies_are_answered_typed_and_never_500(body: bytes) -> None:
    async def run() -> None:
        runtime = loom.WorkflowRuntime(InMemoryStore())
        runtime.register(*rig_flows(Effects(), asyncio.Event()))
        app = create_worker_app(runtime, auth=NoAuth(), max_body_bytes=4096)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
            response = await c.post("/execute", content=body)
            assert response.status_code in (200, 400, 404, 413, 422), response.text
            data = response.json()
            if response.status_code != 200:
                assert data["detail"]["type"] and data["code"]
                ids = [eid async for eid in runtime.store.iterate_execution_ids()]
                assert ids == []
            else:
                assert ExecutionResult.from_dict(data).status is ExecutionStatus.COMPLETED
        await runtime.close()

    asyncio.run(run())
