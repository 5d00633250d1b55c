"""runtime.subscribe at the edges (an unknown id, a subscription past the end) and the shared
SQLite change watch behind runtime.wait (idle waiters cost no query)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import ExecutionNotFoundError
from loom.model import ExecutionStatus
from loom.storage import SQLiteStore, _sqlite_watch
from loom.storage import sqlite as sqlite_module
from tests.support.poll import until


@loom.flow(id="await-edges-gated", version="1")
async def gated(ctx: loom.WorkflowContext) -> str:
    decision = await ctx.suspend("Go")
    return str(decision)


async def _all(rt: loom.WorkflowRuntime, eid: str, **kw: Any) -> list[str]:
    return [str(env.type) async for env in rt.subscribe(eid, **kw)]


async def test_subscribe_to_an_unknown_id_raises_unless_missing_ok(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path), timers=False) as rt:
        with pytest.raises(ExecutionNotFoundError) as missing:
            await asyncio.wait_for(_all(rt, "nope"), 10)
        assert missing.value.execution_id == "nope"
        assert "missing_ok" in (missing.value.hint or "")
        # With missing_ok it waits for the start, then follows to the end.
        follower = asyncio.create_task(_all(rt, "later", missing_ok=True))
        await asyncio.sleep(0)
        assert not follower.done()
        await rt.start(gated, execution_id="later")
        await rt.wait("later", until="settled", timeout=10)
        await rt.resume("later", "Go", "yes")
        seen = await asyncio.wait_for(follower, 10)
        assert seen[0] == "EXECUTION_STARTED" and seen[-1] == "EXECUTION_COMPLETED"


async def test_subscribe_after_the_end_ends_at_once(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path), timers=False) as rt:
        await rt.start(gated, execution_id="ended")
        await rt.wait("ended", until="settled", timeout=10)
        await rt.resume("ended", "Go", "yes")
        state = await rt.wait("ended", timeout=10)
        assert state.status is ExecutionStatus.COMPLETED
        end = state.last_sequence
        assert await asyncio.wait_for(_all(rt, "ended", after_sequence=end), 10) == []
        assert await asyncio.wait_for(_all(rt, "ended", after_sequence=end + 5), 10) == []
        # Just before the end: the terminal envelope, then the end.
        tail = await asyncio.wait_for(_all(rt, "ended", after_sequence=end - 1), 10)
        assert tail == ["EXECUTION_COMPLETED"]
        # A live execution is still followed from where the caller is.
        await rt.start(gated, execution_id="live")
        settled = await rt.wait("live", until="settled", timeout=10)
        follower = asyncio.create_task(_all(rt, "live", after_sequence=settled.last_sequence))
        await asyncio.sleep(0)
        assert not follower.done()
        await rt.resume("live", "Go", "ok")
        seen = await asyncio.wait_for(follower, 10)
        assert seen[-1] == "EXECUTION_COMPLETED" and "EXECUTION_STARTED" not in seen


async def test_many_waiters_share_one_change_watch_and_cost_no_query_while_idle(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each waiter polling the database itself would show up as queries while nothing is
    written; the one watch (a stat per tick) must be all that runs."""
    # The per-waiter safety re-check is for coarse filesystem times; push it out of the test.
    monkeypatch.setattr(sqlite_module, "_SAFETY_POLL", 3600.0)
    ticks = 0
    ticked = asyncio.Event()
    target = 0
    real_signature = _sqlite_watch._signature

    def counting_signature(paths: tuple[str, ...]) -> Any:
        nonlocal ticks
        ticks += 1
        if ticks >= target:
            ticked.set()
        return real_signature(paths)

    monkeypatch.setattr(_sqlite_watch, "_signature", counting_signature)

    n = 40
    ids = [f"w-{i}" for i in range(n)]
    # Another process's runtime (its own store: only the database files connect the two).
    writer_store = SQLiteStore(db_path)
    async with loom.WorkflowRuntime(store=writer_store, timers=False) as writer:
        for eid in ids:
            await writer.start(gated, execution_id=eid)
        for eid in ids:
            await writer.wait(eid, until="settled", timeout=10)

        store = SQLiteStore(db_path, poll_interval=0.01)
        queries: Counter[str] = Counter()
        real_last, real_read = store.last_sequence, store.read

        async def last_sequence(execution_id: str) -> int:
            queries[execution_id] += 1
            return await real_last(execution_id)

        async def read(execution_id: str, *args: Any, **kw: Any) -> Any:
            queries[execution_id] += 1
            return await real_read(execution_id, *args, **kw)

        monkeypatch.setattr(store, "last_sequence", last_sequence)
        monkeypatch.setattr(store, "read", read)
        async with loom.WorkflowRuntime(store=store, timers=False) as rt:
            rt.register(gated)
            waits = {eid: asyncio.create_task(rt.wait(eid, timeout=60)) for eid in ids}
            await until(lambda: len(store._waiters._by_execution) == n, "every waiter parked")
            watches = [
                t
                for t in asyncio.all_tasks()
                if t.get_name() == "loom:sqlite-watch"
                and t.get_coro().cr_frame.f_locals.get("self") is store._watch  # type: ignore[union-attr]
            ]
            assert len(watches) == 1  # one watch for all the waiters, not one each

            queries.clear()
            target = ticks + 20
            ticked.clear()
            await asyncio.wait_for(ticked.wait(), 30)
            assert not any(t.done() for t in waits.values())
            assert sum(queries.values()) == 0, f"idle waiters queried: {dict(queries)}"

            # A commit by the other process wakes them through the watch: each waiter reads
            # its own execution a bounded number of times, and only the one that moved ends.
            await writer.resume("w-7", "Go", "yes")
            done = await asyncio.wait_for(waits.pop("w-7"), 30)
            assert done.status is ExecutionStatus.COMPLETED and done.output == "yes"
            await until(lambda: all(queries[eid] >= 1 for eid in ids), "every waiter woken")
            assert not any(t.done() for t in waits.values())
            # Woken once per change, then idle again: no query until the next commit.
            queries.clear()
            target = ticks + 20
            ticked.clear()
            await asyncio.wait_for(ticked.wait(), 30)
            assert sum(queries.values()) == 0, f"woken waiters kept querying: {dict(queries)}"
            for task in waits.values():
                task.cancel()
            await asyncio.gather(*waits.values(), return_exceptions=True)
