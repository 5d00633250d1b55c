"""SQLite specifics: group commit, leader cancellation, disk full, a failed COMMIT."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from loom.errors import StorageWriteError
from loom.model import Envelope, EventType
from loom.storage import SQLiteStore
from tests.support.old_schema import sqlite_events_before_rung_10


def env(eid: str, seq: int, fence: int, size: int = 10) -> Envelope:
    t = EventType.EXECUTION_STARTED if seq == 0 else EventType.STEP_COMPLETED
    return Envelope.create(
        eid,
        seq,
        t,
        {"position": seq, "step_id": "s", "flow_id": "f", "blob": "x" * size},
        fence=fence,
        recorded_at=1.0,
    )


class CountingConn:
    """Counts COMMITs on the writer connection."""

    def __init__(self, inner: sqlite3.Connection, counter: list[int]) -> None:
        self.inner = inner
        self.counter = counter

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            self.counter.append(1)
        return self.inner.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_concurrent_appends_share_commits(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "gc.db")
    fences = await asyncio.gather(*(store.acquire_fence(f"g{i}") for i in range(64)))
    commits: list[int] = []
    real = store._writer_conn()
    store._writer_conn = lambda: CountingConn(real, commits)  # type: ignore[assignment,return-value]
    await asyncio.gather(*(store.append([env(f"g{i}", 0, f)]) for i, f in enumerate(fences)))
    assert len(commits) < 8, f"{len(commits)} commits for 64 concurrent appends"
    for i in range(64):
        assert await store.last_sequence(f"g{i}") == 0
    await store.close()


async def test_without_group_commit_each_append_commits_alone(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "nogc.db", group_commit=False)
    fences = await asyncio.gather(*(store.acquire_fence(f"g{i}") for i in range(16)))
    commits: list[int] = []
    real = store._writer_conn()
    store._writer_conn = lambda: CountingConn(real, commits)  # type: ignore[assignment,return-value]
    await asyncio.gather(*(store.append([env(f"g{i}", 0, f)]) for i, f in enumerate(fences)))
    assert len(commits) == 16
    await store.close()


async def test_a_cancelled_leader_does_not_fail_the_writes_queued_behind_it(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "lead.db")
    fa, fb = await store.acquire_fence("a"), await store.acquire_fence("b")
    leader = asyncio.ensure_future(store.append([env("a", 0, fa)]))
    follower = asyncio.ensure_future(store.append([env("b", 0, fb)]))
    await asyncio.sleep(0)  # both queued; the leader is yielding before its commit
    leader.cancel()
    await follower  # committed by the cancelled leader before it honoured the cancel
    assert await store.last_sequence("b") == 0
    with pytest.raises(asyncio.CancelledError):
        await leader
    await store.close()


async def test_disk_full_fails_the_batch_and_keeps_the_log_intact(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "full.db")
    fence = await store.acquire_fence("full")
    await store.append([env("full", 0, fence)])
    conn = store._writer_conn()
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + 2}")
    with pytest.raises(StorageWriteError) as info:
        await store.append([env("full", 1, fence, size=200_000)])
    assert "full" in str(info.value.__cause__)
    assert await store.last_sequence("full") == 0
    conn.execute("PRAGMA max_page_count = 1073741823")
    await store.append([env("full", 1, fence)])  # space freed: writes go on
    assert await store.last_sequence("full") == 1
    await store.close()


async def test_a_failed_commit_stops_the_writer(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "commit.db")
    fence = await store.acquire_fence("c")
    real = store._writer_conn()

    class FailingCommit(CountingConn):
        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("disk I/O error")
            return self.inner.execute(sql, *args)

    store._writer_conn = lambda: FailingCommit(real, [])  # type: ignore[assignment,return-value]
    results = await asyncio.gather(
        store.append([env("c", 0, fence)]),
        store.acquire_fence("other"),
        return_exceptions=True,
    )
    assert all(isinstance(r, StorageWriteError) for r in results), results
    assert results[0] is results[1]  # one error for the whole batch
    with pytest.raises(StorageWriteError, match="stopped after a failed commit"):
        await store.append([env("c", 0, fence)])
    await store.close()
    reopened = SQLiteStore(tmp_path / "commit.db")
    assert await reopened.last_sequence("c") == -1  # nothing half-written
    await reopened.close()


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    from loom.errors import SchemaVersionError

    path = tmp_path / "future.db"
    (await _close(SQLiteStore(path)))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE loom_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(SchemaVersionError, match="schema version 99"):
        SQLiteStore(path)


async def _close(store: SQLiteStore) -> None:
    await store.close()


async def test_a_write_waiting_for_another_process_lock_does_not_block_the_loop(
    tmp_path: Path,
) -> None:
    """BEGIN IMMEDIATE waits up to busy_timeout for another writer's lock: on the writer
    thread, so the event loop keeps serving other work meanwhile."""
    path = tmp_path / "contended.db"
    store = SQLiteStore(path, busy_timeout=5.0)
    fence = await store.acquire_fence("c")
    rival = sqlite3.connect(path, isolation_level=None)  # another writer holds the write lock
    rival.execute("BEGIN IMMEDIATE")
    try:
        append = asyncio.ensure_future(store.append([env("c", 0, fence)]))
        ticked = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, ticked.set)
        # Only a loop that is free while the append waits can run the timer callback.
        await asyncio.wait_for(ticked.wait(), timeout=2.0)
        assert not append.done(), "the append cannot have committed under the rival's lock"
    finally:
        rival.execute("ROLLBACK")
        rival.close()
    await append
    assert await store.last_sequence("c") == 0
    await store.close()


@pytest.fixture
def flows() -> Any:
    import loom

    @loom.step(id="tick")
    async def tick(i: int) -> int:
        return i

    @loom.flow(id="ticks")
    async def ticks(ctx: loom.WorkflowContext, n: int) -> int:
        for i in range(n):
            await ctx.run(tick, i)
        decision = await ctx.suspend("go")
        await ctx.run(tick, n)
        return int(decision["n"])

    return ticks


async def test_a_step_writes_one_row_and_never_the_head(tmp_path: Path, flows: Any) -> None:
    """One B-tree write per step: a step's append inserts its event and nothing else."""
    import loom

    path = tmp_path / "lean.db"
    store = SQLiteStore(path)
    watch = sqlite3.connect(path)
    watch.executescript(
        "CREATE TABLE head_moves (n INTEGER);"
        "CREATE TRIGGER count_head_moves AFTER UPDATE ON loom_heads "
        "BEGIN INSERT INTO head_moves VALUES (1); END;"
    )
    runtime = loom.WorkflowRuntime(store)
    runtime.register(flows)
    handle = await runtime.start(flows, 20, execution_id="lean")
    await handle.wait_for_suspend()
    moves = watch.execute("SELECT count(*) FROM head_moves").fetchone()[0]
    assert moves <= 1, f"{moves} head updates for a start and 20 steps"
    resumed = await runtime.resume("lean", "go", {"n": 7})
    assert await resumed.result() == 7
    assert await store.last_sequence("lean") == len(await store.read("lean")) - 1
    await runtime.close()
    watch.close()


async def test_a_version_4_file_migrates_in_place_and_its_executions_go_on(
    tmp_path: Path, flows: Any
) -> None:
    """Schema 5 only stops moving the head per step: a file written by version 4 (head exact)
    climbs the ladder in place, and its executions resume and append where they were."""
    import loom
    from loom.storage._schema import SCHEMA_VERSION

    path = tmp_path / "v4.db"
    runtime = loom.WorkflowRuntime(SQLiteStore(path))
    runtime.register(flows)
    await (await runtime.start(flows, 5, execution_id="old")).wait_for_suspend()
    await runtime.close()
    conn = sqlite3.connect(path)  # exactly what version 4 wrote: the head tracks the tail
    conn.execute(
        "UPDATE loom_heads SET next_sequence = (SELECT max(sequence) + 1 FROM loom_events "
        "WHERE loom_events.execution_id = loom_heads.execution_id)"
    )
    conn.execute("DROP TABLE loom_leases")  # and what later versions added
    conn.execute("DROP TABLE loom_mailbox")
    conn.execute("DROP TABLE loom_refs")
    conn.execute("DROP TABLE loom_snapshot_segments")
    sqlite_events_before_rung_10(conn)
    conn.execute("UPDATE loom_meta SET value = '4' WHERE key = 'schema_version'")
    conn.commit()
    tail = conn.execute("SELECT max(sequence) FROM loom_events").fetchone()[0]

    store = SQLiteStore(path)
    assert conn.execute("SELECT value FROM loom_meta").fetchone() == (str(SCHEMA_VERSION),)
    assert await store.last_sequence("old") == tail
    runtime = loom.WorkflowRuntime(store)
    runtime.register(flows)
    resumed = await runtime.resume("old", "go", {"n": 3})
    assert await resumed.result() == 3
    log = await store.read("old")
    assert [e.sequence for e in log] == list(range(len(log)))
    assert len(log) > tail + 1
    await runtime.close()
    conn.close()
