"""A clock the test sets by hand: time moves only when the test assigns ``t``."""

from __future__ import annotations

import asyncio


class SetClock:
    def __init__(self, now: float) -> None:
        self.t = now

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)  # time does not pass by itself: only yield to the loop
