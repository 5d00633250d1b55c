"""A superseded attempt is answered with the exact 409 (loom.placement.http._server,
_errors), and only a superseded refusal is mapped to it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

import loom
from loom.errors import ExecutionSupersededError, StaleFenceError, StorageWriteError
from loom.model import ExecutionStatus
from loom.placement import (
    ExecutionPackage,
    ExecutionResult,
    LocalDispatcher,
    LocalWorkerRuntime,
    WorkerLease,
    is_superseded_refusal,
)
from loom.placement.http import BearerTokenAuth, RemoteWorkerRuntime, create_worker_app
from tests.support.http_rig import BASE, SECRET, Rig, pkg

# ------------------------------------------------------------------------------ superseded


async def test_two_attempts_racing_one_execution_the_loser_gets_the_exact_409(rig: Rig) -> None:
    package = pkg("race", "slow")
    first = asyncio.ensure_future(rig.post(package.to_dict()))
    await rig.effects.reach("gated-step", 1)
    # A duplicate dispatch takes a newer fence and resumes the execution itself.
    second = asyncio.ensure_future(LocalDispatcher(rig.remote(), max_attempts=3).dispatch(package))
    await rig.effects.reach("gated-step", 2)
    # The first attempt finishes its step first: its write is refused (the second holds the
    # newer fence) while the execution still runs, so it answers the superseded 409.
    rig.gate.set()
    lost = await first
    rig.later_gate.set()
    won = await second
    assert lost.status_code == 409
    assert lost.json() == {
        "error": "execution superseded",
        "code": "superseded",
        "execution_id": "race",
    }
    assert won.status is ExecutionStatus.COMPLETED and won.output == 4
    assert len(rig.superseded) == 1 and rig.superseded[0][0] == package
    assert is_superseded_refusal(rig.superseded[0][1], "race")
    assert rig.errors == []  # a superseded refusal never reaches on_error
    assert rig.effects == {"one": 1, "gated-step": 2, "two": 1}


class ScriptedWorker(LocalWorkerRuntime):
    """A LocalWorkerRuntime whose execute raises what the test says."""

    def __init__(self, runtime: loom.WorkflowRuntime, raises: list[BaseException]) -> None:
        super().__init__(runtime)
        self.raises = raises
        self.calls = 0

    async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
        self.calls += 1
        if self.raises:
            raise self.raises.pop(0)
        return await super().execute(lease, package)


def _wrapped_stale(eid: str) -> StorageWriteError:
    err = StorageWriteError("the batch was refused")
    err.__cause__ = StaleFenceError("stale", execution_id=eid)
    return err


@pytest.mark.parametrize(
    ("raised", "status", "refusal"),
    [
        (StaleFenceError("stale", execution_id="s-1"), 409, True),
        (ExecutionSupersededError("gone", execution_id="s-1"), 409, True),
        (loom.ExecutionAlreadyExistsError("lost the race", execution_id="s-1"), 409, True),
        (_wrapped_stale("s-1"), 409, True),
        # Another execution's refusal in a coalesced batch is, for this one, a genuine failure.
        (_wrapped_stale("someone-else"), 503, False),
        (StaleFenceError("stale", execution_id="someone-else"), 503, False),
        (RuntimeError("boom"), 500, False),
        (loom.NonDeterminismError("changed", execution_id="s-1"), 500, False),
    ],
    ids=["stale", "superseded", "exists", "wrapped", "other-wrapped", "other-stale", "bug", "nd"],
)
async def test_superseded_mapping_is_exact(
    rig: Rig, raised: BaseException, status: int, refusal: bool
) -> None:
    worker = ScriptedWorker(rig.runtime, [raised])
    errors: list[Any] = []
    superseded: list[Any] = []
    app = create_worker_app(
        worker,
        auth=BearerTokenAuth(SECRET),
        on_error=lambda p, e: errors.append(e),
        on_superseded=lambda p, e: superseded.append(e),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        remote = RemoteWorkerRuntime(BASE, token=SECRET, client=c)
        raw = await c.post(
            "/execute", content=pkg("s-1").to_json(), headers={"authorization": f"Bearer {SECRET}"}
        )
        assert raw.status_code == status
        if refusal:
            assert raw.json() == {
                "error": "execution superseded",
                "code": "superseded",
                "execution_id": "s-1",
            }
            assert superseded == [raised] and errors == []
        else:
            assert raw.json()["code"] != "superseded"
            assert errors == [raised] and superseded == []
            assert "boom" not in raw.text  # an unexpected error's message stays on the worker
        # Through a dispatcher: a refusal is rethrown at once, anything else retried.
        worker.raises = [raised]
        dispatcher = LocalDispatcher(remote, max_attempts=2)
        if refusal:
            with pytest.raises(ExecutionSupersededError) as info:
                await dispatcher.dispatch(pkg("s-1"))
            assert is_superseded_refusal(info.value, "s-1")
            assert dispatcher.attempts == 1
        else:
            result = await dispatcher.dispatch(pkg("s-1"))
            assert result.status is ExecutionStatus.COMPLETED
            assert dispatcher.attempts == 2
