"""TimerService: finds due timers and wakes their executions, once each."""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace

from loom.runtime._clock import Clock, SystemClock
from loom.storage import Timer, TimerStore

__all__ = ["TimerService", "WakeOutcome"]

log = logging.getLogger("loom.timers")


class WakeOutcome(enum.Enum):
    FIRED = "fired"  # the wait ended: TIMER_FIRED is in the log
    STALE = "stale"  # nothing waits at that position any more (fired, resumed, cancelled)
    EARLY = "early"  # not due by the waker's clock, or its wait is not logged yet: retry later


Wake = Callable[[Timer], Awaitable[WakeOutcome]]


class TimerService:
    """Claims due timers from a :class:`TimerStore` and calls ``wake`` for each.

    Many services may poll one database: the claim is exclusive (a row lock), and ``wake``
    re-checks the log under a fresh fence, so each wait ends once even if a claim expires and
    a timer is handed out again. A timer whose wake raises stays claimed until ``lease``
    seconds pass, then is retried. All time comes from ``clock``.
    """

    def __init__(
        self,
        store: TimerStore,
        wake: Wake,
        *,
        clock: Clock | None = None,
        owner: str | None = None,
        lease: float = 30.0,
        batch: int = 256,
        poll_interval: float = 1.0,
        concurrency: int = 64,
        early_retry: float = 0.5,
    ) -> None:
        self.store = store
        self.wake = wake
        self.clock = clock or SystemClock()
        self.owner = owner or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.lease = lease
        self.batch = batch
        self.poll_interval = poll_interval
        self.early_retry = early_retry
        self._limit = asyncio.Semaphore(concurrency)
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.fired: list[Timer] = []  # what this service fired (for operators and tests)

    async def _wake_one(self, timer: Timer) -> None:
        async with self._limit:
            try:
                outcome = await self.wake(timer)
            except Exception as exc:
                log.warning(
                    "waking %s@%d failed; retried after the lease: %r",
                    timer.execution_id,
                    timer.position,
                    exc,
                )
                return
            if outcome is WakeOutcome.EARLY:
                # Not due by the waker's clock, or the wait is not logged yet (its timer is
                # stored first): hand the timer back for a later try instead of deleting it
                # or sitting on the claim for a whole lease.
                retry_at = max(timer.fire_at, self.clock.now() + self.early_retry)
                await self.store.schedule_timer(replace(timer, fire_at=retry_at))
                return
            if outcome is WakeOutcome.FIRED:
                self.fired.append(timer)
            await self.store.complete_timer(timer)

    async def run_due(self) -> int:
        """Fire every timer due now (in batches); return how many were claimed."""
        total = 0
        while True:
            due = await self.store.claim_due_timers(
                self.clock.now(), owner=self.owner, lease=self.lease, limit=self.batch
            )
            if not due:
                return total
            total += len(due)
            await asyncio.gather(*(self._wake_one(t) for t in due))

    def kick(self) -> None:
        """Look for due timers now (a timer was just scheduled)."""
        self._kick.set()

    async def run_forever(self) -> None:
        while True:
            try:
                fired = await self.run_due()
                if fired:
                    continue
                next_due = await self.store.next_timer_due()
            except Exception as exc:  # the store is unreachable: keep polling
                log.warning("timer service poll failed: %r", exc)
                next_due = None
            wait = self.poll_interval
            if next_due is not None:
                wait = max(0.0, min(wait, next_due - self.clock.now()))
            self._kick.clear()
            try:
                await asyncio.wait_for(self._kick.wait(), wait)
            except TimeoutError:
                pass

    def start(self) -> None:
        """Run :meth:`run_forever` in the background (on the running event loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self.run_forever(), name=f"loom-timers:{self.owner}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
