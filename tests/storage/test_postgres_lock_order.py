"""PostgreSQL writes that take the change-cursor lock never deadlock with each other.

A write that changes an execution's summary takes a transaction-scoped advisory lock (the
change cursor's, see ``_INDEX`` in ``_postgres_sql``) besides its head row. A group-commit batch
of several such writes used to take that lock in its first statement and only then lock the
later executions' heads, while a lone write locked its head first: a lone take-over (or start)
of an execution that a batch also writes could hold the head the batch waits for while waiting
for the lock the batch holds. PostgreSQL then broke the cycle by refusing one of the writes.

Each test pins the interleaving instead of racing for it: a trigger on the index table (test
only, in the test's own schema) holds the batch right after it took the cursor lock, until the
test lets it go; meanwhile the lone write runs as far as it can. A deadlock fails the test (one
write is refused with the deadlock as its cause) within ``deadlock_timeout``; any other wait is
bounded by ``lock_timeout``, so a regression can never hang the suite.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.errors
import pytest
from psycopg.conninfo import make_conninfo

from loom.errors import (
    DuplicateEnvelopeIdError,
    DuplicateSequenceError,
    ExecutionAlreadyExistsError,
    LoomError,
    StaleFenceError,
)
from loom.model import Envelope, EventType
from loom.storage._postgres_commit import PostgresWrite, PostgresWriter
from loom.storage.postgres import PostgresStore
from loom.testing._store_conformance import env
from tests.support.pg import require_pg, temp_schema
from tests.support.poll import until

pytestmark = pytest.mark.postgres

#: Short enough that a deadlock shows within the test, long enough that none is found spuriously.
_LOCKS = "-c deadlock_timeout=200ms -c lock_timeout=15s"


@dataclass
class Rig:
    dsn: str
    schema: str
    batch: PostgresStore  # group commit: its concurrent writes form one batch
    lone: PostgresStore  # another process's store, as far as locks go
    gate: int  # the advisory key the trigger waits on


def _dsn(dsn: str, tag: str) -> str:
    return make_conninfo(dsn, application_name=tag, options=_LOCKS)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    dsn = require_pg()
    tag = f"lockorder-{secrets.token_hex(4)}"
    async with temp_schema(dsn) as schema:
        batch = await PostgresStore.open(_dsn(dsn, f"{tag}-batch"), schema=schema)
        lone = await PostgresStore.open(_dsn(dsn, f"{tag}-lone"), schema=schema)
        try:
            yield Rig(dsn, schema, batch, lone, secrets.randbits(62))
        finally:
            await asyncio.gather(batch.close(), lone.close())


def _hold(rig: Rig, table: str, execution_id: str, store: PostgresStore | None = None) -> None:
    """Make the next insert into ``table`` for ``execution_id`` (by ``store`` if given) wait
    until the test releases ``rig.gate``: an index row is written under the cursor lock, an
    event after its head."""
    s = f'"{rig.schema}"'
    who = "" if store is None else f" AND current_setting('application_name') = '{_app(store)}'"
    with psycopg.connect(rig.dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE FUNCTION {s}.hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.execution_id = '{execution_id}'{who} THEN "
            f"PERFORM pg_advisory_xact_lock_shared({rig.gate}); END IF; RETURN NEW; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER hold BEFORE INSERT ON {s}.{table} "
            f"FOR EACH ROW EXECUTE FUNCTION {s}.hold()"
        )


def _app(store: PostgresStore) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(store.dsn)["application_name"])


async def _waiting(rig: Rig, store: PostgresStore) -> bool:
    """Whether one of ``store``'s sessions is waiting for a lock."""
    async with await psycopg.AsyncConnection.connect(rig.dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'",
            (_app(store),),
        )
        row = await cur.fetchone()
    return row is not None and row[0] > 0


def _no_deadlock(results: list[object]) -> None:
    for r in results:
        cause = r.__cause__ if isinstance(r, BaseException) else None
        assert not isinstance(cause, psycopg.errors.DeadlockDetected), f"deadlock: {r!r}"
        assert not isinstance(r, BaseException) or isinstance(r, LoomError), repr(r)


async def _race(
    rig: Rig, held: Sequence[Awaitable[object]], waiting: Awaitable[object], *, swap: bool = False
) -> list[object]:
    """Run ``held`` as one batch of ``rig.batch`` (of ``rig.lone`` with ``swap``), until the
    trigger holds it; start ``waiting`` (one write or a gather, on the other store), and let
    the batch go once that waits for a lock; return every outcome (an exception as a value)."""
    first, second = (rig.lone, rig.batch) if swap else (rig.batch, rig.lone)
    gate = await psycopg.AsyncConnection.connect(rig.dsn, autocommit=True)
    try:
        await gate.execute("SELECT pg_advisory_lock(%s)", (rig.gate,))
        batch = asyncio.ensure_future(asyncio.gather(*held, return_exceptions=True))
        await until(lambda: _waiting(rig, first), "the batch held by the trigger")
        other = asyncio.ensure_future(asyncio.gather(waiting, return_exceptions=True))
        await until(lambda: _waiting(rig, second), "the other write waiting for a lock")
        await gate.execute("SELECT pg_advisory_unlock(%s)", (rig.gate,))
        done = await asyncio.wait_for(asyncio.gather(batch, other), timeout=30)
    finally:
        await gate.close()
    return [*done[0], *done[1]]


async def test_a_lone_take_over_and_a_batch_through_its_head_do_not_deadlock(rig: Rig) -> None:
    fences = {}
    for eid in ("dl-a", "dl-b"):
        fences[eid] = await rig.batch.acquire_fence(eid)
        await rig.batch.append([env(eid, 0, fences[eid]), env(eid, 1, fences[eid])])
    _hold(rig, "executions", "dl-a")

    writes = [
        rig.batch.take_over(
            [env(eid, 2, fences[eid] + 1, EventType.EXECUTION_RECOVERED, {"by": "batch"})],
            from_fence=fences[eid],
        )
        for eid in ("dl-a", "dl-b")
    ]
    lone = rig.lone.take_over(
        [env("dl-b", 2, fences["dl-b"] + 1, EventType.EXECUTION_RECOVERED, {"by": "lone"})],
        from_fence=fences["dl-b"],
    )
    a, b, alone = await _race(rig, writes, lone)
    _no_deadlock([a, b, alone])
    assert a is None
    # Both took over dl-b from the same fence: exactly one of them won.
    assert [b, alone].count(None) == 1, (b, alone)
    loser = alone if b is None else b
    assert isinstance(loser, StaleFenceError | DuplicateSequenceError), repr(loser)
    got = await rig.lone.read("dl-b")
    assert [e.sequence for e in got] == [0, 1, 2]
    assert got[2].payload == {"by": "batch" if b is None else "lone"}


async def test_a_lone_start_and_a_batch_starting_the_same_execution_do_not_deadlock(
    rig: Rig,
) -> None:
    fence = await rig.batch.acquire_fence("dl-a")
    await rig.batch.append([env("dl-a", 0, fence), env("dl-a", 1, fence)])
    _hold(rig, "executions", "dl-a")
    writes = [
        rig.batch.take_over(
            [env("dl-a", 2, fence + 1, EventType.EXECUTION_RECOVERED)], from_fence=fence
        ),
        rig.batch.take_over([env("dl-c", 0, 1)], from_fence=0),
    ]
    lone = rig.lone.take_over([env("dl-c", 0, 1)], from_fence=0)
    a, c, alone = await _race(rig, writes, lone)
    _no_deadlock([a, c, alone])
    assert a is None
    assert [c, alone].count(None) == 1, (c, alone)
    loser = alone if c is None else c
    assert isinstance(loser, ExecutionAlreadyExistsError | StaleFenceError), repr(loser)
    assert [e.sequence for e in await rig.lone.read("dl-c")] == [0]


async def test_a_batch_whose_first_write_takes_no_cursor_lock_takes_it_before_that_head(
    rig: Rig,
) -> None:
    # The batch's step append to dl-a sorts before its status change of dl-b, which takes the
    # cursor lock: taken there, it would be taken while holding dl-a's head, which the lone
    # take-over of dl-a (holding the cursor lock) waits for.
    fences = {}
    for eid in ("dl-a", "dl-b"):
        fences[eid] = await rig.batch.acquire_fence(eid)
        await rig.batch.append([env(eid, 0, fences[eid]), env(eid, 1, fences[eid])])
    _hold(rig, "events", "dl-a")
    writes = [
        rig.batch.append([env("dl-a", 2, fences["dl-a"])]),
        rig.batch.take_over(
            [env("dl-b", 2, fences["dl-b"] + 1, EventType.EXECUTION_RECOVERED)],
            from_fence=fences["dl-b"],
        ),
    ]
    lone = rig.lone.take_over(
        [env("dl-a", 2, fences["dl-a"] + 1, EventType.EXECUTION_RECOVERED)],
        from_fence=fences["dl-a"],
    )
    a, b, alone = await _race(rig, writes, lone)
    _no_deadlock([a, b, alone])
    assert b is None
    # The zombie's append and the take-over both wrote sequence 2 of dl-a: one of them won.
    assert [a, alone].count(None) == 1, (a, alone)
    assert [e.sequence for e in await rig.lone.read("dl-a")] == [0, 1, 2]


async def test_a_lone_take_over_many_and_a_batch_through_its_heads_do_not_deadlock(
    rig: Rig,
) -> None:
    # A timer service's take-over of several executions (one statement) locks their heads in
    # id order; it must take the cursor lock first, as a lone take-over does.
    fences = {}
    for eid in ("dl-a", "dl-b", "dl-c"):
        fences[eid] = await rig.batch.acquire_fence(eid)
        await rig.batch.append([env(eid, 0, fences[eid]), env(eid, 1, fences[eid])])
    _hold(rig, "executions", "dl-a")

    def recovered(eid: str) -> list[Envelope]:
        return [env(eid, 2, fences[eid] + 1, EventType.EXECUTION_RECOVERED)]

    writes = [rig.batch.take_over(recovered(e), from_fence=fences[e]) for e in ("dl-a", "dl-b")]
    many = rig.lone.take_over_many([(recovered(e), fences[e]) for e in ("dl-b", "dl-c")])
    a, b, outcomes = await _race(rig, writes, many)
    _no_deadlock([a, b, outcomes])
    assert isinstance(outcomes, list), repr(outcomes)
    lone_b, c = outcomes
    assert a is None and c is None
    assert [b, lone_b].count(None) == 1, (b, lone_b)


async def test_a_batch_holding_a_take_over_many_locks_every_head_in_id_order(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch's take-over of dl-a and dl-d sorts (by its first id) before its append to dl-c,
    # so its statements lock dl-a, dl-d, then dl-c; another batch appending to dl-c then dl-d
    # holds dl-c while it waits for dl-d. A batch whose statement raised (a deadlock) is
    # replayed one savepoint per request, which hides the deadlock from its callers: the
    # replay is what shows it.
    replayed: list[list[str]] = []
    replay = PostgresWriter._run_savepoints

    async def record(self: PostgresWriter, conn: Any, batch: list[PostgresWrite]) -> bool:
        replayed.append([r.execution_id for r in batch])
        return await replay(self, conn, batch)

    monkeypatch.setattr(PostgresWriter, "_run_savepoints", record)
    fences = {}
    for eid in ("dl-a", "dl-c", "dl-d"):
        fences[eid] = await rig.batch.acquire_fence(eid)
        await rig.batch.append([env(eid, 0, fences[eid]), env(eid, 1, fences[eid])])
    _hold(rig, "events", "dl-c", rig.lone)
    other = [rig.lone.append([env(e, 2, fences[e])]) for e in ("dl-c", "dl-d")]
    many = rig.batch.take_over_many(
        [([env(e, 2, fences[e] + 1, EventType.STEP_STARTED)], fences[e]) for e in ("dl-a", "dl-d")]
    )

    async def batch() -> list[object]:  # started by _race, not before
        late = rig.batch.append([env("dl-c", 2, fences["dl-c"])])
        return list(await asyncio.gather(many, late, return_exceptions=True))

    c, d, outcome = await _race(rig, other, batch(), swap=True)
    assert isinstance(outcome, list), repr(outcome)
    many_outcomes, late = outcome
    _no_deadlock([c, d, many_outcomes, late])
    assert replayed == [], f"a batch statement raised (a deadlock): {replayed}"
    assert c is None
    # The other batch wrote dl-c's sequence 2 first (the trigger held it, not the lock).
    assert isinstance(late, DuplicateSequenceError), repr(late)
    assert isinstance(many_outcomes, list), repr(many_outcomes)
    a, took_d = many_outcomes
    assert a is None
    assert [d, took_d].count(None) == 1, (d, took_d)


async def test_a_take_over_many_holds_the_cursor_lock_until_it_commits(rig: Rig) -> None:
    # A take_over_many that writes index rows takes its change cursor under the lock, as a lone
    # take-over does: without it, another summary change could take a later cursor and commit
    # first, and a feed reader past that cursor would never see this one's.
    fences = {}
    for eid in ("dl-b", "dl-a"):  # created in the other order: their first cursors too
        fences[eid] = await rig.batch.acquire_fence(eid)
        await rig.batch.append([env(eid, 0, fences[eid]), env(eid, 1, fences[eid])])
    _hold(rig, "executions", "dl-a")

    def recovered(eid: str) -> list[Envelope]:
        return [env(eid, 2, fences[eid] + 1, EventType.EXECUTION_RECOVERED)]

    many = rig.batch.take_over_many([(recovered("dl-a"), fences["dl-a"])])
    lone = rig.lone.take_over(recovered("dl-b"), from_fence=fences["dl-b"])
    outcomes, alone = await _race(rig, [many], lone)
    _no_deadlock([outcomes, alone])
    assert outcomes == [None] and alone is None, (outcomes, alone)
    with psycopg.connect(rig.dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT execution_id FROM "{rig.schema}".executions ORDER BY cursor'
        ).fetchall()
    assert [r[0] for r in rows] == ["dl-a", "dl-b"]  # cursors in commit order


async def test_a_batch_holding_a_take_over_many_takes_no_head_before_an_earlier_one(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch's take-over of dl-a and dl-d and its append to dl-c: every head is locked in id
    # order before any statement runs, so it waits for dl-a (held by another batch, which goes
    # on to dl-c) holding nothing. Locking only its other requests' heads first (dl-c), then
    # the take-over's (dl-a), it would hold dl-c while waiting for dl-a: a deadlock.
    replayed: list[list[str]] = []
    replay = PostgresWriter._run_savepoints

    async def record(self: PostgresWriter, conn: Any, batch: list[PostgresWrite]) -> bool:
        replayed.append([r.execution_id for r in batch])
        return await replay(self, conn, batch)

    monkeypatch.setattr(PostgresWriter, "_run_savepoints", record)
    fences = {}
    for eid in ("dl-a", "dl-c", "dl-d"):
        fences[eid] = await rig.batch.acquire_fence(eid)
        await rig.batch.append([env(eid, 0, fences[eid]), env(eid, 1, fences[eid])])
    _hold(rig, "events", "dl-a", rig.lone)
    other = [rig.lone.append([env(e, 2, fences[e])]) for e in ("dl-a", "dl-c")]

    async def batch() -> list[object]:  # started by _race, not before
        many = rig.batch.take_over_many(
            [
                ([env(e, 2, fences[e] + 1, EventType.STEP_STARTED)], fences[e])
                for e in ("dl-a", "dl-d")
            ]
        )
        late = rig.batch.append([env("dl-c", 2, fences["dl-c"])])
        return list(await asyncio.gather(many, late, return_exceptions=True))

    a, c, outcome = await _race(rig, other, batch(), swap=True)
    assert isinstance(outcome, list), repr(outcome)
    many_outcomes, late = outcome
    _no_deadlock([a, c, many_outcomes, late])
    assert replayed == [], f"a batch statement raised (a deadlock): {replayed}"
    assert a is None and c is None
    # The other batch wrote sequence 2 of dl-a and dl-c first.
    assert isinstance(late, DuplicateSequenceError), repr(late)
    assert isinstance(many_outcomes, list), repr(many_outcomes)
    took_a, took_d = many_outcomes
    assert isinstance(took_a, DuplicateSequenceError | StaleFenceError), repr(took_a)
    assert took_d is None


async def test_a_batch_holding_an_indexed_take_over_many_takes_the_cursor_lock_first(
    rig: Rig,
) -> None:
    # The batch's step append to dl-0 sorts first; its take_over_many changes dl-a's status, so
    # it takes the cursor lock. Taken only in that statement, after the batch locked every head
    # (dl-0, dl-a, dl-b), it would be waited for while holding dl-a, which the lone take-over
    # of dl-a (holding the cursor lock) waits for.
    fences = {}
    for eid in ("dl-0", "dl-a", "dl-b"):
        fences[eid] = await rig.batch.acquire_fence(eid)
        await rig.batch.append([env(eid, 0, fences[eid]), env(eid, 1, fences[eid])])
    _hold(rig, "events", "dl-0")

    def recovered(eid: str) -> list[Envelope]:
        return [env(eid, 2, fences[eid] + 1, EventType.EXECUTION_RECOVERED)]

    writes = [
        rig.batch.append([env("dl-0", 2, fences["dl-0"])]),
        rig.batch.take_over_many([(recovered(e), fences[e]) for e in ("dl-a", "dl-b")]),
    ]
    lone = rig.lone.take_over(recovered("dl-a"), from_fence=fences["dl-a"])
    zero, outcomes, alone = await _race(rig, writes, lone)
    _no_deadlock([zero, outcomes, alone])
    assert zero is None
    assert isinstance(outcomes, list), repr(outcomes)
    took_a, took_b = outcomes
    assert took_b is None
    assert [took_a, alone].count(None) == 1, (took_a, alone)


async def test_a_batch_replayed_after_a_refused_statement_takes_the_cursor_lock_first(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A statement of the batch raised (a duplicate envelope id), so the batch is replayed one
    # savepoint per request: the replay takes the cursor lock before any head too. The trigger
    # holds only the replay's append to dl-a (its second insert), which a replay taking the
    # lock in dl-b's statement would do holding dl-a, waited for by the lone take-over of dl-a.
    replayed: list[list[str]] = []
    replay = PostgresWriter._run_savepoints

    async def record(self: PostgresWriter, conn: Any, batch: list[PostgresWrite]) -> bool:
        replayed.append([r.execution_id for r in batch])
        return await replay(self, conn, batch)

    monkeypatch.setattr(PostgresWriter, "_run_savepoints", record)
    fences = {}
    for eid in ("dl-a", "dl-b", "dl-c"):
        fences[eid] = await rig.batch.acquire_fence(eid)
        await rig.batch.append([env(eid, 0, fences[eid]), env(eid, 1, fences[eid])])
    await rig.batch.append([env("dl-c", 2, fences["dl-c"], envelope_id="dl-taken")])
    s = f'"{rig.schema}"'
    with psycopg.connect(rig.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SEQUENCE {s}.hold_count")
        conn.execute(
            f"CREATE FUNCTION {s}.hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.execution_id = 'dl-a' AND nextval('{s}.hold_count') = 2 THEN "
            f"PERFORM pg_advisory_xact_lock_shared({rig.gate}); END IF; RETURN NEW; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER hold BEFORE INSERT ON {s}.events "
            f"FOR EACH ROW EXECUTE FUNCTION {s}.hold()"
        )
    writes = [
        rig.batch.append([env("dl-a", 2, fences["dl-a"])]),
        rig.batch.take_over(
            [env("dl-b", 2, fences["dl-b"] + 1, EventType.EXECUTION_RECOVERED)],
            from_fence=fences["dl-b"],
        ),
        rig.batch.append([env("dl-c", 3, fences["dl-c"], envelope_id="dl-taken")]),
    ]
    lone = rig.lone.take_over(
        [env("dl-a", 2, fences["dl-a"] + 1, EventType.EXECUTION_RECOVERED)],
        from_fence=fences["dl-a"],
    )
    a, b, c, alone = await _race(rig, writes, lone)
    _no_deadlock([a, b, c, alone])
    assert replayed == [["dl-a", "dl-b", "dl-c"]], replayed
    assert b is None
    assert isinstance(c, DuplicateEnvelopeIdError), repr(c)
    assert [a, alone].count(None) == 1, (a, alone)
