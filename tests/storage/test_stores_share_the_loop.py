"""A flow stepping back to back on SQLite (or in memory) lets the event loop's other tasks run.

Their writes commit on the loop's thread and await nothing while no other task is ready, so
before the fix a 2,000-step flow held the loop for its whole run: a task waiting on a timer or
on I/O (a lease heartbeat, a timer service, an HTTP worker's request) only becomes ready when
the loop polls, and it waited for the flow to end.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from pathlib import Path

import pytest

import loom
from loom._aio import SHARE_LOOP_EVERY, LoopShare
from tests.storage.test_lone_append import _start, _step


@loom.step(id="noop")
async def noop(i: int) -> int:
    return i


@loom.flow(id="back-to-back")
async def back_to_back(ctx: loom.WorkflowContext, n: int) -> int:
    for i in range(n):
        await ctx.run(noop, i)
    return n


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_a_flow_stepping_back_to_back_leaves_the_loop_to_other_tasks(
    tmp_path: Path, kind: str
) -> None:
    turns: list[float] = []
    done = asyncio.Event()

    async def other_task() -> None:
        # Ready again only when the loop looks at its timers, as a heartbeat is.
        while not done.is_set():
            turns.append(time.perf_counter())
            await asyncio.sleep(0.001)

    store = loom.SQLiteStore(tmp_path / "loom.db") if kind == "sqlite" else loom.InMemoryStore()
    async with loom.WorkflowRuntime(store) as rt:
        rt.register(back_to_back)
        other = asyncio.create_task(other_task())
        await asyncio.sleep(0)
        began = time.perf_counter()
        steps = 2_000 if kind == "sqlite" else 10_000  # in memory a step takes ~20 µs
        handle = await rt.start(back_to_back, steps)
        assert await handle.result(timeout=60) == steps
        took = time.perf_counter() - began
        done.set()
        await other
    during = [t for t in turns if t >= began]
    gaps = [b - a for a, b in itertools.pairwise(during)]
    # A write lets the loop run once SHARE_LOOP_EVERY after the last time it did; a task whose
    # timer came due meanwhile runs at that turn or the next (a garbage collection may hold
    # one turn back longer), so it runs all through the flow, however slow this machine is.
    # Before the fix it ran once, after the flow's end.
    assert took > 8 * SHARE_LOOP_EVERY, took  # long enough to tell the two apart
    assert len(during) >= 5, (len(during), took)
    assert statistics.median(gaps) < took / 10, (statistics.median(gaps), took)


class _CancelledInItsTurn(LoopShare):
    """Due at once; its turn is where a cancel lands (nothing else is ready on the loop, so the
    write itself takes the store's lone path)."""

    def due(self) -> bool:
        return True

    async def turn(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await super().turn()


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_a_cancel_during_the_loops_turn_leaves_nothing_written(
    tmp_path: Path, kind: str
) -> None:
    # The turn comes before the write: a write cancelled in it is not in the log. Were it after
    # the commit, the caller would be told "cancelled" of a record that is durable.
    store = loom.SQLiteStore(tmp_path / "loom.db") if kind == "sqlite" else loom.InMemoryStore()
    fence = await store.acquire_fence("e")
    await store.append([_start("e", fence)])
    store._loop_share = _CancelledInItsTurn()  # the next write takes a turn, cancelled in it
    with pytest.raises(asyncio.CancelledError):
        await store.append([_step("e", 1, fence)])
    assert await store.last_sequence("e") == 0
    store._loop_share = LoopShare()
    await store.append([_step("e", 1, fence)])  # and the store writes on as before
    assert await store.last_sequence("e") == 1
    await store.close()
