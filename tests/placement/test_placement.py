from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import (
    DispatchError,
    ExecutionAlreadyExistsError,
    StaleFenceError,
    StartFencedOutError,
    StorageWriteError,
    WireFormatError,
)
from loom.model import EventType, ExecutionStatus
from loom.placement import (
    ExecutionPackage,
    ExecutionResult,
    LocalDispatcher,
    LocalWorkerRuntime,
    ResumeEvent,
    SupervisingDispatcher,
    is_superseded_refusal,
)
from loom.storage import SQLiteStore
from loom.testing import DISPATCHER_CHECKS, run_execution_dispatcher_conformance


@pytest.mark.parametrize("name", sorted(DISPATCHER_CHECKS))
@pytest.mark.parametrize("kind", ["local", "supervising"])
async def test_dispatcher_conformance(name: str, kind: str) -> None:
    def make(worker: Any) -> Any:
        local = LocalDispatcher(worker, max_attempts=2)
        return (
            local
            if kind == "local"
            else SupervisingDispatcher(LocalDispatcher(worker), max_restarts=1)
        )

    _, check = DISPATCHER_CHECKS[name]
    await check(make)


async def test_conformance_runner_reports_checks() -> None:
    passed = await run_execution_dispatcher_conformance(
        lambda w: LocalDispatcher(w, max_attempts=2), over_worker=True
    )
    assert set(passed) == set(DISPATCHER_CHECKS)


def test_package_and_result_round_trip_exactly() -> None:
    pkg = ExecutionPackage(
        execution_id="e-1",
        flow_id="f",
        workflow_id="wf",
        input={"a": [1, "ü", None]},
        resume_event=ResumeEvent("Go", {"ok": True}),
        snapshot_id="s",
        from_sequence=4,
        flow_version="2",
        metadata={"tenant": "acme"},
    )
    text = pkg.to_json()
    assert ExecutionPackage.from_json(text) == pkg
    assert ExecutionPackage.from_json(text).to_json() == text
    state = loom.ExecutionState(
        "e-1", flow_id="f", status=ExecutionStatus.SUSPENDED, last_sequence=3
    )
    result = ExecutionResult.from_state(state)
    assert ExecutionResult.from_json(result.to_json()) == result
    with pytest.raises(WireFormatError, match="wire_version 3"):
        ExecutionPackage.from_dict({**json.loads(text), "wire_version": 3})
    with pytest.raises(WireFormatError, match="not valid JSON"):
        ExecutionPackage.from_json("{nope")
    with pytest.raises(WireFormatError, match="execution_id"):
        ExecutionPackage.from_dict({"wire_version": 1, "flow_id": "f"})
    with pytest.raises(WireFormatError, match="status"):
        ExecutionResult.from_dict({**result.to_dict(), "status": "exploded"})
    with pytest.raises(AttributeError):
        pkg.execution_id = "other"  # type: ignore[misc]


def test_is_superseded_refusal_is_precise() -> None:
    eid = "mine"
    assert is_superseded_refusal(ExecutionAlreadyExistsError("x", execution_id=eid), eid)
    assert is_superseded_refusal(StaleFenceError("x", execution_id=eid), eid)
    wrapped = StorageWriteError("batch")
    wrapped.__cause__ = StaleFenceError("x", execution_id=eid)
    assert is_superseded_refusal(wrapped, eid)
    # Negatives: another execution's refusal, a fenced-out start, everything else.
    other = StorageWriteError("batch")
    other.__cause__ = StaleFenceError("x", execution_id="theirs")
    assert not is_superseded_refusal(other, eid)
    assert not is_superseded_refusal(StaleFenceError("x", execution_id="theirs"), eid)
    fenced_out = StorageWriteError("start", execution_id=eid)
    fenced_out.__cause__ = StartFencedOutError("x", execution_id=eid)
    assert not is_superseded_refusal(fenced_out, eid)
    assert not is_superseded_refusal(StorageWriteError("io", execution_id=eid), eid)
    assert not is_superseded_refusal(RuntimeError(eid), eid)

    # By name, not class: a second copy of the error classes is still recognised.
    class StaleFenceError2(Exception):
        execution_id = eid

    StaleFenceError2.__name__ = "StaleFenceError"
    assert is_superseded_refusal(StaleFenceError2(), eid)


def _two_step_flow(hang: asyncio.Event | None, ran: list[str]) -> loom.Flow[Any, str]:
    @loom.step(id="step-a")
    async def step_a() -> str:
        ran.append("a")
        return "a"

    @loom.step(id="step-b")
    async def step_b() -> str:
        ran.append("b")
        if hang is not None and ran.count("b") == 1:
            await hang.wait()  # the first instance wedges here
        return "b"

    @loom.flow(id="two-steps", version="1")
    async def two_steps(ctx: loom.WorkflowContext) -> str:
        return await ctx.run(step_a) + await ctx.run(step_b)

    return two_steps


async def test_hung_worker_is_redispatched_after_execute_timeout(tmp_path: Path) -> None:
    ran: list[str] = []
    never = asyncio.Event()
    rt = loom.WorkflowRuntime(SQLiteStore(tmp_path / "hung.db"))
    rt.register(_two_step_flow(never, ran))
    failures: list[BaseException] = []
    dispatcher = LocalDispatcher(
        LocalWorkerRuntime(rt),
        max_attempts=2,
        execute_timeout=0.3,
        on_attempt_failed=lambda pkg, n, exc: failures.append(exc),
    )
    result = await dispatcher.dispatch(ExecutionPackage(execution_id="h", flow_id="two-steps"))
    assert result.status is ExecutionStatus.COMPLETED and result.output == "ab"
    assert ran == ["a", "b", "b"]  # step A not re-run; only the hung step ran again
    assert len(failures) == 1 and isinstance(failures[0], TimeoutError)
    types = [e.type for e in await rt.store.read("h")]
    assert types.count(EventType.EXECUTION_STARTED) == 1
    assert types.count(EventType.EXECUTION_RECOVERED) == 1
    never.set()  # the wedged first attempt wakes: its late write is fenced out
    await asyncio.sleep(0)
    assert [e.type for e in await rt.store.read("h")] == types
    await rt.close()


async def test_exhausted_attempts_raise_a_dispatch_error(tmp_path: Path) -> None:
    rt = loom.WorkflowRuntime(SQLiteStore(tmp_path / "x.db"))
    dispatcher = LocalDispatcher(LocalWorkerRuntime(rt), max_attempts=2)
    with pytest.raises(DispatchError, match="all 2 attempts") as info:
        await dispatcher.dispatch(ExecutionPackage(execution_id="x", flow_id="unregistered"))
    assert isinstance(info.value.__cause__, loom.FlowNotFoundError)
    await rt.close()


async def test_mid_flight_crash_is_resumed_by_a_fresh_instance(tmp_path: Path) -> None:
    """ADR 0004 verification: instance A commits step A, hangs in step B and is abandoned; a
    fresh instance B over the same SQLite file redispatches the original package."""
    db = tmp_path / "shared.db"
    ran_a: list[str] = []
    hang = asyncio.Event()
    instance_a = loom.WorkflowRuntime(SQLiteStore(db))
    instance_a.register(_two_step_flow(hang, ran_a))
    package = ExecutionPackage(execution_id="mid", flow_id="two-steps")
    attempt = asyncio.ensure_future(
        LocalDispatcher(LocalWorkerRuntime(instance_a)).dispatch(package)
    )
    while ran_a != ["a", "b"]:  # wait until A is inside step B (event-driven poll)
        await instance_a.store.wait_for_append("mid", 0, timeout=1)
        await asyncio.sleep(0)
    attempt.cancel()  # instance A is abandoned, wedged in step B

    ran_b: list[str] = []
    instance_b = loom.WorkflowRuntime(SQLiteStore(db))
    instance_b.register(_two_step_flow(None, ran_b))
    dispatcher_b = LocalDispatcher(LocalWorkerRuntime(instance_b))
    result = await dispatcher_b.dispatch(package)
    assert result.status is ExecutionStatus.COMPLETED and result.output == "ab"
    assert ran_b == ["b"]  # only step B ran on the fresh instance
    log = await instance_b.store.read("mid")
    assert [e.type for e in log].count(EventType.EXECUTION_STARTED) == 1
    # Lost-response idempotency: the same package again re-runs nothing.
    again = await dispatcher_b.dispatch(package)
    assert again == result and ran_b == ["b"]
    assert len(await instance_b.store.read("mid")) == len(log)
    hang.set()
    await instance_a.close()
    await instance_b.close()


async def test_supervisor_circuit_opens_and_resets() -> None:
    from loom.errors import CircuitOpenError
    from loom.testing import SkippingClock

    class Broken:
        spi_version = "1.1.0"
        calls = 0

        async def dispatch(self, package: ExecutionPackage) -> ExecutionResult:
            self.calls += 1
            raise ConnectionError("down")

        async def cancel(self, execution_id: str) -> None:
            pass

        async def health(self) -> Any:
            from loom.placement import Health

            return Health(False)

    clock = SkippingClock()
    target = Broken()
    sup = SupervisingDispatcher(
        target, max_restarts=1, failure_threshold=3, reset_after=10, clock=clock
    )
    pkg = ExecutionPackage(execution_id="c", flow_id="f")
    with pytest.raises(ConnectionError):
        await sup.dispatch(pkg)  # 2 failures (1 restart)
    with pytest.raises(ConnectionError):
        await sup.dispatch(pkg)  # third failure opens the circuit
    assert sup.circuit_open and target.calls == 3
    with pytest.raises(CircuitOpenError):
        await sup.dispatch(pkg)
    assert target.calls == 3
    clock.advance(10)
    with pytest.raises(ConnectionError):
        await sup.dispatch(pkg)  # half-open: one trial goes through
    assert target.calls == 4


class RejectsWholeBatches(loom.InMemoryStore):
    """A store that, once, rejects a whole coalesced batch with ANOTHER execution's refusal
    (as the seed's stores do): for this execution that is a genuine failure."""

    armed = True

    async def append(self, envelopes: Any) -> None:
        if self.armed and envelopes[0].type is EventType.STEP_COMPLETED:
            self.armed = False
            err = StorageWriteError("coalesced batch rejected")
            err.__cause__ = StaleFenceError("stale", execution_id="someone-else")
            raise err
        await super().append(envelopes)


async def test_another_executions_refusal_in_a_batch_is_retried_end_to_end() -> None:
    ran: list[str] = []
    rt = loom.WorkflowRuntime(RejectsWholeBatches())
    rt.register(_two_step_flow(None, ran))
    dispatcher = LocalDispatcher(LocalWorkerRuntime(rt), max_attempts=2)
    result = await dispatcher.dispatch(ExecutionPackage(execution_id="b", flow_id="two-steps"))
    assert result.status is ExecutionStatus.COMPLETED
    assert dispatcher.attempts == 2
    assert ran == ["a", "a", "b"]  # the unrecorded step ran again on the retry
    await rt.close()
