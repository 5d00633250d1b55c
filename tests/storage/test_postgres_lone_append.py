"""PostgreSQL's lone plain append (``PostgresWriter.append_alone``): a step's record written on
the held connection when nothing else is being written, without a request or a batch, and with
every outcome the general path has: writers arriving meanwhile queue behind it and share the
next commit, a refusal is raised and writes nothing, a cancel reaches the caller as a cancel
and leaves the store usable."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from loom.errors import StaleFenceError
from loom.storage import _batching, _postgres_lean
from loom.storage.postgres import PostgresStore
from loom.testing._store_conformance import env
from tests.support.poll import until

pytestmark = pytest.mark.postgres


class _Requests:
    """Counts the write requests a store builds for plain records (the general path's)."""

    def __init__(self, store: PostgresStore) -> None:
        self.built = 0
        real = store._plain_append

        def plain_append(*args: Any) -> Any:
            self.built += 1
            return real(*args)

        store._plain_append = plain_append  # type: ignore[method-assign]


async def _started(store: PostgresStore, eid: str) -> int:
    fence = await store.acquire_fence(eid)
    await store.append([env(eid, 0, fence)])
    return fence


async def test_an_idle_store_writes_a_plain_record_without_a_request(pg_store: Any) -> None:
    store: PostgresStore = pg_store
    fence = await _started(store, "a")
    requests = _Requests(store)
    for seq in range(1, 6):
        await store.append([env("a", seq, fence)])
    assert requests.built == 0
    assert [e.sequence for e in await store.read("a")] == list(range(6))


async def test_writers_arriving_meanwhile_queue_behind_it_and_share_a_commit(
    pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One batch in flight at a time: the lone write counts as that batch.
    store = await PostgresStore.open(pg_dsn, schema=schema, max_inflight_batches=1)
    batches: list[int] = []
    run_batch = store._writer._run_batch

    async def counted(batch: list[Any]) -> None:
        batches.append(len(batch))
        await run_batch(batch)

    store._writer.engine._run_batch = counted
    fences = {e: await _started(store, e) for e in ("a", "b", "c")}
    await store.append([env("a", 1, fences["a"])])  # the held connection and its statement
    answer = _postgres_lean.LeanStatements._answer
    sent, go_on = asyncio.Event(), asyncio.Event()

    async def held_back(self: Any, expected: Any, loop: Any = None) -> Any:
        if not go_on.is_set():
            sent.set()
            await go_on.wait()  # the statement is sent; its answer is read after the others queue
        return await answer(self, expected, loop)

    monkeypatch.setattr(_postgres_lean.LeanStatements, "_answer", held_back)
    # The pool's own start-up callbacks must not make the lone write look accompanied.
    monkeypatch.setattr(_batching, "_others_ready", lambda loop=None: False)
    requests = _Requests(store)
    batches.clear()
    lone = asyncio.ensure_future(store.append([env("a", 2, fences["a"])]))
    await asyncio.wait_for(sent.wait(), 10)
    others = [asyncio.ensure_future(store.append([env(e, 1, fences[e])])) for e in ("b", "c")]
    engine = store._writer.engine
    await until(lambda: len(engine._pending) == 2, "the other writers to queue behind it")
    assert requests.built == 2 and not lone.done()
    go_on.set()
    await asyncio.wait_for(asyncio.gather(lone, *others), 20)
    assert requests.built == 2  # the lone write built none
    assert batches == [2]  # the two that queued behind it, in one commit
    for e, last in (("a", 2), ("b", 1), ("c", 1)):
        assert [x.sequence for x in await store.read(e)] == list(range(last + 1))
    await store.close()


async def test_a_refused_plain_record_is_raised_and_writes_nothing(pg_store: Any) -> None:
    store: PostgresStore = pg_store
    fence = await _started(store, "f")
    await store.append([env("f", 1, fence)])
    taker = await store.acquire_fence("f")  # another holder took the execution over
    assert taker > fence
    with pytest.raises(StaleFenceError):
        await store.append([env("f", 2, fence)])
    assert [e.sequence for e in await store.read("f")] == [0, 1]
    await store.append([env("f", 2, taker)])  # the new holder writes on
    assert [e.fence for e in await store.read("f")] == [fence, fence, taker]


async def test_a_cancelled_lone_append_is_a_cancel_and_the_store_goes_on(
    pg_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store: PostgresStore = pg_store
    fence = await _started(store, "c")
    await store.append([env("c", 1, fence)])
    answer = _postgres_lean.LeanStatements._answer
    sent = asyncio.Event()

    async def never(self: Any, expected: Any, loop: Any = None) -> Any:
        sent.set()
        await asyncio.Event().wait()  # cancelled here, the statement sent
        return await answer(self, expected, loop)

    monkeypatch.setattr(_postgres_lean.LeanStatements, "_answer", never)
    write = asyncio.ensure_future(store.append([env("c", 2, fence)]))
    await asyncio.wait_for(sent.wait(), 10)
    write.cancel()
    with pytest.raises(asyncio.CancelledError):
        await write
    monkeypatch.undo()
    # Its outcome is unknown to the writer (the statement was sent); the store itself goes on:
    # the held connection was given up, and the next write reads what is there.
    stored = [e.sequence for e in await store.read("c")]
    assert stored in ([0, 1], [0, 1, 2])
    nxt = len(stored)
    await store.append([env("c", nxt, fence)])
    assert [e.sequence for e in await store.read("c")] == list(range(nxt + 1))
    assert not store._writer._held_busy


async def test_a_cancelled_lone_append_waiting_on_a_lock_is_stopped_on_the_server(
    pg_dsn: str, pg_store: Any
) -> None:
    """A lone append is one autocommit statement. Cancelled while the server has it waiting on
    a lock (a racer's open transaction holds the head row), it must not run on: closing the
    socket alone does not stop a backend waiting on a lock, and the statement would commit
    when the lock came, after its caller was told it was cancelled. A cancel request stops it."""
    store: PostgresStore = pg_store
    fence = await _started(store, "locked")
    locker = await psycopg.AsyncConnection.connect(pg_dsn)
    admin = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
    try:
        await locker.execute(
            f"SELECT 1 FROM {store.schema}.heads WHERE execution_id = 'locked' FOR UPDATE"
        )
        write = asyncio.ensure_future(store.append([env("locked", 1, fence)]))

        async def blocked() -> int | None:
            cur = await admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (locker.info.backend_pid,),
            )
            row = await cur.fetchone()
            return None if row is None else int(row[0])

        backend = await until(blocked, "the append to wait on the locked head", timeout=10)
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write

        async def stopped() -> bool:  # its backend no longer waits on the lock
            return await blocked() is None

        await until(stopped, "the cancelled append's statement to stop", timeout=10)
        cur = await admin.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (backend,))
        assert (await cur.fetchone() or ("gone",))[0] != "active"
    finally:
        await locker.rollback()  # the lock goes: a statement still waiting would commit now
        await locker.close()
        await admin.close()
    assert await store.last_sequence("locked") == 0
    await store.append([env("locked", 1, fence)])  # the store goes on, on a new connection
    assert await store.last_sequence("locked") == 1
