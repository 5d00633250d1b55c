"""asyncio helpers shared by the background loops of the runtime and the stores."""

from __future__ import annotations

import asyncio
import time

__all__ = ["SHARE_LOOP_EVERY", "LoopShare", "cancel_requested", "raise_if_cancel_swallowed"]

#: The longest run of back-to-back writes a store commits without awaiting before the next one
#: first lets the event loop run once (see LoopShare).
SHARE_LOOP_EVERY = 0.005


class LoopShare:
    """Gives the event loop a turn once every ``SHARE_LOOP_EVERY`` seconds of a store's writes.

    A store whose lone write commits on the loop's thread and awaits nothing (SQLite's, the
    in-memory one) never let the loop run while a flow stepped back to back: a 2,000-step
    flow held it for its whole 380 ms, and every task waiting on a timer or on I/O (lease
    heartbeats, the timer service, an HTTP worker's requests) waited that long. A store asks
    :meth:`due` before each write and, when it is, awaits :meth:`turn` first: a few µs per
    5 ms of steps. Before the write, never after it: a cancel that lands in the turn leaves
    nothing written, where one after the commit would report a durable write as cancelled.
    """

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0.0

    def due(self) -> bool:
        """Whether the next write should first let the loop run."""
        return time.monotonic() >= self._next

    def hurry(self) -> None:
        """Make the next write let the loop run first: something it watches is ready now."""
        self._next = 0.0

    async def turn(self) -> None:
        """Let the loop run its other ready tasks once."""
        await asyncio.sleep(0)
        self._next = time.monotonic() + SHARE_LOOP_EVERY


def raise_if_cancel_swallowed() -> None:
    """Raise CancelledError if the current task was asked to stop but nothing raised it.

    On Python 3.11, ``asyncio.wait_for`` (used inside psycopg_pool and other libraries) drops a
    cancel that arrives just as the awaited operation completes: the caller gets the result
    and the task keeps running with its cancel request still pending. A background loop that
    catches ``Exception`` and goes round again would then never end, and whoever awaits it in
    ``stop()`` would wait forever. Calling this once per round turns that lost cancel back into
    the CancelledError the loop was meant to see.
    """
    if cancel_requested():
        raise asyncio.CancelledError


def cancel_requested() -> bool:
    """Whether the current task has a cancel request that nothing has taken back (uncancel)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
