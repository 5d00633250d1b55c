"""A PostgreSQL batch of several writes runs as one libpq pipeline (``LeanStatements.
begin_and_run``), not psycopg's per-statement cursor: what it writes, refuses and falls back to."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from loom.errors import DuplicateEnvelopeIdError, StaleFenceError
from loom.model import EventType
from loom.storage import Snapshot
from loom.storage._postgres_lean import LeanStatements
from loom.storage.postgres import PostgresStore
from loom.testing._store_conformance import env

pytestmark = pytest.mark.postgres


class _Pipelines:
    """Records each pipelined batch (its size and lock) and whether it answered or raised."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, int | None, str]] = []
        #: The connection each pipeline ran on.
        self.conns: list[psycopg.AsyncConnection[Any]] = []
        real = LeanStatements.begin_and_run

        async def begin_and_run(
            lean: LeanStatements, statements: Sequence[Any], lock_key: int | None = None
        ) -> Any:
            self.conns.append(lean.conn)
            try:
                rows = await real(lean, statements, lock_key)
            except Exception as exc:
                self.calls.append((len(statements), lock_key, type(exc).__name__))
                raise
            self.calls.append((len(statements), lock_key, "ok"))
            return rows

        monkeypatch.setattr(LeanStatements, "begin_and_run", begin_and_run)

    def answered(self) -> int:
        """Writes that a pipeline committed statements for (its batch sizes, summed)."""
        return sum(n for n, _, outcome in self.calls if outcome == "ok")


async def _started(store: PostgresStore, ids: list[str]) -> list[int]:
    fences = await asyncio.gather(*(store.acquire_fence(i) for i in ids))
    await asyncio.gather(*(store.append([env(i, 0, f)]) for i, f in zip(ids, fences, strict=True)))
    return list(fences)


async def test_a_batch_of_starts_and_steps_is_pipelined_and_lands(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipelines = _Pipelines(monkeypatch)
    ids = [f"lean-{i:02d}" for i in range(24)]
    fences = await _started(pg_store, ids)
    # Starts write an index row: their batches take the change cursor's lock in the pipeline.
    assert any(n > 1 and key is not None for n, key, _ in pipelines.calls), pipelines.calls
    before = pipelines.answered()
    await asyncio.gather(
        *(pg_store.append([env(i, 1, f)]) for i, f in zip(ids, fences, strict=True))
    )
    assert pipelines.answered() > before, pipelines.calls  # the steps went through it too
    for i, f in zip(ids, fences, strict=True):
        events = await pg_store.read(i)
        assert [(e.sequence, e.type, e.fence) for e in events] == [
            (0, EventType.EXECUTION_STARTED, f),
            (1, EventType.STEP_COMPLETED, f),
        ]
        assert events[1].payload == {"position": 1, "step_id": "s", "output": 1}


async def test_a_refused_write_in_a_pipelined_batch_is_refused_alone(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [f"ref-{i:02d}" for i in range(12)]
    fences = await _started(pg_store, ids)
    stale = fences[0]
    assert await pg_store.acquire_fence(ids[0]) == stale + 1  # ids[0]'s old fence is stale now
    pipelines = _Pipelines(monkeypatch)
    results = await asyncio.gather(
        *(pg_store.append([env(i, 1, f)]) for i, f in zip(ids, fences, strict=True)),
        return_exceptions=True,
    )
    assert any(n > 1 and outcome == "ok" for n, _, outcome in pipelines.calls), pipelines.calls
    assert isinstance(results[0], StaleFenceError), results[0]
    assert results[0].execution_id == ids[0]
    assert results[1:] == [None] * (len(ids) - 1)
    assert await pg_store.last_sequence(ids[0]) == 0
    for i in ids[1:]:
        assert await pg_store.last_sequence(i) == 1


async def test_a_raising_write_in_a_pipelined_batch_falls_back_and_fails_alone(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = await pg_store.acquire_fence("taken")
    await pg_store.append([env("taken", 0, taken, envelope_id="the-id")])
    ids = [f"dup-{i:02d}" for i in range(10)]
    fences = await _started(pg_store, ids)
    pipelines = _Pipelines(monkeypatch)
    results = await asyncio.gather(
        pg_store.append([env(ids[0], 1, fences[0], envelope_id="the-id")]),
        *(pg_store.append([env(i, 1, f)]) for i, f in zip(ids[1:], fences[1:], strict=True)),
        return_exceptions=True,
    )
    # The duplicate id raised inside a pipeline; the batch was replayed one savepoint each.
    assert any(outcome == "UniqueViolation" for _, _, outcome in pipelines.calls), pipelines.calls
    assert isinstance(results[0], DuplicateEnvelopeIdError), results[0]
    assert results[1:] == [None] * (len(ids) - 1)
    assert await pg_store.last_sequence(ids[0]) == 0
    for i in ids[1:]:
        assert await pg_store.last_sequence(i) == 1


async def test_statements_dropped_behind_the_pipelines_back_are_prepared_again(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [f"drop-{i:02d}" for i in range(12)]
    fences = await _started(pg_store, ids)
    pipelines = _Pipelines(monkeypatch)

    async def steps(step: int) -> None:
        results = await asyncio.gather(
            *(pg_store.append([env(i, step, f)]) for i, f in zip(ids, fences, strict=True)),
            return_exceptions=True,
        )
        assert results == [None] * len(ids), results

    await steps(1)  # the step statement is prepared on the connections the batches ran on
    assert pipelines.calls
    # What a pooler's DISCARD ALL does: every connection forgets its prepared statements.
    writer = pg_store._writer
    conns = [c for c in (writer._held, *writer._pooled_lean.keys()) if c is not None]
    assert conns
    for conn in conns:
        conn.pgconn.exec_(b"DEALLOCATE ALL")
    for step in (2, 3):
        await steps(step)
    # A batch that named a dropped statement fell back and the names were forgotten, so a
    # later pipeline prepared them again and answered.
    outcomes = [outcome for _, _, outcome in pipelines.calls]
    assert "InvalidSqlStatementName" in outcomes, pipelines.calls
    assert outcomes[-1] == "ok", pipelines.calls
    for i in ids:
        assert await pg_store.last_sequence(i) == 3


async def test_a_batch_larger_than_the_sockets_buffers_is_sent_and_answered(
    pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ~9 MB of statements in one pipeline: libpq's flush returns "not all sent" several times,
    # and the answers arrive while the rest is still being written.
    store = await PostgresStore.open(pg_dsn, schema=schema, max_batch=4000)
    try:
        ids = [f"big-{i:04d}" for i in range(3000)]
        fences = await _started(store, ids)
        pipelines = _Pipelines(monkeypatch)
        big = {"position": 1, "step_id": "s", "output": "x" * 3000}
        await asyncio.gather(
            *(store.append([env(i, 1, f, payload=big)]) for i, f in zip(ids, fences, strict=True))
        )
        assert max(n for n, _, _ in pipelines.calls) > 1000, pipelines.calls
        assert all(outcome == "ok" for _, _, outcome in pipelines.calls), pipelines.calls
        for i in ids[::300]:
            assert await store.last_sequence(i) == 1
    finally:
        await store.close()


async def test_lean_statements_do_not_keep_a_pooled_connection_alive(
    pg_store: PostgresStore, pg_dsn: str
) -> None:
    writer = pg_store._writer
    conn = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
    lean = writer._lean_on(conn, held=False)
    assert lean.conn is conn and conn in writer._pooled_lean
    before = len(writer._pooled_lean)
    await conn.close()
    del conn, lean
    gc.collect()
    assert len(writer._pooled_lean) == before - 1  # the entry went with its connection


_SEGMENT = {"n": 2, "ops": {"1": {"a": 4}}}


async def test_a_segment_refused_in_a_pipelined_batch_says_so(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A refused segment's statement answers with no row: read as "kept", a chain with a gap
    # would be reported saved (and the next load would merge segments that do not join).
    based = [f"seg-{i:02d}" for i in range(6)]
    for i in based:
        await pg_store.save_snapshot(Snapshot(i, 2, {"execution_id": i, "n": 1, "ops": {}}))
    pipelines = _Pipelines(monkeypatch)
    unbased = [f"noseg-{i:02d}" for i in range(6)]
    kept = await asyncio.gather(
        *(pg_store.save_snapshot_segment(Snapshot(i, 4, _SEGMENT), 2) for i in based),
        *(pg_store.save_snapshot_segment(Snapshot(i, 4, _SEGMENT), 2) for i in unbased),
    )
    assert any(n > 1 and outcome == "ok" for n, _, outcome in pipelines.calls), pipelines.calls
    assert kept == [True] * len(based) + [False] * len(unbased)
    for i in unbased:
        assert await pg_store.load_snapshot(i) is None
    for i in based:
        got = await pg_store.load_snapshot(i)
        assert got is not None and got.sequence == 4
        assert got.state == {"execution_id": i, "n": 2, "ops": {"1": {"a": 4}}}


async def test_a_pipeline_cancelled_mid_answer_closes_its_connection(
    pg_dsn: str, pg_store: PostgresStore
) -> None:
    # Left open, the connection would go back to the pool in pipeline mode, or mid-answer,
    # and the next batch on it would read this one's answers as its own.
    conn = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
    watcher = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
    try:
        pid = conn.info.backend_pid
        # So that the server notices the client went while it sleeps (it otherwise would only
        # when it next writes to the socket, 30 s later).
        await conn.execute("SET client_connection_check_interval = '50ms'")
        lean = LeanStatements(conn)
        slow = (b"SELECT 1 FROM pg_sleep($1::int)", [b"30"], (20,))
        task = asyncio.ensure_future(lean.begin_and_run([slow, slow]))
        deadline = time.monotonic() + 10
        while True:  # until the server is running the batch (its answer is then awaited)
            cur = await watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND query LIKE %s",
                (pid, "%pg_sleep%"),
            )
            row = await cur.fetchone()
            if row is not None and row[0] == 1:
                break
            assert time.monotonic() < deadline, "the batch never reached the server"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert conn.closed
        deadline = time.monotonic() + 10
        while True:  # its backend went with it: nothing of the batch is left running
            cur = await watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
            )
            row = await cur.fetchone()
            if row is not None and row[0] == 0:
                break
            assert time.monotonic() < deadline, "the cancelled batch's backend is still there"
            await asyncio.sleep(0.01)
    finally:
        await conn.close()
        await watcher.close()


async def test_batches_on_pooled_connections_use_their_own_prepared_statements(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [f"pool-{i:02d}" for i in range(16)]
    fences = await _started(pg_store, ids)
    writer = pg_store._writer
    held = writer._held
    assert held is not None  # the starts' batches took it
    pipelines = _Pipelines(monkeypatch)
    # As if a batch were running on the held connection: the next ones take pooled ones.
    writer._held_busy = True
    try:
        results = await asyncio.gather(
            *(pg_store.append([env(i, 1, f)]) for i, f in zip(ids, fences, strict=True)),
            return_exceptions=True,
        )
    finally:
        writer._held_busy = False
    assert results == [None] * len(ids), results
    assert pipelines.conns and all(c is not held for c in pipelines.conns), pipelines.calls
    assert all(outcome == "ok" for _, _, outcome in pipelines.calls), pipelines.calls
    assert held.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    for i in ids:
        assert await pg_store.last_sequence(i) == 1


@pytest.mark.parametrize("start_sorts", ["first", "last"])
async def test_a_batch_with_one_indexed_write_takes_the_cursor_lock(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch, start_sorts: str
) -> None:
    # A start writes an index row, so its batch takes the change cursor's lock before any
    # head (see _lock_first); wherever the start sorts in its batch, the lock is taken.
    stepping = [f"m-{i:02d}" for i in range(8)]
    fences = await _started(pg_store, stepping)
    new = "a-new" if start_sorts == "first" else "z-new"
    new_fence = await pg_store.acquire_fence(new)
    pipelines = _Pipelines(monkeypatch)
    await asyncio.gather(
        pg_store.append([env(new, 0, new_fence)]),
        *(pg_store.append([env(i, 1, f)]) for i, f in zip(stepping, fences, strict=True)),
    )
    assert pipelines.calls == [(len(stepping) + 1, pg_store._cursor_lock, "ok")]
    assert await pg_store.last_sequence(new) == 0
