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
from loom._aio import SHARE_LOOP_EVERY


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
