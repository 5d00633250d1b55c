"""PostgresStore: the whole conformance kit over a real server, plus what only it promises."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg import pq

from loom import faults
from loom.errors import (
    ConfigurationError,
    CorruptEventError,
    DuplicateEnvelopeIdError,
    PayloadError,
    SchemaVersionError,
    StaleFenceError,
    StorageError,
    StorageWriteError,
    WriteOutcome,
)
from loom.model import Envelope, EventType
from loom.storage import Snapshot, Store, Timer, _postgres_commit, _postgres_lean
from loom.storage import postgres as postgres_module
from loom.storage._blobs import blob_hash
from loom.storage._postgres_commit import PostgresWriter
from loom.storage.postgres import SCHEMA_VERSION, PostgresStore
from loom.testing import STORE_CHECKS, run_store_check
from loom.testing._store_conformance import env
from tests.support.pg import tagged_dsn, terminate
from tests.support.poll import until

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(pg_store: PostgresStore) -> PostgresStore:
    return pg_store


VARIANTS = {
    "coalesced": {},
    "per-append": {"group_commit": False},
    "no-notify": {"notify": False},
    "spinning": {"spin_wait": 0.001},
}


@pytest.mark.parametrize("check", sorted(STORE_CHECKS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
async def test_conformance(check: str, variant: str, pg_dsn: str, schema: str) -> None:
    async def make() -> Store:
        return await PostgresStore.open(pg_dsn, schema=schema, **VARIANTS[variant])

    async def reopen(old: Store) -> Store:
        assert isinstance(old, PostgresStore)
        return await PostgresStore.open(pg_dsn, schema=old.schema)

    await run_store_check(check, make, reopen=reopen)


async def _xmins(dsn: str, schema: str, execution_ids: list[str]) -> set[str]:
    """The transactions that wrote these executions' events (rows of one transaction share it)."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            f'SELECT DISTINCT xmin::text FROM "{schema}".events WHERE execution_id = ANY(%s)',
            (execution_ids,),
        )
        return {r[0] for r in await cur.fetchall()}


async def _exec(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql, params)


# ---------------------------------------------------------------- schema and opening


async def test_constructor_is_cheap_and_opens_lazily(pg_dsn: str, schema: str) -> None:
    store = PostgresStore(pg_dsn, schema=schema)  # no I/O yet
    try:
        fence = await store.acquire_fence("lazy")
        await store.append([env("lazy", 0, fence)])
        assert await store.last_sequence("lazy") == 0
    finally:
        await store.close()
        await store.close()  # idempotent


async def test_bad_schema_name_is_a_configuration_error(pg_dsn: str) -> None:
    for bad in ["Loom", "a-b", 'x"; DROP', "", "x" * 64]:
        with pytest.raises(ConfigurationError):
            PostgresStore(pg_dsn, schema=bad)


async def test_unreachable_server_is_a_storage_error() -> None:
    with pytest.raises(StorageError, match="cannot open"):
        await PostgresStore.open("postgresql://postgres@127.0.0.1:1/none", connect_timeout=1)


async def test_concurrent_first_opens_create_the_schema_once(pg_dsn: str, schema: str) -> None:
    stores = await asyncio.gather(*(PostgresStore.open(pg_dsn, schema=schema) for _ in range(6)))
    try:
        fence = await stores[0].acquire_fence("shared")
        await stores[1].append([env("shared", 0, fence)])
        assert [await s.last_sequence("shared") for s in stores] == [0] * 6
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_newer_schema_version_is_refused(pg_dsn: str, schema: str) -> None:
    first = await PostgresStore.open(pg_dsn, schema=schema)
    await first.close()
    await _exec(
        pg_dsn,
        f"UPDATE \"{schema}\".meta SET value = %s WHERE key = 'schema_version'",
        (str(SCHEMA_VERSION + 1),),
    )
    with pytest.raises(SchemaVersionError, match=f"version {SCHEMA_VERSION + 1}"):
        await PostgresStore.open(pg_dsn, schema=schema)


async def test_drop_schema_removes_everything(pg_dsn: str, schema: str) -> None:
    store = await PostgresStore.open(pg_dsn, schema=schema)
    await store.close()
    await PostgresStore.drop_schema(pg_dsn, schema)
    await PostgresStore.drop_schema(pg_dsn, schema)  # idempotent
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        cur = await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        assert await cur.fetchone() is None


# ---------------------------------------------------------------- records


async def test_corrupt_record_is_refused_and_others_continue(
    store: PostgresStore, pg_dsn: str
) -> None:
    for execution_id in ("victim", "bystander"):
        fence = await store.acquire_fence(execution_id)
        await store.append([env(execution_id, 0, fence), env(execution_id, 1, fence)])
    await _exec(
        pg_dsn,
        f'UPDATE "{store.schema}".events SET payload = %s '
        "WHERE execution_id = 'victim' AND sequence = 1",
        ('{"position":1,"step_id":"s","output":2}',),
    )
    with pytest.raises(CorruptEventError) as info:
        await store.read("victim")
    assert info.value.execution_id == "victim"
    assert len(await store.read("bystander")) == 2
    await store.save_snapshot(Snapshot("victim", 1, {"n": 1}))
    await _exec(pg_dsn, f'UPDATE "{store.schema}".snapshots SET state = \'{{"n": 2}}\'')
    with pytest.raises(CorruptEventError):
        await store.load_snapshot("victim")


async def test_nul_characters_are_refused_before_anything_is_stored(store: PostgresStore) -> None:
    with pytest.raises(PayloadError):
        await store.acquire_fence("bad\x00id")
    fence = await store.acquire_fence("ok")
    with pytest.raises(PayloadError):
        await store.append([env("ok", 0, fence, envelope_id="e\x00")])
    with pytest.raises(PayloadError):
        await store.append([env("ok", 0, fence, payload={"s": "\ud800"})])
    # Text that is not the payload's JSON: an extension's event type, a parent id decoded from
    # the payload (its JSON escapes the NUL).
    with pytest.raises(PayloadError):
        await store.append([env("ok", 0, fence, type="ext.\x00", payload={})])
    with pytest.raises(PayloadError):
        await store.append([env("ok", 0, fence, type="ext.\ud800", payload={})])
    started = {"flow_id": "f", "flow_version": "1", "input": None, "parent_id": "p\x00"}
    with pytest.raises(PayloadError):
        await store.append([env("ok", 0, fence, EventType.EXECUTION_STARTED, started)])
    assert await store.read("bad\x00id") == []
    assert await store.last_sequence("bad\x00id") == -1
    assert await store.current_fence("bad\x00id") == 0
    await store.append([env("ok", 0, fence)])
    assert [i async for i in store.iterate_execution_ids(after="o\x00k")] == ["ok"]


async def test_enumeration_is_code_point_order(store: PostgresStore) -> None:
    ids = ["b", "B", "é", "a", "a-1", "a:1", "Z", "ä", "日本"]
    for execution_id in ids:
        fence = await store.acquire_fence(execution_id)
        await store.append([env(execution_id, 0, fence)])
    assert [i async for i in store.iterate_execution_ids(page_size=3)] == sorted(ids)


# ---------------------------------------------------------------- group commit


async def test_concurrent_appends_share_transactions(pg_dsn: str, schema: str) -> None:
    ids = [f"gc-{i:02d}" for i in range(40)]
    for group_commit, most in [(True, 4), (False, None)]:
        store = await PostgresStore.open(pg_dsn, schema=schema, group_commit=group_commit)
        try:
            keys = [f"{group_commit}-{i}" for i in ids]
            fences = await asyncio.gather(*(store.acquire_fence(k) for k in keys))
            await asyncio.gather(
                *(store.append([env(k, 0, f)]) for k, f in zip(keys, fences, strict=True))
            )
            xmins = await _xmins(pg_dsn, schema, keys)
            if most is None:
                assert len(xmins) == len(keys)  # one transaction per append
            else:
                assert len(xmins) <= most, xmins
        finally:
            await store.close()


async def test_a_raising_request_fails_alone_in_its_batch(store: PostgresStore) -> None:
    """A duplicate envelope id makes its statement raise: the batch is replayed with one
    savepoint per request, so only that caller is refused."""
    taken_fence = await store.acquire_fence("taken")
    await store.append([env("taken", 0, taken_fence, envelope_id="the-id")])
    good = [f"good-{i}" for i in range(8)]
    fences = await asyncio.gather(*(store.acquire_fence(i) for i in [*good, "dup"]))
    results = await asyncio.gather(
        store.append([env("dup", 0, fences[-1], envelope_id="the-id")]),
        *(store.append([env(i, 0, f)]) for i, f in zip(good, fences, strict=False)),
        return_exceptions=True,
    )
    assert isinstance(results[0], DuplicateEnvelopeIdError), results[0]
    assert results[0].execution_id == "dup"
    assert results[1:] == [None] * len(good)
    assert await store.last_sequence("dup") == -1
    for i in good:
        assert await store.last_sequence(i) == 0


async def test_a_failed_commit_fails_every_caller_and_writes_nothing(
    store: PostgresStore,
) -> None:
    ids = [f"doomed-{i}" for i in range(6)]
    fences = await asyncio.gather(*(store.acquire_fence(i) for i in ids))
    faults.arm("before_commit", faults.Raise())
    results = await asyncio.gather(
        *(store.append([env(i, 0, f)]) for i, f in zip(ids, fences, strict=True)),
        return_exceptions=True,
    )
    assert all(isinstance(r, StorageWriteError) for r in results), results
    assert len({id(r) for r in results}) == 1  # one error for the whole batch
    assert isinstance(results[0].__cause__, faults.InjectedFaultError)
    for i in ids:
        assert await store.read(i) == []
    await asyncio.gather(*(store.append([env(i, 0, f)]) for i, f in zip(ids, fences, strict=True)))


async def test_the_writer_connection_handed_back_after_a_failure_writes_again(
    pg_dsn: str, schema: str
) -> None:
    """A failed lone write hands the writer's connection back to the pool, its prepared
    statements still on the server; checked out again, it must not prepare under a name it
    already holds (one connection for the writer, one for reads: the same one comes back)."""
    store = await PostgresStore.open(pg_dsn, schema=schema, pool_min=1, pool_max=2)
    try:
        fence = await store.acquire_fence("back")
        for seq in (0, 1):
            await store.append([env("back", seq, fence)])
        held = store._writer._held
        faults.arm("before_commit", faults.Raise())
        with pytest.raises(StorageWriteError):
            await store.append([env("back", 2, fence)])
        assert store._writer._held is None  # handed back
        for seq in (2, 3):
            await store.append([env("back", seq, fence)])
        assert store._writer._held is held  # the same connection, checked out again
        assert await store.last_sequence("back") == 3
    finally:
        await store.close()


async def test_a_batch_failing_before_commit_leaves_no_transaction_open_for_the_next(
    pg_dsn: str, schema: str
) -> None:
    """A batch that fails inside its transaction (here just before COMMIT) must not leave that
    transaction open on the connection the writer keeps: the batch queued behind it commits
    only its own writes, and the failed ones never appear (another store looks)."""
    # One batch at a time, so the batch queued behind the failing one runs on its connection.
    store = await PostgresStore.open(pg_dsn, schema=schema, max_inflight_batches=1)
    other = await PostgresStore.open(pg_dsn, schema=schema)
    try:
        failing = [f"fail-{i}" for i in range(6)]
        behind = [f"next-{i}" for i in range(6)]
        fences = dict(
            zip(
                [*failing, *behind],
                await asyncio.gather(*(store.acquire_fence(i) for i in [*failing, *behind])),
                strict=True,
            )
        )
        queued: list[asyncio.Future[None]] = []

        def queue_then_fail(point: str) -> None:
            # Queued while the failing batch holds the writer's connection: they run next.
            queued.extend(
                asyncio.ensure_future(store.append([env(i, 0, fences[i])])) for i in behind
            )
            raise faults.InjectedFaultError(point)

        faults.arm("before_commit", queue_then_fail)
        results = await asyncio.gather(
            *(store.append([env(i, 0, fences[i])]) for i in failing), return_exceptions=True
        )
        assert all(isinstance(r, StorageWriteError) for r in results), results
        await asyncio.gather(*queued)
        for i in behind:
            assert await other.last_sequence(i) == 0
        for i in failing:
            assert await other.last_sequence(i) == -1
    finally:
        await store.close()
        await other.close()


async def test_connection_killed_before_commit_fails_the_batch_and_recovers(
    pg_dsn: str, schema: str
) -> None:
    tag = f"loom-kill-{schema}"
    store = await PostgresStore.open(tagged_dsn(pg_dsn, tag), schema=schema)
    try:
        ids = [f"cut-{i}" for i in range(5)]
        fences = await asyncio.gather(*(store.acquire_fence(i) for i in ids))
        killed: list[int] = []
        # Terminate the store's sessions while the batch's rows are written but not committed.
        faults.arm("before_commit", lambda point: killed.append(terminate(pg_dsn, tag)))
        results = await asyncio.gather(
            *(store.append([env(i, 0, f)]) for i, f in zip(ids, fences, strict=True)),
            return_exceptions=True,
        )
        assert killed and killed[0] >= 1
        assert all(isinstance(r, StorageWriteError) for r in results), results
        assert "nothing was written" in str(results[0])
        for i in ids:
            assert await store.last_sequence(i) == -1

        # The same process goes on: the pool replaces its dead connections.
        async def appended() -> bool:
            try:
                await asyncio.gather(
                    *(store.append([env(i, 0, f)]) for i, f in zip(ids, fences, strict=True))
                )
            except StorageError:
                return False
            return True

        await until(
            appended, "the appends to go through on fresh connections", timeout=20, every=0.05
        )
        for i in ids:
            assert await store.last_sequence(i) == 0
    finally:
        await store.close()


async def test_lost_ack_after_a_durable_commit_is_resolved_as_success(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """COMMIT reached the server but its answer was lost: the store checks, and acknowledges."""
    original = PostgresWriter._commit

    async def commit_then_lose(self: PostgresWriter, conn: Any, batch: Any) -> bool:
        await conn.execute("COMMIT")
        await conn.close()
        return await self._resolve(batch, psycopg.OperationalError("answer to COMMIT lost"))

    ids = [f"acked-{i}" for i in range(4)]
    fences = await asyncio.gather(*(store.acquire_fence(i) for i in ids))
    monkeypatch.setattr(PostgresWriter, "_commit", commit_then_lose)
    await asyncio.gather(*(store.append([env(i, 0, f)]) for i, f in zip(ids, fences, strict=True)))
    monkeypatch.setattr(PostgresWriter, "_commit", original)
    for i in ids:
        assert await store.last_sequence(i) == 0


async def test_lost_commit_is_resolved_as_nothing_written(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def rollback_then_lose(self: PostgresWriter, conn: Any, batch: Any) -> bool:
        await conn.execute("ROLLBACK")
        await conn.close()
        return await self._resolve(batch, psycopg.OperationalError("connection lost"))

    ids = [f"lost-{i}" for i in range(4)]
    fences = await asyncio.gather(*(store.acquire_fence(i) for i in ids))
    monkeypatch.setattr(PostgresWriter, "_commit", rollback_then_lose)
    results = await asyncio.gather(
        *(store.append([env(i, 0, f)]) for i, f in zip(ids, fences, strict=True)),
        return_exceptions=True,
    )
    monkeypatch.undo()
    assert all(isinstance(r, StorageWriteError) for r in results), results
    assert "nothing was written" in str(results[0])
    for i in ids:
        assert await store.last_sequence(i) == -1


async def test_a_lost_commit_is_checked_against_the_whole_batch(
    store: PostgresStore, pg_dsn: str, schema: str
) -> None:
    """A take-over whose COMMIT's answer is lost, while a racer took over from the same fence
    with a batch that starts with the very same record (same fence, content and time) and ends
    differently: the records stored are the racer's, so ours must be reported not written.
    A probe of the first record alone would acknowledge a write that never happened."""
    fence = await store.acquire_fence("race")
    await store.append([env("race", 0, fence)])

    def record(seq: int, output: str) -> Envelope:
        payload = {"position": seq, "step_id": "s", "output": output}
        return Envelope.create(
            "race", seq, EventType.STEP_COMPLETED, payload, fence=fence + 1, recorded_at=1.0
        )

    ours = [record(1, "same"), record(2, "ours")]
    theirs = [record(1, "same"), record(2, "theirs")]
    assert ours[0].checksum() == theirs[0].checksum()
    racer = await PostgresStore.open(pg_dsn, schema=schema)  # another process's store
    writer = store._writer

    async def racer_commits_then_ours_is_lost(conn: Any, req: Any, *_: Any) -> bool:
        await racer.take_over(theirs, from_fence=fence)
        return await writer._resolve([req], psycopg.OperationalError("connection lost"))

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(writer, "_run_single", racer_commits_then_ours_is_lost)
            with pytest.raises(StorageWriteError, match="nothing was written"):
                await store.take_over(ours, from_fence=fence)
    finally:
        await racer.close()
    stored = await store.read("race", from_sequence=1)
    assert [e.payload["output"] for e in stored] == ["same", "theirs"]


async def test_a_lone_write_whose_answer_is_lost_is_recognised_though_records_follow_it(
    store: PostgresStore, pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone write (the lean path) commits, then its connection dies before the answer is
    read; meanwhile a new holder took over and wrote after it. The probe finds our record
    where we wrote it and acknowledges the write: records beyond our batch are not ours to
    compare (counting them in would report a durable write as never made)."""
    fence = await store.acquire_fence("landed")
    await store.append([env("landed", 0, fence)])
    await store.append([env("landed", 1, fence)])  # the lean path's statement is prepared
    racer = await PostgresStore.open(pg_dsn, schema=schema)  # another process's store
    answer = _postgres_lean.LeanStatements._answer

    async def commit_then_lose(self: Any, expected: Any, loop: Any = None) -> Any:
        result = await answer(self, expected, loop)
        if self.conn is not store._writer._held or expected != pq.ExecStatus.TUPLES_OK:
            return result  # the racer's own writes, or a statement being prepared
        taker = await racer.acquire_fence("landed")
        await racer.append([env("landed", 3, taker)])
        await self.conn.close()
        raise psycopg.OperationalError("the answer was lost")

    try:
        monkeypatch.setattr(_postgres_lean.LeanStatements, "_answer", commit_then_lose)
        await store.append([env("landed", 2, fence)])  # acknowledged: it is durable
        monkeypatch.undo()
    finally:
        await racer.close()
    assert [e.fence for e in await store.read("landed")] == [fence] * 3 + [fence + 1]


async def _waiting(store: PostgresStore, ids: list[str]) -> list[int]:
    """Executions with one record each, under their first fence; the fences."""
    fences = await asyncio.gather(*(store.acquire_fence(i) for i in ids))
    await asyncio.gather(*(store.append([env(i, 0, f)]) for i, f in zip(ids, fences, strict=True)))
    return list(fences)


def _take_overs(ids: list[str], fences: list[int]) -> list[tuple[list[Envelope], int]]:
    """A take-over of each (the first one's from a fence it does not hold: refused), one of
    them ending its execution (so the batch writes an index row too)."""
    requests: list[tuple[list[Envelope], int]] = []
    for k, (i, f) in enumerate(zip(ids, fences, strict=True)):
        seen = f + 1 if k == 0 else f
        records = [env(i, 1, seen + 1)]
        if k == 1:
            records.append(env(i, 2, seen + 1, EventType.EXECUTION_COMPLETED, {"output": 1}))
        requests.append((records, seen))
    return requests


def _losing_take_over_many(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch, *, ran: bool
) -> None:
    """The connection of the take_over_many statement dies before its answer is read: after
    the server ran it (autocommit: committed), or before it got there (nothing written)."""
    execute = psycopg.AsyncCursor.execute

    async def lose(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        if query != store._sql.take_over_many:
            return await execute(self, query, params, **kw)
        if ran:
            await execute(self, query, params, **kw)
        await self.connection.close()
        raise psycopg.OperationalError("the answer was lost")

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", lose)


async def test_a_take_over_many_whose_answer_is_lost_after_it_committed_is_acknowledged(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for a lone append: the store probes for the records of each take-over and reports
    the ones it finds written (the refused one refused), instead of "outcome unknown"."""
    ids = [f"many-acked-{i}" for i in range(4)]
    fences = await _waiting(store, ids)
    _losing_take_over_many(store, monkeypatch, ran=True)
    outcomes = await store.take_over_many(_take_overs(ids, fences))
    monkeypatch.undo()
    assert isinstance(outcomes[0], StaleFenceError), outcomes
    assert outcomes[1:] == [None, None, None]
    assert [await store.last_sequence(i) for i in ids] == [0, 2, 1, 1]
    assert [await store.current_fence(i) for i in ids] == [
        f + int(k > 0) for k, f in enumerate(fences)
    ]


async def test_a_take_over_many_lost_before_it_ran_is_reported_as_not_written(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [f"many-lost-{i}" for i in range(3)]
    fences = await _waiting(store, ids)
    _losing_take_over_many(store, monkeypatch, ran=False)
    with pytest.raises(StorageWriteError, match="nothing was written"):
        await store.take_over_many(_take_overs(ids, fences))
    monkeypatch.undo()
    assert [await store.last_sequence(i) for i in ids] == [0, 0, 0]
    # Nothing was written: the same take-overs go through now.
    outcomes = await store.take_over_many(_take_overs(ids, fences))
    assert outcomes[1:] == [None, None]


async def test_a_coalesced_take_over_many_whose_commit_answer_is_lost_is_acknowledged(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take_over_many in one transaction with a write that proves nothing (a timer): its
    heads that moved are probed, so the batch is acknowledged, not left unknown."""
    ids = [f"many-batch-{i}" for i in range(3)]
    fences = await _waiting(store, ids)

    async def commit_then_lose(self: PostgresWriter, conn: Any, batch: Any) -> bool:
        assert {r.kind for r in batch} == {"take_over_many", "timer"}, batch
        await conn.execute("COMMIT")
        await conn.close()
        return await self._resolve(batch, psycopg.OperationalError("answer to COMMIT lost"))

    monkeypatch.setattr(PostgresWriter, "_commit", commit_then_lose)
    outcomes, _ = await asyncio.gather(
        store.take_over_many(_take_overs(ids, fences)),
        store.schedule_timer(Timer(ids[2], 5, 1.0, "sleep", "f")),
    )
    monkeypatch.undo()
    assert isinstance(outcomes[0], StaleFenceError), outcomes
    assert outcomes[1:] == [None, None]
    assert [await store.last_sequence(i) for i in ids] == [0, 2, 1]
    assert await store.next_timer_due() == 1.0


async def test_a_lost_take_over_many_is_not_mistaken_for_a_racers_records(
    store: PostgresStore, pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our take_over_many is lost before it ran, while a racer took the same executions over
    from the same fences: its records sit at our sequences under our new fences, and derived
    ids are stored empty, so only the checksums tell them apart. Ours must be reported not
    written (acknowledging it would claim take-overs that never happened)."""
    ids = [f"many-race-{i}" for i in range(2)]
    fences = await _waiting(store, ids)

    def take_overs(output: str) -> list[tuple[list[Envelope], int]]:
        return [
            ([env(i, 1, f + 1, payload={"position": 1, "step_id": "s", "output": output})], f)
            for i, f in zip(ids, fences, strict=True)
        ]

    racer = await PostgresStore.open(pg_dsn, schema=schema)  # another process's store
    execute = psycopg.AsyncCursor.execute

    async def racer_first(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        if query != store._sql.take_over_many or self.connection is not store._writer._held:
            return await execute(self, query, params, **kw)
        for (records, seen), _ in zip(take_overs("theirs"), ids, strict=True):
            await racer.take_over(records, from_fence=seen)
        await self.connection.close()
        raise psycopg.OperationalError("the answer was lost")

    try:
        monkeypatch.setattr(psycopg.AsyncCursor, "execute", racer_first)
        with pytest.raises(StorageWriteError, match="nothing was written"):
            await store.take_over_many(take_overs("ours"))
        monkeypatch.undo()
    finally:
        await racer.close()
    for i in ids:
        assert [e.payload.get("output") for e in await store.read(i, from_sequence=1)] == ["theirs"]


async def test_a_lost_take_over_many_is_probed_only_once_its_transaction_is_gone(
    store: PostgresStore, pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session that ran our take_over_many died with its transaction still open (the
    server has not noticed yet): the probe must wait for that transaction (a share lock on the
    heads it holds) before looking, or it reports "nothing was written" for a write that then
    commits."""
    ids = [f"many-open-{i}" for i in range(2)]
    fences = await _waiting(store, ids)
    execute = psycopg.AsyncCursor.execute
    open_tx = await psycopg.AsyncConnection.connect(pg_dsn)  # the "dead" session's transaction

    async def ran_uncommitted(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        if query != store._sql.take_over_many or self.connection is open_tx:
            return await execute(self, query, params, **kw)
        await open_tx.execute(query, params)  # BEGIN (not autocommit), left open
        await self.connection.close()
        raise psycopg.OperationalError("the answer was lost")

    async def probe_waits() -> bool:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%%FOR SHARE%%' AND position(%s in query) > 0",
                (schema,),
            )
            row = await cur.fetchone()
        return row is not None and row[0] > 0

    async def commit_once_the_probe_waits() -> None:
        await until(probe_waits, "the probe waiting for the open transaction")
        await open_tx.commit()

    try:
        monkeypatch.setattr(psycopg.AsyncCursor, "execute", ran_uncommitted)
        requests = [([env(i, 1, f + 1)], f) for i, f in zip(ids, fences, strict=True)]
        outcomes, _ = await asyncio.gather(
            store.take_over_many(requests), commit_once_the_probe_waits()
        )
        monkeypatch.undo()
    finally:
        await open_tx.close()
    assert outcomes == [None, None]
    assert [await store.current_fence(i) for i in ids] == [f + 1 for f in fences]


@pytest.mark.parametrize("spin_wait", [0.0, 0.002])
async def test_a_lone_write_held_up_by_a_lock_leaves_the_event_loop_running(
    pg_dsn: str, schema: str, spin_wait: float
) -> None:
    """A lone write waits for its answer without yielding the loop only briefly
    (``LONE_WAIT``, which a ``spin_wait`` spends first): one held up by another session's row
    lock yields, so the task that will release that lock still runs (if the wait were
    unbounded, this would never finish)."""
    async with await PostgresStore.open(pg_dsn, schema=schema, spin_wait=spin_wait) as store:
        await _held_up(store, pg_dsn, schema)


async def _held_up(store: PostgresStore, pg_dsn: str, schema: str) -> None:
    fence = await store.acquire_fence("held-up")
    await store.append([env("held-up", 0, fence)])
    await store.append([env("held-up", 1, fence)])  # the plain step's statement is prepared
    async with await psycopg.AsyncConnection.connect(pg_dsn) as blocker:
        await blocker.execute(
            f'SELECT 1 FROM "{schema}".heads WHERE execution_id = %s FOR UPDATE', ("held-up",)
        )
        loop = asyncio.get_running_loop()
        # Nothing else is ready when the write starts: it takes the blocking wait first.
        write = loop.create_task(store.append([env("held-up", 2, fence)]))
        await asyncio.sleep(0.2)  # runs only if the write yields the loop
        assert not write.done()
        await blocker.rollback()
        await asyncio.wait_for(write, 10)
    assert await store.last_sequence("held-up") == 2


async def test_lone_writes_awaited_on_the_loop_alone(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no blocking wait at all, every answer is awaited on the loop (the path a lone
    write takes when something else is ready, or its answer is slow)."""
    monkeypatch.setattr(_postgres_lean, "LONE_WAIT", 0.0)
    fence = await store.acquire_fence("loop-only")
    for seq in range(5):
        await store.append([env("loop-only", seq, fence)])
    assert await store.last_sequence("loop-only") == 4
    await store.acquire_fence("loop-only")  # a newer holder: this one's next write is refused
    with pytest.raises(StaleFenceError):
        await store.append([env("loop-only", 5, fence)])


async def test_a_lone_write_with_a_nul_in_text_is_refused_not_cut_short(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq sends a text parameter only up to its first NUL, so a lone write would store a
    shortened event type (its record then fails its checksum forever). Even past the store's
    own checks (switched off here), the write is refused with a typed error and nothing is
    stored; the execution stays readable and writable."""
    monkeypatch.setattr(postgres_module, "_storable", lambda value, what: None)
    fence = await store.acquire_fence("nul")
    await store.append([env("nul", 0, fence)])
    with pytest.raises(StorageError, match="NUL"):
        await store.append([env("nul", 1, fence, type="custom\x00tail", payload={})])
    assert [e.sequence for e in await store.read("nul")] == [0]
    await store.append([env("nul", 1, fence)])
    assert [e.sequence for e in await store.read("nul")] == [0, 1]


def test_lean_values_leave_text_with_a_nul_to_psycopg() -> None:
    """Text holding a NUL is not encoded by hand (psycopg refuses it); other text is."""
    sql = "SELECT %s, %s"
    assert _postgres_lean.lean_values(sql, ("a\x00b", 1)) is None
    encoded = _postgres_lean.lean_values(sql, ("a\u00e9b", 2**63 - 1))
    assert encoded is not None and encoded[1] == ["a\u00e9b".encode(), b"9223372036854775807"]
    # Several text values (named), the NUL in any one of them.
    named = "SELECT %(x)s, %(n)s, %(y)s"
    assert _postgres_lean.lean_values(named, {"x": "a", "n": 1, "y": "b\x00"}) is None
    assert _postgres_lean.lean_values(named, {"x": "a\x00", "n": 1, "y": "b"}) is None
    encoded = _postgres_lean.lean_values(named, {"x": "a", "n": 1, "y": "b", "unused": 2})
    assert encoded is not None and encoded[1] == [b"a", b"1", b"b"]


async def test_a_lone_write_stores_its_time_exactly(store: PostgresStore) -> None:
    """The lean path sends a float in binary: every time reads back bit for bit (a wrong byte
    order or width would fail the record's checksum on reading, or store another time)."""
    times = [0.1 + 0.2, 1796168119.6986017, 5e-324, -0.0, 2.0**60 + 0.5]
    fence = await store.acquire_fence("t")
    for sequence, at in enumerate(times):
        e = Envelope.create(
            "t",
            sequence,
            EventType.EXECUTION_STARTED if sequence == 0 else EventType.STEP_STARTED,
            {"flow_id": "f", "flow_version": "1", "input": None}
            if sequence == 0
            else {"position": sequence, "step_id": "s", "attempt": 1},
            fence=fence,
            recorded_at=at,
        )
        await store.append([e])
    read = [e.recorded_at for e in await store.read("t")]
    assert [repr(t) for t in read] == [repr(t) for t in times]
    encoded = _postgres_lean.lean_values("SELECT %s", (2.5,))
    assert encoded is not None and encoded[1] == [b"\x40\x04\x00\x00\x00\x00\x00\x00"]


# ---------------------------------------------------------------- LISTEN / NOTIFY


async def test_wait_for_append_is_woken_by_another_process_store(pg_dsn: str, schema: str) -> None:
    """Two stores share nothing but the database: the waiter is woken by NOTIFY (its safety
    poll is set far beyond the test's deadline)."""
    writer = await PostgresStore.open(pg_dsn, schema=schema)
    waiter = await PostgresStore.open(pg_dsn, schema=schema, safety_poll_interval=3600)
    try:
        fence = await writer.acquire_fence("far")
        await writer.append([env("far", 0, fence)])
        waiting = asyncio.ensure_future(waiter.wait_for_append("far", 0, timeout=30))
        await until(lambda: waiter._listening.is_set() and "far" in waiter._waiting, "listening")
        await writer.append([env("far", 1, fence)])
        assert await asyncio.wait_for(waiting, 10) == 1
    finally:
        await writer.close()
        await waiter.close()


async def test_listener_reconnects_after_its_session_is_terminated(
    pg_dsn: str, schema: str
) -> None:
    tag = f"loom-listen-{schema}"
    writer = await PostgresStore.open(pg_dsn, schema=schema)
    waiter = await PostgresStore.open(
        tagged_dsn(pg_dsn, tag), schema=schema, safety_poll_interval=3600
    )
    try:
        fence = await writer.acquire_fence("re")
        await writer.append([env("re", 0, fence)])
        assert await waiter.wait_for_append("re", 0, timeout=0.01) == 0  # starts the listener
        assert terminate(pg_dsn, tag) >= 1
        waiting = asyncio.ensure_future(waiter.wait_for_append("re", 0, timeout=30))
        await until(lambda: waiter._listening.is_set() and "re" in waiter._waiting, "listening")
        await writer.append([env("re", 1, fence)])
        assert await asyncio.wait_for(waiting, 10) == 1
    finally:
        await writer.close()
        await waiter.close()


async def test_reads_survive_terminated_pool_connections(pg_dsn: str, schema: str) -> None:
    tag = f"loom-reads-{schema}"
    store = await PostgresStore.open(tagged_dsn(pg_dsn, tag), schema=schema, pool_min=2)
    try:
        fence = await store.acquire_fence("r")
        await store.append([env("r", 0, fence)])
        assert terminate(pg_dsn, tag) >= 1
        assert [e.sequence for e in await store.read("r")] == [0]  # retried on a fresh one
    finally:
        await store.close()


async def test_a_held_connection_terminated_while_idle_is_replaced_with_the_pools(
    pg_dsn: str, schema: str
) -> None:
    """The writer's held connection is checked with the pool's once a read finds the
    sessions gone, so the next write does not fail on it (the pool check takes it back)."""
    tag = f"loom-held-{schema}"
    store = await PostgresStore.open(tagged_dsn(pg_dsn, tag), schema=schema, pool_min=2)
    try:
        fence = await store.acquire_fence("h")
        await store.append([env("h", 0, fence)])
        assert store._writer._held is not None
        assert terminate(pg_dsn, tag) >= 2  # the held connection and an idle pooled one
        assert [e.sequence for e in await store.read("h")] == [0]  # retried after a check
        await store.append([env("h", 1, fence)])
        assert await store.last_sequence("h") == 1
    finally:
        await store.close()


async def test_writes_go_through_after_their_prepared_statements_vanished(
    store: PostgresStore,
) -> None:
    """A pooler's DISCARD ALL or DEALLOCATE ALL drops the server's prepared statements behind
    the writer's back: a write that finds them gone prepares them again and runs (it never
    ran), on the lone-write path (a plain step) and on psycopg's (a statement with arrays)."""
    fence = await store.acquire_fence("prep")
    for seq in (0, 1):  # a start, then a plain step's statement, prepared on first use
        await store.append([env("prep", seq, fence)])
    data = [b"one", b"two"]
    await store.put_blobs({blob_hash(data[0]): data[0]})
    held = store._writer._held
    assert held is not None
    for n, sql in enumerate((b"DEALLOCATE ALL", b"DISCARD ALL")):
        held.pgconn.exec_(sql)  # neither psycopg nor the writer sees it
        await store.append([env("prep", 2 + n, fence)])
        await store.put_blobs({blob_hash(data[n]): data[n]})
        assert store._writer._held is held  # recovered in place, not by a new connection
    assert await store.last_sequence("prep") == 3
    assert set(await store.get_blobs([blob_hash(d) for d in data])) == {blob_hash(d) for d in data}


async def test_reads_go_through_after_their_prepared_statements_vanished(
    pg_dsn: str, schema: str
) -> None:
    """The same for reads: psycopg prepares a read after a few uses, and a DISCARD ALL behind
    its back must not fail every read of that statement on that connection from then on."""
    # Two connections: the writer holds one, so every read runs on the other.
    store = await PostgresStore.open(pg_dsn, schema=schema, pool_min=1, pool_max=2)
    try:
        fence = await store.acquire_fence("rp")
        await store.append([env("rp", 0, fence)])
        for _ in range(8):  # past psycopg's prepare threshold (5 uses)
            assert [e.sequence for e in await store.read("rp")] == [0]
            assert await store.last_sequence("rp") == 0
        pool = store._pool
        assert pool is not None
        async with pool.connection() as conn:
            conn.pgconn.exec_(b"DISCARD ALL")  # psycopg does not see it: its cache still names them
        for _ in range(3):
            assert [e.sequence for e in await store.read("rp")] == [0]
            assert await store.last_sequence("rp") == 0
    finally:
        await store.close()


async def test_bound_to_its_event_loop(pg_dsn: str, schema: str) -> None:
    store = await PostgresStore.open(pg_dsn, schema=schema)
    try:
        await asyncio.to_thread(_expect_other_loop_refused, store)
    finally:
        await store.close()


def _expect_other_loop_refused(store: PostgresStore) -> None:
    with pytest.raises(ConfigurationError, match="event loop"):
        asyncio.run(store.last_sequence("x"))
    # A write too, though its path skips the open check once the pool is open.
    with pytest.raises(ConfigurationError, match="event loop"):
        asyncio.run(store.acquire_fence("x"))


async def test_a_take_over_many_stores_each_record_time_exactly(store: PostgresStore) -> None:
    """take_over_many sends its rows as JSON texts: every time must come back the same float
    (the checksum covers its repr), however many digits or whatever exponent it has."""
    times = [1796171337.3432002, 0.1 + 0.2, 5e-324, 1.7976931348623157e308, 1e-7, 123456789.0]
    ids = [f"many-time-{k}" for k in range(len(times))]
    fences = await _waiting(store, ids)
    requests = [
        (
            [
                Envelope.create(
                    i, 1, EventType.STEP_COMPLETED, {"output": k}, fence=f + 1, recorded_at=at
                )
            ],
            f,
        )
        for k, (i, f, at) in enumerate(zip(ids, fences, times, strict=True))
    ]
    assert await store.take_over_many(requests) == [None] * len(ids)
    for i, at in zip(ids, times, strict=True):
        stored = (await store.read(i, from_sequence=1))[0]
        assert stored.recorded_at == at, (i, stored.recorded_at, at)


async def test_a_lost_lone_write_is_probed_only_once_its_transaction_is_gone(
    store: PostgresStore, pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for take_over_many: the session that ran our append died with its transaction still
    open, so the probe waits for it (a share lock on the head) before looking; looking at once
    would report "nothing was written" for a write that then commits."""
    fence = await store.acquire_fence("open-one")
    await store.append([env("open-one", 0, fence)])
    writer = store._writer
    open_tx = await psycopg.AsyncConnection.connect(pg_dsn)  # the "dead" session's transaction

    async def ran_uncommitted(conn: Any, req: Any, *_: Any) -> bool:
        await open_tx.execute(req.sql, req.params)  # BEGIN (not autocommit), left open
        return await writer._resolve([req], psycopg.OperationalError("the answer was lost"))

    async def probe_waits() -> bool:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%%FOR SHARE%%' AND position(%s in query) > 0",
                (schema,),
            )
            row = await cur.fetchone()
        return row is not None and row[0] > 0

    async def commit_once_the_probe_waits() -> None:
        await until(probe_waits, "the probe waiting for the open transaction")
        await open_tx.commit()

    try:
        monkeypatch.setattr(writer, "_run_single", ran_uncommitted)
        await asyncio.gather(
            store.append([env("open-one", 1, fence)]), commit_once_the_probe_waits()
        )
        monkeypatch.undo()
    finally:
        await open_tx.close()
    assert await store.last_sequence("open-one") == 1


async def test_a_batch_interrupted_mid_write_reports_its_outcome_unknown(
    pg_dsn: str, store: PostgresStore
) -> None:
    """A batch task cancelled while its writes wait on the server (at shutdown, say) cannot
    tell whether they will commit: a lone write is one autocommit statement, which the server
    runs to its end after the connection is closed. Its callers must not be told that nothing
    was written."""
    ids = [f"cut-short-{i}" for i in range(4)]
    fences = await asyncio.gather(*(store.acquire_fence(i) for i in ids))
    await asyncio.gather(*(store.append([env(i, 0, f)]) for i, f in zip(ids, fences, strict=True)))
    blocker = await psycopg.AsyncConnection.connect(pg_dsn)
    try:
        await blocker.execute(
            f'SELECT 1 FROM "{store.schema}".heads WHERE execution_id = %s FOR UPDATE', (ids[2],)
        )
        calls = [
            asyncio.ensure_future(store.append([env(i, 1, f)]))
            for i, f in zip(ids, fences, strict=True)
        ]

        async def waiting_on_the_lock() -> bool:
            return bool(store._writer.engine._tasks)

        await until(waiting_on_the_lock, "the batch task to be writing", timeout=10, every=0.01)
        for task in list(store._writer.engine._tasks):
            task.cancel()
        results = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        await blocker.rollback()
        await blocker.close()
    interrupted = [r for r in results if isinstance(r, StorageWriteError)]
    assert interrupted, results
    for error in interrupted:
        assert "interrupted" in str(error)
        assert error.outcome is WriteOutcome.UNKNOWN, error


def _lose_the_first_answer(
    monkeypatch: pytest.MonkeyPatch, first: Callable[[], Awaitable[None]] | None = None
) -> asyncio.Event:
    """The first lean write that waits on the loop for its answer loses its connection there
    (after ``first``, if given), on the client's side: the server goes on with the statement.
    The event is set when that happened."""
    lost = asyncio.Event()
    real_ready = _postgres_lean.LeanStatements._ready

    async def ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool = False) -> None:
        if lost.is_set() or write:
            return await real_ready(loop, fd, write=write)
        lost.set()
        if first is not None:
            await first()
        raise psycopg.OperationalError("the connection was lost (injected, client side)")

    monkeypatch.setattr(_postgres_lean.LeanStatements, "_ready", staticmethod(ready))
    return lost


async def test_a_write_lost_on_the_clients_side_is_checked_once_its_backend_is_gone(
    pg_dsn: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection is lost on the client's side (a closed socket, a cut network) while the
    server still runs the statement, waiting for the change cursor's lock before it has
    touched any row: a check made now would find nothing, and the write would commit after
    its caller was told that nothing was written. The check waits until that backend is gone."""
    fence = await store.acquire_fence("solo")
    blocker = await psycopg.AsyncConnection.connect(pg_dsn)
    await blocker.execute("SELECT pg_advisory_xact_lock(%s)", (store._cursor_lock,))
    waiting = asyncio.Event()
    real_gone = _postgres_commit._gone

    async def gone(conn: Any, backend: int, deadline: float) -> bool:
        waiting.set()
        return await real_gone(conn, backend, deadline)

    lost = _lose_the_first_answer(monkeypatch)
    monkeypatch.setattr(_postgres_commit, "_gone", gone)
    write = asyncio.ensure_future(store.append([env("solo", 0, fence)]))
    try:
        await lost.wait()
        # The check either waits for the backend (then the lock is let go, and the backend
        # commits and exits), or has already answered: either way the lock goes after it.
        await asyncio.wait(
            [write, asyncio.ensure_future(waiting.wait())], return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        await blocker.rollback()
        await blocker.close()
    result = await asyncio.gather(write, return_exceptions=True)
    monkeypatch.undo()

    async def settled() -> bool:  # the lost backend has run the statement to its end
        return await store.last_sequence("solo") == 0 or result[0] is not None

    await until(settled, "the lost backend to finish", timeout=10, every=0.02)
    assert result == [None], result  # acknowledged: it committed
    assert await store.last_sequence("solo") == 0


async def test_a_lost_write_found_stored_is_acknowledged_while_its_backend_still_runs(
    pg_dsn: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found stored whole, a write is committed, whatever its lost backend does next (behind a
    cut network it may linger until the server notices): only a write not found is waited
    for. Here the backend is made to look as if it never went."""
    fence = await store.acquire_fence("kept")
    warm = await store.acquire_fence("warm")
    await store.append([env("warm", 0, warm)])  # the statement is prepared: only it is sent
    looked: list[int] = []
    watcher = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)

    async def stored() -> bool:
        cur = await watcher.execute(
            f'SELECT count(*) FROM "{store.schema}".events WHERE execution_id = %s', ("kept",)
        )
        row = await cur.fetchone()
        return row is not None and row[0] == 1

    async def committed() -> None:  # the answer is lost after the commit
        await until(stored, "the write to commit", timeout=10, every=0.01)

    async def never_gone(conn: Any, backend: int, deadline: float) -> bool:
        looked.append(backend)
        return False

    lost = _lose_the_first_answer(monkeypatch, committed)
    monkeypatch.setattr(_postgres_lean, "LONE_WAIT", 0.0)  # the answer is awaited on the loop
    monkeypatch.setattr(_postgres_commit, "_gone", never_gone)
    try:
        await store.append([env("kept", 0, fence)])  # acknowledged, not "outcome unknown"
    finally:
        monkeypatch.undo()
        await watcher.close()
    assert lost.is_set()
    assert looked == []  # found at once: its backend was not waited for
    assert await store.last_sequence("kept") == 0


@pytest.mark.postgres
async def test_an_error_saying_the_server_ended_the_session_counts_as_a_lost_connection(
    pg_dsn: str,
) -> None:
    """The server ends a session (an operator's pg_terminate_backend, a shutdown) with a FATAL
    error that libpq can report before it has read the end of the stream: the connection still
    looks usable. Seen under chaos_store's terminations, a batch in psycopg's pipeline then got
    AdminShutdown while leaving the pipeline, was rolled back in place on the dead connection,
    and went back to the pool mid-answer. Such an error (or one raised while handling it)
    makes the connection lost, as a closed socket does; a statement's own error does not."""
    conn = await psycopg.AsyncConnection.connect(pg_dsn)
    try:
        assert not _postgres_commit._lost(conn)
        assert not _postgres_commit._lost(conn, psycopg.errors.UniqueViolation("duplicate"))
        assert not _postgres_commit._lost(conn, psycopg.errors.QueryCanceled("timeout"))
        for ended in (
            psycopg.errors.AdminShutdown("terminating connection"),
            psycopg.errors.CrashShutdown("another server process exited abnormally"),
            psycopg.errors.IdleSessionTimeout("idle-session timeout"),
            psycopg.errors.ConnectionFailure("connection failure"),
        ):
            assert _postgres_commit._lost(conn, ended), ended
        try:
            try:
                raise psycopg.errors.AdminShutdown("terminating connection")
            except psycopg.Error:
                raise psycopg.OperationalError("cannot exit pipeline mode while busy")  # noqa: B904
        except psycopg.Error as leaving:
            assert _postgres_commit._lost(conn, leaving)
        # A statement's own error raised while the caller handles a session error of another
        # connection carries that one as its context: it says nothing of this connection.
        try:
            try:
                raise psycopg.errors.AdminShutdown("another connection's session ended")
            except psycopg.Error:
                raise psycopg.errors.UniqueViolation("duplicate")  # noqa: B904
        except psycopg.Error as own:
            assert not _postgres_commit._lost(conn, own)
        assert not conn.broken  # the connection itself never looked lost
    finally:
        await conn.close()
