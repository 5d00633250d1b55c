"""A time-skipping test environment: timers fire by advancing a virtual clock, through the same
TimerService and wake path production uses."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from loom.errors import NotWaitingError
from loom.model import ExecutionState
from loom.runtime import ExecutionHandle, WorkflowRuntime
from loom.runtime._sdk import _seconds
from loom.storage import InMemoryStore, Store
from loom.testing._clock import SkippingClock

__all__ = ["TimeSkippingEnvironment"]


class TimeSkippingEnvironment:
    """A runtime on a :class:`SkippingClock` whose timers fire when the test moves time.

        env = TimeSkippingEnvironment()
        env.runtime.register(my_flow)
        handle = await env.runtime.start(my_flow, inp)
        result = await env.result(handle)      # skips every durable sleep and timeout

    ``advance(delta)`` moves the clock and fires what became due; ``result`` keeps skipping to
    the next timer until the execution ends. A 30-day sleep takes microseconds.
    """

    def __init__(self, store: Store | None = None, *, start: float = 1_800_000_000.0) -> None:
        self.clock = SkippingClock(start)
        self.runtime = WorkflowRuntime(store or InMemoryStore(), clock=self.clock, timers=False)
        if self.runtime.timers is None:
            raise TypeError("the store must implement TimerStore")
        self.timers = self.runtime.timers

    async def advance(self, delta: timedelta | float) -> int:
        """Move virtual time forward and fire every timer now due; return how many fired."""
        self.clock.advance(_seconds(delta))
        before = self.timers.fired_count
        await self.timers.run_due()
        return self.timers.fired_count - before

    async def settle(self, handle: ExecutionHandle[Any]) -> ExecutionState:
        """Skip through timers until the execution ends or waits on something else (a gate
        without a timer due): return its state then."""
        while True:
            state = await self.runtime.handle(handle.execution_id).settled(timeout=30)
            if state.is_terminal:
                return state
            next_due = await self.timers.store.next_timer_due()
            if next_due is None:
                return state
            await self.advance(max(0.0, next_due - self.clock.now()))

    async def result(self, handle: ExecutionHandle[Any]) -> Any:
        state = await self.settle(handle)
        if not state.is_terminal:
            raise NotWaitingError(
                f"execution {handle.execution_id!r} waits for "
                f"{state.waiting.event_type if state.waiting else 'nothing'} and no timer "
                "would end that",
                execution_id=handle.execution_id,
            )
        return await self.runtime.handle(handle.execution_id).result(timeout=30)

    async def close(self) -> None:
        await self.runtime.close()
