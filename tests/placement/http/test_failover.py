"""FailoverWorkerRuntime (loom.placement.http._failover): retries go to another worker."""

from __future__ import annotations

import asyncio

import pytest

import loom
from loom.errors import ExecutionSupersededError
from loom.model import ExecutionStatus
from loom.placement import ExecutionPackage, ExecutionResult, Health, LocalDispatcher, WorkerLease
from loom.placement.http import FailoverWorkerRuntime, RemoteWorkerError
from tests.support.http_rig import pkg

# ------------------------------------------------------------------------------ failover


class FakeWorker:
    def __init__(self, name: str, script: list[BaseException | None]) -> None:
        self.name = name
        self.script = script
        self.executed: list[str] = []

    async def allocate(self, package: ExecutionPackage) -> WorkerLease:
        return WorkerLease(f"{self.name}-lease", package.execution_id, 0, self.name)

    async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
        self.executed.append(package.execution_id)
        step = self.script.pop(0) if self.script else None
        if step is not None:
            raise step
        state = loom.ExecutionState(package.execution_id, status=ExecutionStatus.COMPLETED)
        return ExecutionResult.from_state(state)

    async def release(self, lease: WorkerLease) -> None:
        pass

    async def health(self) -> Health:
        return Health(True, 0, {"name": self.name})


async def test_failover_sends_the_retry_to_another_worker() -> None:
    dead = FakeWorker("a", [RemoteWorkerError("reset", unreachable=True)])
    alive = FakeWorker("b", [])
    failover = FailoverWorkerRuntime([dead, alive])
    result = await LocalDispatcher(failover, max_attempts=2).dispatch(pkg("f-1"))
    assert result.status is ExecutionStatus.COMPLETED
    assert dead.executed == ["f-1"] and alive.executed == ["f-1"]
    # The unreachable worker cools down: new executions go to the live one meanwhile.
    for i in range(3):
        await LocalDispatcher(failover).dispatch(pkg(f"n-{i}"))
    assert dead.executed == ["f-1"] and len(alive.executed) == 4
    assert (await failover.health()).healthy


async def test_failover_round_robins_and_passes_refusals_through() -> None:
    a, b = FakeWorker("a", []), FakeWorker("b", [])
    failover = FailoverWorkerRuntime([a, b])
    for i in range(4):
        await LocalDispatcher(failover).dispatch(pkg(f"r-{i}"))
    assert a.executed == ["r-0", "r-2"] and b.executed == ["r-1", "r-3"]
    refused = FakeWorker("c", [ExecutionSupersededError("gone", execution_id="x-1")])
    failover = FailoverWorkerRuntime([refused, FakeWorker("d", [])])
    dispatcher = LocalDispatcher(failover, max_attempts=3)
    with pytest.raises(ExecutionSupersededError):
        await dispatcher.dispatch(pkg("x-1"))
    assert dispatcher.attempts == 1


async def test_failover_counts_a_timed_out_attempt_against_the_worker() -> None:
    class Wedged(FakeWorker):
        async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
            self.executed.append(package.execution_id)
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    wedged, alive = Wedged("a", []), FakeWorker("b", [])
    dispatcher = LocalDispatcher(
        FailoverWorkerRuntime([wedged, alive]), max_attempts=2, execute_timeout=0.05
    )
    result = await dispatcher.dispatch(pkg("w-1"))
    assert result.status is ExecutionStatus.COMPLETED
    assert wedged.executed == ["w-1"] and alive.executed == ["w-1"]
