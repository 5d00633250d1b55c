"""A clock for tests: time moves only when told, and sleeping skips ahead instantly."""

from __future__ import annotations

import asyncio

__all__ = ["SkippingClock"]


class SkippingClock:
    """``now()`` starts at ``start`` and only moves when something sleeps or ``advance`` is
    called; ``sleep`` advances the clock by the requested amount and returns at once, so a
    flow that backs off or sleeps for days finishes in microseconds of wall time."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self.slept: list[float] = []

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(0.0, seconds)

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)
        await asyncio.sleep(0)
