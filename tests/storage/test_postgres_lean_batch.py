"""A PostgreSQL batch of several writes runs as one libpq pipeline (``LeanStatements.
begin_and_run``), not psycopg's per-statement cursor: what it writes, refuses and falls back to."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from loom.errors import DuplicateEnvelopeIdError, StaleFenceError
from loom.model import EventType
from loom.storage._postgres_lean import LeanStatements
from loom.storage.postgres import PostgresStore
from loom.testing._store_conformance import env

pytestmark = pytest.mark.postgres


class _Pipelines:
    """Records each pipelined batch (its size and lock) and whether it answered or raised."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, int | None, str]] = []
        real = LeanStatements.begin_and_run

        async def begin_and_run(
            lean: LeanStatements, statements: Sequence[Any], lock_key: int | None = None
        ) -> Any:
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
