"""A flow stepping back to back lets the event loop's other tasks run, on every store.

SQLite's and the in-memory store's writes commit on the loop's thread and await nothing while
no other task is ready, so before the fix a 2,000-step flow held the loop for its whole run: a
task waiting on a timer or on I/O (a lease heartbeat, a timer service, an HTTP worker's
request) only becomes ready when the loop polls, and it waited for the flow to end.
PostgreSQL's lone write waits for its answer in ``poll()`` without yielding (``LONE_WAIT``),
and takes the same turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import loom
from loom._aio import SHARE_LOOP_EVERY, LoopShare
from loom.storage import Store
from tests.conftest import Backend
from tests.storage.test_lone_append import _start, _step


@loom.step(id="noop")
async def noop(i: int) -> int:
    return i


@loom.flow(id="back-to-back")
async def back_to_back(ctx: loom.WorkflowContext, n: int) -> int:
    for i in range(n):
        await ctx.run(noop, i)
    return n


@pytest.mark.parametrize("waits_on", ["timer", "io"])
async def test_a_flow_stepping_back_to_back_leaves_the_loop_to_other_tasks(
    backend: Backend, waits_on: str
) -> None:
    turns: list[float] = []
    done = asyncio.Event()
    store = backend.store()
    with _socket_fed_every_millisecond() as ours:
        async with loom.WorkflowRuntime(store) as rt:
            rt.register(back_to_back)
            other = asyncio.create_task(_note_turns(turns, done, waits_on, ours))
            await asyncio.sleep(0)
            began = time.perf_counter()
            # Long enough for many turns: in memory a step takes ~14 µs, and a task woken by a
            # timer runs two or three turns after it came due (the timer, then its wake-up).
            steps = 20_000 if backend.kind == "memory" else 2_000
            handle = await rt.start(back_to_back, steps)
            assert await handle.result(timeout=60) == steps
            took = time.perf_counter() - began
            done.set()
            await other
    _assert_turns_all_through(turns, began, took)


async def test_a_stores_writes_back_to_back_leave_the_loop_to_a_task_waiting_on_io(
    backend: Backend,
) -> None:
    # Through the store alone: no runtime, so no timer of its own on the loop (PostgreSQL's
    # blocking wait would have stopped at one). Without the turns, the socket's task ran only
    # after the last write (PostgreSQL: its socket's buffer filled up unread).
    turns: list[float] = []
    done = asyncio.Event()
    store = backend.store()
    fence = await store.acquire_fence("e")
    await store.append([_start("e", fence)])
    with _socket_fed_every_millisecond() as ours:
        other = asyncio.create_task(_note_turns(turns, done, "io", ours))
        await asyncio.sleep(0)
        began = time.perf_counter()
        writes = 20_000 if backend.kind == "memory" else 2_000
        for seq in range(1, writes + 1):
            await store.append([_step("e", seq, fence)])
        took = time.perf_counter() - began
        done.set()
        await other
    await store.close()
    _assert_turns_all_through(turns, began, took)


# The feeder is a process of its own: a thread would need this process's GIL to write, which
# a store whose writes are pure Python (the in-memory one) hands over only every 5 ms.
_FEEDER = """
import os, sys, time
fd = int(sys.argv[1])
while True:
    os.write(fd, b"x")
    time.sleep(0.001)
"""


@contextlib.contextmanager
def _socket_fed_every_millisecond() -> Iterator[socket.socket]:
    """A non-blocking socket another process writes a byte to every millisecond: a task reading
    it is woken only when the loop polls for I/O (as an HTTP worker's request is)."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    feeder = subprocess.Popen(
        [sys.executable, "-c", _FEEDER, str(theirs.fileno())], pass_fds=[theirs.fileno()]
    )
    theirs.close()
    try:
        yield ours
    finally:
        feeder.kill()
        feeder.wait()
        ours.close()


async def _note_turns(
    turns: list[float], done: asyncio.Event, waits_on: str, sock: socket.socket
) -> None:
    """Note each time this task runs, until ``done``: woken by a timer or by ``sock``."""
    loop = asyncio.get_running_loop()
    while not done.is_set():
        turns.append(time.perf_counter())
        if waits_on == "timer":
            await asyncio.sleep(0.001)  # ready again when the loop looks at its timers
        else:
            await loop.sock_recv(sock, 4096)


def _assert_turns_all_through(turns: list[float], began: float, took: float) -> None:
    during = [t for t in turns if t >= began]
    gaps = [b - a for a, b in itertools.pairwise(during)]
    # A write lets the loop run once SHARE_LOOP_EVERY after the last time it did; a task whose
    # timer came due or whose socket became readable meanwhile runs at that turn or the next (a
    # garbage collection may hold one turn back longer), so it runs all through the writes,
    # however slow this machine is. Before the fix it ran once, after the last write.
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


def _share_loop(store: Store, share: LoopShare) -> None:
    """Make ``share`` decide when ``store``'s writes let the loop run."""
    if isinstance(store, (loom.SQLiteStore, loom.InMemoryStore)):
        store._loop_share = share
        return
    lean = store._writer._held_lean  # type: ignore[attr-defined]  # PostgreSQL's held connection
    assert lean is not None, "a write first takes the held connection"
    lean.loop_share = share


async def test_a_cancel_during_the_loops_turn_leaves_nothing_written(backend: Backend) -> None:
    # The turn comes before the write: a write cancelled in it is not in the log. Were it after
    # the commit, the caller would be told "cancelled" of a record that is durable.
    store = backend.store()
    fence = await store.acquire_fence("e")
    await store.append([_start("e", fence)])
    _share_loop(store, _CancelledInItsTurn())  # the next write takes a turn, cancelled in it
    with pytest.raises(asyncio.CancelledError):
        await store.append([_step("e", 1, fence)])
    assert await store.last_sequence("e") == 0
    if (
        backend.kind != "postgres"
    ):  # PostgreSQL's writer handed its connection back; the next is new
        _share_loop(store, LoopShare())
    await store.append([_step("e", 1, fence)])  # and the store writes on as before
    assert await store.last_sequence("e") == 1
    await store.close()
