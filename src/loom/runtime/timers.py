"""TimerService: finds due timers and wakes their executions, once each."""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Collection
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
        max_early_backoff: float = 60.0,
        flow_ids: Callable[[], Collection[str]] | None = None,
    ) -> None:
        self.store = store
        self.wake = wake
        self.clock = clock or SystemClock()
        self.owner = owner or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.lease = lease
        self.batch = batch
        self.poll_interval = poll_interval
        self.early_retry = early_retry
        self.max_early_backoff = max_early_backoff
        #: which flows' timers to claim (asked before every claim); None: every flow's
        self.flow_ids = flow_ids
        #: consecutive EARLY answers for timers that were due by our clock, by (id, position)
        self._early: dict[tuple[str, int], int] = {}
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
            key = (timer.execution_id, timer.position)
            if outcome is WakeOutcome.EARLY:
                # Not due by the waker's clock, or the wait is not logged yet (its timer is
                # stored first): hand the timer back for a later try instead of deleting it
                # or sitting on the claim for a whole lease.
                now = self.clock.now()
                delay = self.early_retry
                if timer.fire_at <= now:
                    # Due by our clock, yet nothing waits in the log: usually the holder died
                    # between storing the timer and logging the wait, and only recovery (which
                    # re-runs the flow up to the wait) can settle it. Back off exponentially
                    # instead of polling it every early_retry seconds forever.
                    tries = self._early.get(key, 0)
                    self._early[key] = tries + 1
                    delay = min(self.early_retry * 2 ** min(tries, 32), self.max_early_backoff)
                await self.store.schedule_timer(
                    replace(timer, fire_at=max(timer.fire_at, now + delay))
                )
                return
            self._early.pop(key, None)
            if outcome is WakeOutcome.FIRED:
                self.fired.append(timer)
            await self.store.complete_timer(timer)

    async def run_due(self) -> int:
        """Fire every timer due now (in batches); return how many were claimed."""
        total = 0
        while True:
            due = await self.store.claim_due_timers(
                self.clock.now(),
                owner=self.owner,
                lease=self.lease,
                limit=self.batch,
                flow_ids=None if self.flow_ids is None else self.flow_ids(),
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
            if next_due is not None and next_due > self.clock.now():
                # A timer due already but not claimed is held by another service or is of a
                # flow not registered here: poll for it, do not spin on it.
                wait = min(wait, next_due - self.clock.now())
            self._kick.clear()
            try:
                await asyncio.wait_for(self._kick.wait(), wait)
            except TimeoutError:
                pass

    @property
    def running(self) -> bool:
        """Whether :meth:`run_forever` runs in the background (started and not stopped)."""
        return self._task is not None and not self._task.done()

    async def __aenter__(self) -> TimerService:
        """``async with service:`` serves timers in the background until the block ends."""
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start(self) -> None:
        """Run :meth:`run_forever` in the background (on the running event loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self.run_forever(), name=f"loom-timers:{self.owner}"
            )

    async def stop(self) -> None:
        """Stop serving (a wake in progress is cancelled; its timer's claim expires and
        another service retries it)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
