from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import (
    CorruptEventError,
    ExecutionAlreadyExistsError,
    ExecutionFailedError,
    ExecutionNotFoundError,
    FlowNotFoundError,
    InvalidInputError,
    NonDeterminismError,
    NotWaitingError,
    ResumeValidationError,
    StepFailedError,
)
from loom.model import EventType, ExecutionStatus
from loom.storage import InMemoryStore, SQLiteStore
from loom.testing import SkippingClock
from tests.conftest import DURABLE, Backend
from tests.support.flows import MigrationInput, migration_guard

INPUT = MigrationInput(table="orders", ddl="ALTER TABLE orders ADD COLUMN note text")
APPROVE = {"approved": True, "approved_by": "dba"}


@pytest.fixture
async def runtime(backend: Backend) -> Any:
    rt = loom.WorkflowRuntime(backend.store(), clock=SkippingClock())
    rt.register(migration_guard)
    yield rt
    await rt.close()


async def _log(rt: loom.WorkflowRuntime, eid: str) -> list[tuple[int, str, str, str]]:
    return [
        (e.sequence, e.type.value, e.payload_json, e.checksum()) for e in await rt.store.read(eid)
    ]


async def test_gate_round_trip(runtime: loom.WorkflowRuntime) -> None:
    handle = await runtime.start("migration-guard", INPUT, execution_id="mig-42")
    state = await handle.wait_for_suspend()
    assert state.status is ExecutionStatus.SUSPENDED
    assert state.waiting is not None and state.waiting.event_type == "ApprovalGranted"
    assert state.waiting.correlation_key == "orders"
    assert state.ui == {"phase": "awaiting-approval"}
    done = await runtime.resume("mig-42", "ApprovalGranted", APPROVE)
    result = await done.result()
    assert result == {
        "status": "applied: ALTER TABLE orders ADD COLUMN note text",
        "risk": "high",
        "approved_by": "dba",
    }
    types = [e.type for e in await runtime.store.read("mig-42")]
    assert types.count(EventType.EXECUTION_STARTED) == 1
    assert types[-1] is EventType.EXECUTION_COMPLETED
    final = await runtime.load_state("mig-42")
    assert final is not None and final.ui["phase"] == "done" and final.completed_steps == 3


async def test_invalid_resume_payload_leaves_log_unchanged(runtime: loom.WorkflowRuntime) -> None:
    handle = await runtime.start(migration_guard, INPUT, execution_id="mig-bad")
    await handle.wait_for_suspend()
    before = await _log(runtime, "mig-bad")
    with pytest.raises(ResumeValidationError) as info:
        await runtime.resume("mig-bad", "ApprovalGranted", {"approved": "perhaps"})
    err = info.value
    assert err.execution_id == "mig-bad"
    assert "ApprovalGranted" in str(err) and "approved_by" in str(err) and "approved" in str(err)
    assert await _log(runtime, "mig-bad") == before
    # The gate still takes a valid decision afterwards.
    await (await runtime.resume("mig-bad", "ApprovalGranted", APPROVE)).result()


async def test_clear_errors_for_bad_requests(runtime: loom.WorkflowRuntime) -> None:
    with pytest.raises(FlowNotFoundError, match="no flow 'nope'"):
        await runtime.start("nope", {})
    with pytest.raises(ExecutionNotFoundError) as nf:
        await runtime.resume("ghost", "ApprovalGranted", APPROVE)
    assert nf.value.execution_id == "ghost"
    with pytest.raises(InvalidInputError):
        await runtime.start(migration_guard, {"table": 3}, execution_id="bad-input")
    assert await runtime.load_state("bad-input") is None
    handle = await runtime.start(migration_guard, INPUT, execution_id="e1")
    await handle.wait_for_suspend()
    with pytest.raises(NotWaitingError, match="waiting for 'ApprovalGranted', not 'Other'"):
        await runtime.resume("e1", "Other", {})
    with pytest.raises(ExecutionAlreadyExistsError):
        await runtime.start(migration_guard, INPUT, execution_id="e1")
    await (await runtime.resume("e1", "ApprovalGranted", APPROVE)).result()
    with pytest.raises(NotWaitingError, match="completed"):
        await runtime.resume("e1", "ApprovalGranted", APPROVE)


async def test_a_gate_decides_once(runtime: loom.WorkflowRuntime) -> None:
    handle = await runtime.start(migration_guard, INPUT, execution_id="twice")
    await handle.wait_for_suspend()
    results = await asyncio.gather(
        runtime.resume("twice", "ApprovalGranted", APPROVE),
        runtime.resume("twice", "ApprovalGranted", {"approved": False, "approved_by": "x"}),
        return_exceptions=True,
    )
    winners = [r for r in results if isinstance(r, loom.ExecutionHandle)]
    losers = [r for r in results if isinstance(r, NotWaitingError)]
    assert len(winners) == 1 and len(losers) == 1, results
    await winners[0].result()
    resumed = [
        e for e in await runtime.store.read("twice") if e.type is EventType.EXECUTION_RESUMED
    ]
    assert len(resumed) == 1


@pytest.mark.parametrize("backend", DURABLE, indirect=True)
async def test_non_determinism_names_position_and_steps(backend: Backend) -> None:
    store = backend.store()

    @loom.step(id="a")
    async def a() -> str:
        return "a"

    @loom.step(id="b")
    async def b() -> str:
        return "b"

    @loom.flow(id="reordered", version="1")
    async def v1(ctx: loom.WorkflowContext) -> None:
        await ctx.run(a)
        await ctx.run(b)
        await ctx.suspend("Go")

    rt = loom.WorkflowRuntime(store)
    rt.register(v1)
    await (await rt.start(v1, execution_id="nd")).wait_for_suspend()
    await rt.close()

    @loom.flow(id="reordered", version="1")
    async def v1_changed(ctx: loom.WorkflowContext) -> None:
        await ctx.run(b)
        await ctx.run(a)
        await ctx.suspend("Go")

    rt2 = loom.WorkflowRuntime(backend.store())
    rt2.register(v1_changed)
    before = await _log(rt2, "nd")
    handle = await rt2.resume("nd", "Go", {})
    with pytest.raises(NonDeterminismError) as info:
        await handle.result()
    err = info.value
    assert err.details["position"] == 0
    assert err.details["recorded"] == "step:a" and err.details["requested"] == "step:b"
    assert "position 0" in str(err)
    # Nothing but the decision was recorded: the execution is not failed, it awaits a fix.
    after = await _log(rt2, "nd")
    assert after[: len(before)] == before and len(after) == len(before) + 1
    state = await rt2.load_state("nd")
    assert state is not None and state.status is ExecutionStatus.RUNNING
    await rt2.close()


async def test_decide_is_recorded_once_and_replayed(backend: Backend) -> None:
    calls: list[int] = []
    rt = loom.WorkflowRuntime(backend.store())

    @loom.flow(id="decider")
    async def decider(ctx: loom.WorkflowContext) -> int:
        value: int = await ctx.decide("pick", lambda: calls.append(1) or len(calls) * 7)
        await ctx.suspend("Go")
        return value

    rt.register(decider)
    await (await rt.start(decider, execution_id="d")).wait_for_suspend()
    assert await (await rt.resume("d", "Go", None)).result() == 7
    assert calls == [1]
    await rt.close()


async def test_retry_policy_records_every_attempt(backend: Backend) -> None:
    clock = SkippingClock()
    rt = loom.WorkflowRuntime(backend.store(), clock=clock)
    attempts: list[int] = []

    @loom.step(id="flaky", retry=loom.RetryPolicy(max_attempts=3, initial_backoff=2.0))
    async def flaky() -> str:
        info = loom.current_step()
        assert info is not None
        attempts.append(info.attempt)
        if info.attempt < 3:
            raise RuntimeError(f"boom {info.attempt}")
        return "ok"

    @loom.step(id="hopeless", retry=loom.RetryPolicy(max_attempts=2, initial_backoff=1.0))
    async def hopeless() -> str:
        raise ValueError("never")

    @loom.flow(id="retrying")
    async def retrying(ctx: loom.WorkflowContext) -> str:
        first = await ctx.run(flaky)
        try:
            await ctx.run(hopeless)
        except StepFailedError as exc:
            return f"{first}, then {exc.details['attempts']} failed attempts"
        return "unreachable"

    rt.register(retrying)
    out = await (await rt.start(retrying, execution_id="r")).result()
    assert out == "ok, then 2 failed attempts"
    assert attempts == [1, 2, 3]
    assert clock.slept == [2.0, 4.0, 1.0]
    events = await rt.store.read("r")
    failed = [
        (e.payload["step_id"], e.payload["attempt"], e.payload["final"])
        for e in events
        if e.type is EventType.STEP_FAILED
    ]
    assert failed == [
        ("flaky", 1, False),
        ("flaky", 2, False),
        ("hopeless", 1, False),
        ("hopeless", 2, True),
    ]
    await rt.close()


async def test_uncaught_step_failure_fails_the_execution(backend: Backend) -> None:
    rt = loom.WorkflowRuntime(backend.store())

    @loom.step(id="explode")
    def explode() -> None:
        raise KeyError("missing")

    @loom.flow(id="failing")
    async def failing(ctx: loom.WorkflowContext) -> None:
        await ctx.run(explode)

    rt.register(failing)
    handle = await rt.start(failing, execution_id="f")
    with pytest.raises(ExecutionFailedError, match="explode"):
        await handle.result()
    state = await rt.load_state("f")
    assert state is not None and state.status is ExecutionStatus.FAILED
    assert state.error is not None and state.error["type"] == "StepFailedError"
    await rt.close()


async def test_unstorable_step_output_is_a_step_failure(backend: Backend) -> None:
    rt = loom.WorkflowRuntime(backend.store())

    @loom.step(id="nan")
    async def nan() -> float:
        return float("nan")

    @loom.flow(id="nanflow")
    async def nanflow(ctx: loom.WorkflowContext) -> None:
        await ctx.run(nan)

    rt.register(nanflow)
    with pytest.raises(ExecutionFailedError, match="not storable as JSON"):
        await (await rt.start(nanflow, execution_id="n")).result()
    await rt.close()


class CountingStore(SQLiteStore):
    envelopes_read = 0

    async def read(self, execution_id: str, *, from_sequence: int = 0) -> list[loom.Envelope]:
        got = await super().read(execution_id, from_sequence=from_sequence)
        self.envelopes_read += len(got)
        return got


async def test_load_state_reads_snapshot_plus_tail(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "big.db")
    rt = loom.WorkflowRuntime(store, snapshot_every=500)

    @loom.step(id="tiny")
    async def tiny(i: int) -> int:
        return i

    @loom.flow(id="long")
    async def long(ctx: loom.WorkflowContext) -> int:
        for i in range(9_998):
            await ctx.run(tiny, i)
        return 1  # 1 start + 9,998 steps + 1 completion = 10,000 events

    rt.register(long)
    await (await rt.start(long, execution_id="big")).result()
    assert await store.last_sequence("big") == 9_999  # 10,000 events
    store.envelopes_read = 0
    state = await rt.load_state("big")
    assert state is not None and state.status is ExecutionStatus.COMPLETED
    assert state.completed_steps == 9_998
    snap = await store.load_snapshot("big")
    assert snap is not None and snap.sequence >= 9_500
    # Only the tail after the snapshot is read, not the 10,000-event history.
    assert store.envelopes_read == 9_999 - snap.sequence < 500, store.envelopes_read
    # The same state folded from the whole log, for comparison.
    full = loom.replay(await store.read("big"))
    assert full.to_dict() == state.to_dict()
    await rt.close()


@pytest.mark.parametrize("backend", DURABLE, indirect=True)
async def test_pinned_to_the_version_it_started_with(backend: Backend) -> None:
    ran: list[str] = []

    def make(version: str) -> loom.Flow[Any, str]:
        @loom.flow(id="pinned", version=version)
        async def pinned(ctx: loom.WorkflowContext) -> str:
            await ctx.suspend("Go")
            ran.append(version)
            return version

        return pinned

    rt = loom.WorkflowRuntime(backend.store())
    rt.register(make("1"))
    await (await rt.start("pinned", execution_id="p")).wait_for_suspend()
    await rt.close()

    rt2 = loom.WorkflowRuntime(backend.store())
    rt2.register(make("2"))
    with pytest.raises(FlowNotFoundError, match="version '1' is not registered"):
        await rt2.resume("p", "Go", {})
    rt2.register(make("1"))
    assert await (await rt2.resume("p", "Go", {})).result() == "1"
    assert ran == ["1"]
    await rt2.close()


async def test_cancel_a_suspended_execution(runtime: loom.WorkflowRuntime) -> None:
    await (await runtime.start(migration_guard, INPUT, execution_id="c")).wait_for_suspend()
    state = await runtime.cancel("c", reason="not today")
    assert state.status is ExecutionStatus.CANCELLED and state.cancel_reason == "not today"
    with pytest.raises(NotWaitingError, match="cancelled"):
        await runtime.resume("c", "ApprovalGranted", APPROVE)
    with pytest.raises(loom.ExecutionCancelledError):
        await runtime.handle("c").result()


async def test_corrupt_record_is_refused_for_its_execution_only(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    rt = loom.WorkflowRuntime(SQLiteStore(path))
    rt.register(migration_guard)
    for eid in ("victim", "bystander"):
        await (await rt.start(migration_guard, INPUT, execution_id=eid)).wait_for_suspend()
    await rt.close()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE loom_events SET payload = replace(payload, 'orders', 'ORDERS') "
            "WHERE execution_id = 'victim' AND sequence = 0"
        )
        conn.execute(
            "UPDATE loom_snapshots SET state = replace(state, 'orders', 'ORDERS') "
            "WHERE execution_id = 'victim'"
        )
    rt2 = loom.WorkflowRuntime(SQLiteStore(path))
    rt2.register(migration_guard)
    with pytest.raises(CorruptEventError) as info:
        await rt2.store.read("victim")
    assert info.value.execution_id == "victim" and info.value.details["sequence"] == 0
    with pytest.raises(CorruptEventError) as info:
        await rt2.load_state("victim")
    assert info.value.execution_id == "victim"
    with pytest.raises(CorruptEventError):
        await rt2.resume("victim", "ApprovalGranted", APPROVE)
    await (await rt2.resume("bystander", "ApprovalGranted", APPROVE)).result()
    await rt2.close()


async def test_concurrent_steps_in_one_flow(backend: Backend) -> None:
    rt = loom.WorkflowRuntime(backend.store())

    @loom.step(id="square")
    async def square(x: int) -> int:
        await asyncio.sleep(0)
        return x * x

    @loom.flow(id="fan")
    async def fan(ctx: loom.WorkflowContext) -> list[int]:
        return list(await asyncio.gather(*(ctx.run(square, i) for i in range(10))))

    rt.register(fan)
    assert await (await rt.start(fan, execution_id="fan")).result() == [i * i for i in range(10)]
    state = await rt.load_state("fan")
    assert state is not None and sorted(state.ops) == list(range(10))
    await rt.close()


async def test_sync_handler_runs_off_the_event_loop() -> None:
    import threading

    loop_thread = threading.get_ident()
    seen: list[int] = []

    @loom.handler
    def blocking() -> str:
        seen.append(threading.get_ident())
        return "done"

    @loom.flow(id="synced")
    async def synced(ctx: loom.WorkflowContext) -> str:
        return await ctx.run(blocking)

    rt = loom.WorkflowRuntime(InMemoryStore())
    rt.register(synced)
    assert await (await rt.start(synced)).result() == "done"
    assert seen and seen[0] != loop_thread
    await rt.close()
