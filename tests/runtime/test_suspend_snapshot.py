"""A suspension snapshots only a log that grew enough since the last snapshot.

Most suspended executions are short (a start, a timer, the suspension): a wake folds those few
events for less than a snapshot costs to write, read back, decode and validate."""

from __future__ import annotations

from pathlib import Path

import loom
from loom.runtime._driver import SUSPEND_SNAPSHOT_MIN_EVENTS
from loom.storage.sqlite import SQLiteStore
from tests.support.poll import until


@loom.step(id="inc")
async def inc(i: int) -> int:
    return i + 1


@loom.flow(id="steps-then-gate")
async def steps_then_gate(ctx: loom.WorkflowContext, steps: int) -> int:
    total = 0
    for i in range(steps):
        total += await ctx.run(inc, i)
    decision = await ctx.suspend("Go")
    return total + int(decision["n"])


async def _suspend(tmp_path: Path, steps: int) -> tuple[SQLiteStore, loom.WorkflowRuntime, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = SQLiteStore(tmp_path / "loom.db")
    rt = loom.WorkflowRuntime(store, snapshot_every=10_000)
    rt.register(steps_then_gate)
    eid = f"gate-after-{steps}"
    await rt.start(steps_then_gate, steps, execution_id=eid)

    async def suspended() -> bool:
        state = await rt.load_state(eid)
        return state is not None and state.status is loom.ExecutionStatus.SUSPENDED

    await until(suspended, f"{eid} to suspend at its gate")
    return store, rt, eid


async def test_a_short_suspension_writes_no_snapshot_and_resumes_from_its_events(
    tmp_path: Path,
) -> None:
    store, rt, eid = await _suspend(tmp_path, 2)
    handle = await rt.resume(eid, "Go", {"n": 10})
    assert await handle.result(timeout=10) == 1 + 2 + 10
    # Checked once the result is in hand: the suspension's snapshot, had it been written, was
    # written before the resume could take the execution over.
    assert await store.load_snapshot(eid) is None
    await rt.close()
    await store.close()


async def test_a_long_suspension_is_snapshotted(tmp_path: Path) -> None:
    store, rt, eid = await _suspend(tmp_path, SUSPEND_SNAPSHOT_MIN_EVENTS)
    snap = await until(lambda: store.load_snapshot(eid), f"{eid}'s suspension snapshot")
    assert snap.sequence == await store.last_sequence(eid)
    handle = await rt.resume(eid, "Go", {"n": 1})
    assert await handle.result(timeout=10) == sum(range(1, SUSPEND_SNAPSHOT_MIN_EVENTS + 1)) + 1
    await rt.close()
    await store.close()


async def test_the_threshold_is_exactly_the_events_since_the_last_snapshot(tmp_path: Path) -> None:
    # A new execution's log before its gate: the start, `steps` step records, the suspension.
    at = SUSPEND_SNAPSHOT_MIN_EVENTS - 2  # the smallest such log of MIN events
    store, rt, eid = await _suspend(tmp_path / "at", at)
    assert await store.last_sequence(eid) + 1 == SUSPEND_SNAPSHOT_MIN_EVENTS
    await until(lambda: store.load_snapshot(eid), f"{eid}'s suspension snapshot")
    await rt.close()
    await store.close()
    store, rt, eid = await _suspend(tmp_path / "below", at - 1)
    handle = await rt.resume(eid, "Go", {"n": 0})
    await handle.result(timeout=10)
    assert await store.load_snapshot(eid) is None  # one event short
    await rt.close()
    await store.close()
