"""The one way the tests wait for something that has no event to await: poll with a deadline.

``until`` re-evaluates a probe (sync or async) until it returns something truthy and returns
that value; at the deadline it fails with an AssertionError that names what was awaited and the
last value seen, so a hung wait reads as a clear failure instead of a test timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["until", "until_sync"]

T = TypeVar("T")


async def until(
    probe: Callable[[], Awaitable[T] | T], what: str, *, timeout: float = 10.0, every: float = 0.01
) -> T:
    """Await ``probe()`` (or call it) until its value is truthy; return that value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = probe()
        value: T = await got if inspect.isawaitable(got) else got  # type: ignore[assignment]
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        await asyncio.sleep(every)  # the interval between two probes, not a wait for the result


def until_sync(
    probe: Callable[[], T], what: str, *, timeout: float = 10.0, every: float = 0.05
) -> T:
    """``until`` for synchronous tests (CLI processes, files written by a child)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        time.sleep(every)  # the interval between two probes, not a wait for the result
