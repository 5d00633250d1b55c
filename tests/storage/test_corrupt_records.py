"""Corrupt or hostile stored records are refused with typed errors (#11.10, #11.11)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import CorruptEventError, PayloadError
from loom.runtime._driver import SUSPEND_SNAPSHOT_MIN_EVENTS
from loom.storage import InMemoryStore, Snapshot, SQLiteStore, Store


@loom.step(id="double")
async def double(x: int) -> int:
    return 2 * x


@loom.flow(id="gated", version="1")
async def gated(ctx: loom.WorkflowContext, x: int) -> int:
    y = await ctx.run(double, x)
    await ctx.suspend("Go")
    return await ctx.run(double, y)


async def _two(path: Path) -> None:
    rt = loom.WorkflowRuntime(SQLiteStore(path))
    rt.register(gated)
    for eid in ("a-healthy", "b-victim", "c-healthy"):
        await (await rt.start(gated, 1, execution_id=eid)).wait_for_suspend()
    await rt.close()


@pytest.mark.parametrize(
    "corruption",
    [
        # One payload byte with its high bit flipped: no longer UTF-8 (as a bit flip on disk).
        "CAST(substr(CAST(payload AS BLOB), 1, 3) || X'E9' || "
        "substr(CAST(payload AS BLOB), 5) AS TEXT)",
        "CAST(payload AS BLOB)",  # a BLOB where text belongs
    ],
    ids=["invalid-utf8", "blob"],
)
async def test_a_corrupt_sqlite_record_is_a_typed_error_for_its_execution_only(
    tmp_path: Path, corruption: str
) -> None:
    path = tmp_path / "corrupt.db"
    await _two(path)
    with sqlite3.connect(path) as conn:
        changed = conn.execute(
            f"UPDATE loom_events SET payload = {corruption} "
            "WHERE execution_id = 'b-victim' AND sequence = 1"
        ).rowcount
        assert changed == 1
        # Without the suspension's snapshot, every load folds the corrupt record.
        conn.execute("DELETE FROM loom_snapshots WHERE execution_id = 'b-victim'")
    rt = loom.WorkflowRuntime(SQLiteStore(path))
    rt.register(gated)
    calls: dict[str, Any] = {
        "read": lambda: rt.store.read("b-victim"),
        "load_state": lambda: rt.load_state("b-victim"),
        "recover": lambda: rt.recover("b-victim"),
        "resume": lambda: rt.resume("b-victim", "Go"),
        "cancel": lambda: rt.cancel("b-victim"),
    }
    for name, call in calls.items():
        with pytest.raises(CorruptEventError) as info:
            await call()
        assert info.value.execution_id == "b-victim", name
        assert info.value.details.get("sequence") == 1, name
    # The listing (the store's index: no log folded) goes on past the corrupt execution.
    listed = sorted([s.execution_id async for s in rt.executions()])
    assert listed == ["a-healthy", "b-victim", "c-healthy"]
    # Others are unaffected.
    assert (await (await rt.resume("a-healthy", "Go")).settled(10)).output == 4
    await rt.close()


@loom.flow(id="plain", version="1")
async def plain(ctx: loom.WorkflowContext, x: int) -> int:
    return await ctx.run(double, await ctx.run(double, x))


def _hostile(state: dict[str, Any]) -> dict[str, tuple[dict[str, Any], int]]:
    seq = state["last_sequence"]
    big = 2**63
    return {
        "ops-as-list": ({**state, "ops": [1, 2]}, seq),
        "id-not-a-string": ({**state, "execution_id": 7}, seq),
        "huge-sequence": ({**state, "last_sequence": big}, big),
        "sequence-mismatch": ({**state, "last_sequence": seq - 1}, seq),
        "beyond-the-log": ({**state, "last_sequence": seq + 1}, seq + 1),
        "not-a-state": ({"x": [state]}, seq),
        "forged-other-execution": (
            {**state, "execution_id": "bystander", "output": "forged"},
            seq,
        ),
        "status-unknown": ({**state, "status": "exploded"}, seq),
        "op-kind-not-a-string": (
            {**state, "ops": {"0": {"kind": [], "name": "x", "status": "completed"}}},
            seq,
        ),
        "sequence-as-string": ({**state, "last_sequence": str(seq)}, seq),
    }


CASES = list(_hostile({"last_sequence": 0}))


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
@pytest.mark.parametrize("case", CASES)
async def test_a_hostile_snapshot_is_ignored_and_the_log_folded(
    tmp_path: Path, backend: str, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    store: Store = InMemoryStore() if backend == "memory" else SQLiteStore(tmp_path / "s.db")
    rt = loom.WorkflowRuntime(store)
    rt.register(plain)
    await (await rt.start(plain, 1, execution_id="victim")).settled(10)
    assert await store.load_snapshot("victim") is None  # only the hostile one below
    truth = await rt.load_state("victim")
    assert truth is not None and truth.output == 4
    hostile, sequence = _hostile(truth.to_dict())[case]
    # Through the public API, so its checksum is valid: only its content is wrong.
    if sequence > 2**63 - 1:
        # No store can key it: refused before the write (it used to stop SQLite's writer).
        with pytest.raises(PayloadError):
            await store.save_snapshot(Snapshot("victim", sequence, hostile))
        assert await rt.load_state("victim") == truth
        await rt.close()
        return
    await store.save_snapshot(Snapshot("victim", sequence, hostile))
    with caplog.at_level(logging.WARNING, logger="loom.runtime"):
        loaded = await rt.load_state("victim")
    assert loaded == truth
    assert any("snapshot" in r.getMessage() for r in caplog.records)
    await rt.close()


class _SetClock:
    def __init__(self, now: float) -> None:
        self.t = now

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)


@loom.flow(id="napper", version="1")
async def napper(ctx: loom.WorkflowContext, when: float) -> str:
    await ctx.sleep_until(when)
    return "woke"


@loom.flow(id="long-napper", version="1")
async def long_napper(ctx: loom.WorkflowContext, when: float) -> str:
    # Enough steps that the suspension writes a snapshot (a shorter log is folded on wake).
    for i in range(SUSPEND_SNAPSHOT_MIN_EVENTS + 8):
        await ctx.run(double, i)
    await ctx.sleep_until(when)
    return "woke"


SLEEPERS = ["a-healthy", "b-victim", "c-healthy"]


async def _three_sleepers(path: Path, clock: _SetClock, flow: loom.Flow[float, str]) -> None:
    """SLEEPERS, each asleep in ``flow`` until 1005.0 (a timer of one batch), and stopped."""
    rt = loom.WorkflowRuntime(SQLiteStore(path), clock=clock, timers=False)
    rt.register(flow)
    for eid in SLEEPERS:
        await (await rt.start(flow, 1005.0, execution_id=eid)).settled(10)
    await rt.close()


@pytest.mark.parametrize(
    "corruption",
    [
        "UPDATE loom_snapshots SET checksum = 'forged' WHERE execution_id = 'b-victim'",
        # The suspension's own event, which only the batch read reads (a lone load starts
        # after the snapshot): one payload byte no longer UTF-8.
        "UPDATE loom_events SET payload = CAST(substr(CAST(payload AS BLOB), 1, 3) || X'E9' "
        "|| substr(CAST(payload AS BLOB), 5) AS TEXT) "
        "WHERE execution_id = 'b-victim' AND sequence = "
        "(SELECT max(sequence) FROM loom_events WHERE execution_id = 'b-victim')",
    ],
    ids=["snapshot-checksum", "event-utf8"],
)
async def test_a_corrupt_record_in_a_timer_batch_costs_the_batch_read_only(
    tmp_path: Path, corruption: str
) -> None:
    # The service reads a claimed batch's states in one query; a record that fails there
    # fails that read, and every wake of the batch reads its own state as before: the
    # victim's snapshot is ignored (the log folded), and the others never notice.
    path = tmp_path / "timers.db"
    clock = _SetClock(1000.0)
    await _three_sleepers(path, clock, long_napper)
    with sqlite3.connect(path) as conn:
        assert conn.execute(corruption).rowcount == 1
    store = SQLiteStore(path)
    assert await store.load_snapshot("a-healthy") is not None  # what the batch read reads
    with pytest.raises(CorruptEventError):
        await store.load_many(SLEEPERS)
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False)
    rt.register(long_napper)
    assert rt.timers is not None
    clock.t = 1005.0
    assert await rt.timers.run_due() == 3
    assert sorted(t.execution_id for t in rt.timers.fired) == SLEEPERS
    for eid in SLEEPERS:
        assert (await rt.wait(eid, timeout=10)).output == "woke", eid
    await rt.close()


async def test_a_corrupt_event_of_an_unsnapshotted_sleeper_fails_its_own_wake_only(
    tmp_path: Path,
) -> None:
    # A short sleeper has no snapshot: its wake folds the whole log, so a corrupt event in it
    # fails that wake with a typed error, its timer is kept (retried, never dropped), and the
    # rest of the batch fires.
    path = tmp_path / "timers.db"
    clock = _SetClock(1000.0)
    await _three_sleepers(path, clock, napper)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM loom_snapshots").fetchone() == (0,)
        changed = conn.execute(
            "UPDATE loom_events SET payload = CAST(substr(CAST(payload AS BLOB), 1, 3) || "
            "X'E9' || substr(CAST(payload AS BLOB), 5) AS TEXT) "
            "WHERE execution_id = 'b-victim' AND sequence = 2"
        ).rowcount
        assert changed == 1
    store = SQLiteStore(path)
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False, lease_ttl=5.0)
    rt.register(napper)
    assert rt.timers is not None
    clock.t = 1005.0
    with pytest.raises(CorruptEventError, match="b-victim"):
        await rt.load_state("b-victim")
    await rt.timers.run_due()
    assert sorted(t.execution_id for t in rt.timers.fired) == ["a-healthy", "c-healthy"]
    for eid in ("a-healthy", "c-healthy"):
        assert (await rt.wait(eid, timeout=10)).output == "woke", eid
    # The victim's timer is still stored and claimable again once its claim lapses.
    assert await store.next_timer_due() is not None
    clock.t = 1005.0 + 3600
    await rt.timers.run_due()
    assert [t.execution_id for t in rt.timers.fired] == ["a-healthy", "c-healthy"]
    assert await store.next_timer_due() is not None
    await rt.close()
