"""Schema rung 11's head flags on PostgreSQL: appends notify only watched heads, and no
wake-up is lost; a database from before the rung learns which of its executions ended.

The stores here share nothing but the database (each has its own pool, writer and listener), so
a waiter in one is woken only by NOTIFY, as one in another process is; every waiter's safety
poll is an hour, far beyond any deadline here, so a lost notification reads as a timeout.
Which notifications were sent is read on a raw ``LISTEN`` connection, up to a sentinel note
sent after the writes (notifications arrive in commit order), so "none was sent" is asserted
without sleeping.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

import psycopg
import pytest

from loom.errors import ExecutionEndedError
from loom.model import EventType
from loom.storage._postgres_sql import notify_channel
from loom.storage.postgres import PostgresStore
from loom.testing._store_conformance import env
from tests.support.pg import tagged_dsn, terminate
from tests.support.poll import until

pytestmark = pytest.mark.postgres

T = TypeVar("T")

# A waiter's notes come on LISTEN alone: the hour-long safety poll never fires in a test.
NO_POLL = {"safety_poll_interval": 3600.0}


@pytest.fixture
def writer(pg_store: PostgresStore) -> PostgresStore:
    return pg_store


@pytest.fixture
async def waiter(pg_dsn: str, schema: str) -> AsyncIterator[PostgresStore]:
    """A second store over the same schema: nothing shared with ``writer`` but the database."""
    store = await PostgresStore.open(pg_dsn, schema=schema, **NO_POLL)
    try:
        yield store
    finally:
        await store.close()


class Notes:
    """A raw LISTEN on a schema's channel: what was sent, read up to a sentinel."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.channel = notify_channel(schema)
        self.conn: psycopg.AsyncConnection[Any] | None = None

    async def __aenter__(self) -> Notes:
        self.conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        await self.conn.execute(f"LISTEN {self.channel}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.conn is not None
        await self.conn.close()

    async def sent(self) -> list[str]:
        """The payloads sent since the last call (a sentinel, sent now, closes the list)."""
        assert self.conn is not None
        sentinel = f"sentinel-{secrets.token_hex(4)}"
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as other:
            await other.execute("SELECT pg_notify(%s, %s)", (self.channel, sentinel))
        got: list[str] = []
        async with asyncio.timeout(10):
            async for note in self.conn.notifies():
                if note.payload == sentinel:
                    return got
                got.append(note.payload)
        raise AssertionError("unreachable")


async def _after_turns(turns: int, work: Awaitable[T]) -> T:
    """``work``, after ``turns`` passes of the event loop (an offset, not a wait)."""
    for _ in range(turns):
        await asyncio.sleep(0)
    return await work


async def _woken_once_marked(
    writer: PostgresStore, waiter: PostgresStore, eid: str, fence: int, after: int
) -> None:
    """``waiter`` waits past ``after`` and marks the head; the writer's next step wakes it."""
    waiting = asyncio.ensure_future(waiter.wait_for_append(eid, after, timeout=30))
    await until(lambda: eid in waiter._watched, "the head marked watched")
    await writer.append([env(eid, after + 1, fence)])
    assert await asyncio.wait_for(waiting, 10) == after + 1


def _steps(eid: str, fence: int, sequences: Sequence[int]) -> list[Any]:
    return [env(eid, s, fence) for s in sequences]


async def test_only_starts_and_watched_heads_notify(
    pg_dsn: str, schema: str, writer: PostgresStore, waiter: PostgresStore
) -> None:
    async with Notes(pg_dsn, schema) as notes:
        await notes.sent()  # the schema's creation sent nothing; start clean
        fence = await writer.acquire_fence("quiet")
        await writer.append([env("quiet", 0, fence)])
        # A start always notifies (a waiter of an execution not yet created has no head to
        # mark); the index feed has its own note.
        assert "quiet" in await notes.sent()
        for seq in range(1, 4):
            await writer.append([env("quiet", seq, fence)])
        await writer.append(_steps("quiet", fence, [4, 5]))  # a batch of two
        assert await notes.sent() == []  # nobody waits: no step notified

        await _woken_once_marked(writer, waiter, "quiet", fence, 5)
        assert await notes.sent() == ["quiet"]

        # A take-over moves the head it locked, watched or not.
        await writer.take_over([env("quiet", 7, fence + 1)], from_fence=fence)
        assert await notes.sent() == ["quiet"]


async def test_a_batch_of_take_overs_notifies_its_watched_heads_only(
    pg_dsn: str, schema: str, writer: PostgresStore, waiter: PostgresStore
) -> None:
    """A timer service fires suspended executions with one ``take_over_many``: the waiter of
    one of them is woken, and the unwatched ones send nothing."""
    fences = {}
    for eid in ("t-a", "t-b", "t-c"):
        fences[eid] = await writer.acquire_fence(eid)
        await writer.append(_steps(eid, fences[eid], [0, 1]))
    async with Notes(pg_dsn, schema) as notes:
        waiting = asyncio.ensure_future(waiter.wait_for_append("t-b", 1, timeout=30))
        await until(lambda: "t-b" in waiter._watched, "the head marked watched")
        outcomes = await writer.take_over_many(
            [([env(eid, 2, fences[eid] + 1)], fences[eid]) for eid in fences]
        )
        assert outcomes == [None, None, None]
        assert await asyncio.wait_for(waiting, 10) == 2
        assert await notes.sent() == ["t-b"]


async def test_a_waiter_of_an_execution_not_yet_started_is_woken_by_its_start(
    writer: PostgresStore, waiter: PostgresStore
) -> None:
    waiting = asyncio.ensure_future(waiter.wait_for_append("later", -1, timeout=30))
    await until(lambda: waiter._listening.is_set() and "later" in waiter._waiting, "the waiter")
    assert "later" not in waiter._watched  # no head to mark yet
    fence = await writer.acquire_fence("later")
    await writer.append([env("later", 0, fence)])
    assert await asyncio.wait_for(waiting, 10) == 0
    # Its next wait marks the head, which now exists: the next step wakes it.
    await _woken_once_marked(writer, waiter, "later", fence, 0)


async def test_a_first_wait_racing_the_last_append_never_misses_it(
    pg_dsn: str, schema: str, writer: PostgresStore
) -> None:
    """The mark and an append race on each of many executions: the waiter's first wait (which
    marks the head) and the writer's one step after the start are sent together, in both
    orders and with every offset of a few loop turns, and nothing is written after that step.
    Whichever commits first, the waiter must see the step: read as the mark's own answer, or
    woken by the step's note. Reading the tail before marking (a window between two round
    trips) would leave some waits asleep until their timeout."""
    for i in range(60):
        # A fresh waiter store each round, so each first wait marks (nothing remembered).
        waiter = await PostgresStore.open(pg_dsn, schema=schema, **NO_POLL)
        try:
            eid = f"race-{i}"
            fence = await writer.acquire_fence(eid)
            await writer.append([env(eid, 0, fence)])
            await waiter.wait_for_append("warm", -1, timeout=0)  # listener up, pool warm
            await until(waiter._listening.is_set, "listening")

            offset = i % 6
            try:
                async with asyncio.timeout(5):
                    _, seen = await asyncio.gather(
                        _after_turns(offset if i % 2 else 0, writer.append([env(eid, 1, fence)])),
                        # No timeout of its own: at one it would read the tail again and
                        # return the step late, hiding the lost note.
                        _after_turns(
                            0 if i % 2 else offset,
                            waiter.wait_for_append(eid, 0, timeout=None),
                        ),
                    )
            except TimeoutError:
                raise AssertionError(f"round {i}: the waiter slept through the step") from None
            assert seen == 1
        finally:
            await waiter.close()


async def test_a_read_only_store_waits_by_polling(
    pg_dsn: str, schema: str, writer: PostgresStore
) -> None:
    """A read-only store cannot mark a head; its waits poll every ``poll_interval``."""
    reader = await PostgresStore.open(
        pg_dsn, schema=schema, read_only=True, poll_interval=0.02, **NO_POLL
    )
    try:
        fence = await writer.acquire_fence("ro")
        await writer.append([env("ro", 0, fence)])
        waiting = asyncio.ensure_future(reader.wait_for_append("ro", 0, timeout=30))
        await until(lambda: "ro" in reader._waiting, "the reader waiting")
        await writer.append([env("ro", 1, fence)])
        assert await asyncio.wait_for(waiting, 10) == 1
        assert reader._watched == set()
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            cur = await conn.execute(
                f'SELECT watched FROM "{schema}".heads WHERE execution_id = %s', ("ro",)
            )
            assert await cur.fetchone() == (False,)  # nothing was written by the reader
    finally:
        await reader.close()


async def test_a_rung_10_database_learns_which_executions_ended(pg_dsn: str, schema: str) -> None:
    """The rung back-fills ``ended`` from the logs: an execution that ended before the upgrade
    still refuses an append after it, and one still running takes its next step."""
    store = await PostgresStore.open(pg_dsn, schema=schema)
    try:
        for eid in ("done", "open"):
            fence = await store.acquire_fence(eid)
            await store.append(_steps(eid, fence, [0, 1]))
        await store.append([env("done", 2, 1, EventType.EXECUTION_FAILED, {"error": {}})])
    finally:
        await store.close()
    s = f'"{schema}"'
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(f"ALTER TABLE {s}.heads DROP COLUMN watched, DROP COLUMN ended")
        await conn.execute(f"UPDATE {s}.meta SET value = '10' WHERE key = 'schema_version'")
    store = await PostgresStore.open(pg_dsn, schema=schema)
    try:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            cur = await conn.execute(
                f"SELECT execution_id, ended, watched FROM {s}.heads ORDER BY 1"
            )
            assert await cur.fetchall() == [("done", True, False), ("open", False, False)]
        with pytest.raises(ExecutionEndedError) as refused:
            await store.append([env("done", 3, 1)])
        assert refused.value.execution_id == "done"
        await store.append([env("open", 2, 1)])
        assert await store.last_sequence("done") == 2
        assert await store.last_sequence("open") == 2
    finally:
        await store.close()


async def test_a_second_process_waits_on_a_head_already_watched(
    pg_dsn: str, schema: str, writer: PostgresStore, waiter: PostgresStore
) -> None:
    """Marking a head that is marked already still answers with its tail (the mark always
    updates: a mark that skipped a watched head would read nothing)."""
    other = await PostgresStore.open(pg_dsn, schema=schema, **NO_POLL)
    try:
        fence = await writer.acquire_fence("two")
        await writer.append(_steps("two", fence, [0, 1]))
        for store in (waiter, other):
            waiting = asyncio.ensure_future(store.wait_for_append("two", 1, timeout=30))
            await until(lambda s=store: "two" in s._watched, "the head marked")  # type: ignore[misc]
            assert not waiting.done()
            waiting.cancel()
        waiting = asyncio.ensure_future(other.wait_for_append("two", 1, timeout=30))
        await until(lambda: "two" in other._waiting, "the second waiter")
        await writer.append([env("two", 2, fence)])
        assert await asyncio.wait_for(waiting, 10) == 2
    finally:
        await other.close()


async def test_a_wait_keeps_its_deadline_while_the_head_is_locked(
    pg_dsn: str, schema: str, writer: PostgresStore, waiter: PostgresStore
) -> None:
    """A head held by a writer stuck in its transaction cannot be marked: the wait does not
    block on the lock past its own deadline, and the head is marked once it is free."""
    fence = await writer.acquire_fence("held")
    await writer.append(_steps("held", fence, [0, 1]))
    await waiter.wait_for_append("warm", -1, timeout=0)
    await until(waiter._listening.is_set, "listening")
    async with await psycopg.AsyncConnection.connect(pg_dsn) as stuck:
        await stuck.execute(
            f'SELECT 1 FROM "{schema}".heads WHERE execution_id = %s FOR UPDATE', ("held",)
        )
        async with asyncio.timeout(10):  # blocked on the lock, it would wait until the end
            assert await waiter.wait_for_append("held", 1, timeout=0.3) == 1
        assert "held" not in waiter._watched
        await stuck.rollback()
    await _woken_once_marked(writer, waiter, "held", fence, 1)  # marked once free


async def test_a_batched_take_over_from_sequence_0_notifies(
    pg_dsn: str, schema: str, writer: PostgresStore
) -> None:
    """A head made by ``acquire_fence`` and first written by a take_over_many has no mark yet:
    like a start, that write notifies (a waiter may be waiting for the execution to exist)."""
    fence = await writer.acquire_fence("zero")
    async with Notes(pg_dsn, schema) as notes:
        await notes.sent()
        fired = {"position": 0, "timed_out": False}
        request = ([env("zero", 0, fence + 1, EventType.TIMER_FIRED, fired)], fence)
        assert await writer.take_over_many([request]) == [None]
        assert "zero" in await notes.sent()


async def test_a_first_wait_survives_terminated_pool_connections(
    pg_dsn: str, schema: str, writer: PostgresStore
) -> None:
    """The mark is tried again on a fresh connection, as a read is, when the pooled one it
    took turns out dead (a server restart terminates them all)."""
    tag = f"loom-mark-{schema}"
    waiter = await PostgresStore.open(tagged_dsn(pg_dsn, tag), schema=schema, pool_min=2, **NO_POLL)
    try:
        fence = await writer.acquire_fence("dead")
        await writer.append(_steps("dead", fence, [0, 1]))
        await waiter.wait_for_append("warm", -1, timeout=0)
        await until(waiter._listening.is_set, "listening")
        assert terminate(pg_dsn, tag) >= 1
        await _woken_once_marked(writer, waiter, "dead", fence, 1)
    finally:
        await waiter.close()
