"""A flow stepping back to back on SQLite lets the event loop's other tasks run.

Its writes commit on the loop's thread and await nothing while no other task is ready, so
before the fix a 2,000-step flow held the loop for its whole run: a task waiting on a timer or
on I/O (a lease heartbeat, a timer service, an HTTP worker's request) only becomes ready when
the loop polls, and it waited for the flow to end.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import loom
from loom.storage.sqlite import SHARE_LOOP_EVERY


@loom.step(id="noop")
async def noop(i: int) -> int:
    return i


@loom.flow(id="back-to-back")
async def back_to_back(ctx: loom.WorkflowContext, n: int) -> int:
    for i in range(n):
        await ctx.run(noop, i)
    return n


async def test_a_flow_stepping_back_to_back_leaves_the_loop_to_other_tasks(tmp_path: Path) -> None:
    turns: list[float] = []
    done = asyncio.Event()

    async def other_task() -> None:
        # Ready again only when the loop looks at its timers, as a heartbeat is.
        while not done.is_set():
            turns.append(time.perf_counter())
            await asyncio.sleep(0.001)

    async with loom.WorkflowRuntime(loom.SQLiteStore(tmp_path / "loom.db")) as rt:
        rt.register(back_to_back)
        other = asyncio.create_task(other_task())
        await asyncio.sleep(0)
        began = time.perf_counter()
        handle = await rt.start(back_to_back, 2000)
        assert await handle.result(timeout=60) == 2000
        took = time.perf_counter() - began
        done.set()
        await other
    during = [t for t in turns if t >= began]
    gaps = [b - a for a, b in itertools.pairwise(during)]
    # Each write lets the loop run once SHARE_LOOP_EVERY after the last time it did, so the
    # other task's longest wait is about that (plus one step): a small part of the flow's run,
    # however slow this machine is. Before the fix it waited for the whole flow.
    assert took > 8 * SHARE_LOOP_EVERY, took  # long enough to tell the two apart
    assert len(during) >= 4
    assert max(gaps) < took / 4, (max(gaps), took)
