"""TimerService: finds due timers and wakes their executions, once each."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import gc
import logging
import os
import threading
import uuid
from collections import deque
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import replace
from typing import Any

from loom._aio import raise_if_cancel_swallowed
from loom._settings import seconds_setting
from loom.errors import ConfigurationError
from loom.runtime._clock import Clock, SystemClock
from loom.storage import Timer, TimerStore

__all__ = ["TimerService", "WakeOutcome"]

log = logging.getLogger("loom.timers")


class WakeOutcome(enum.Enum):
    FIRED = "fired"  # the wait ended: TIMER_FIRED is in the log
    STALE = "stale"  # nothing waits at that position any more (fired, resumed, cancelled)
    EARLY = "early"  # not due by the waker's clock, or its wait is not logged yet: retry later


Wake = Callable[[Timer], Awaitable[WakeOutcome]]
#: Called with a claimed batch before its wakes, in the context they run in (see TimerService);
#: returns the outcomes it decided already, by (execution id, position), or None.
Prepare = Callable[
    [Sequence[Timer]], Coroutine[Any, Any, Mapping[tuple[str, int], WakeOutcome] | None]
]


#: CPython's third collection threshold while a backlog of timers drains (see _backlog_gc).
BACKLOG_FULL_COLLECTION_THRESHOLD = 100

_gc_lock = threading.Lock()
_gc_draining = 0  # run_due calls draining a backlog now, in this process
_gc_saved: tuple[int, ...] | None = None  # the thresholds the first of them found
_gc_set: tuple[int, ...] | None = None  # the thresholds it set


@contextlib.contextmanager
def _backlog_gc() -> Iterator[None]:
    """Full collections are made rarer while a backlog of timers drains, and put back after.

    A claimed batch keeps thousands of live objects in flight (states, drivers, their tasks),
    and each batch's survivors trip CPython's full collection, which walks every object the
    process holds: draining 10,000 timers ran ten of them, about 40% of the burst's CPU time,
    to find next to nothing (the objects are live, not garbage). The young generations are
    collected as often as before, so cyclic garbage is still found early; only the walk of the
    whole heap waits ``BACKLOG_FULL_COLLECTION_THRESHOLD`` young collections instead of 10.
    Thresholds are process-wide: the first drain (of any service, any thread) saves them, the
    last one restores them, unless someone else changed them meanwhile (theirs are kept).
    """
    global _gc_draining, _gc_saved, _gc_set
    with _gc_lock:
        if _gc_draining == 0:
            saved = gc.get_threshold()
            if saved[0] > 0 and saved[2] < BACKLOG_FULL_COLLECTION_THRESHOLD:
                _gc_saved = saved
                _gc_set = (saved[0], saved[1], BACKLOG_FULL_COLLECTION_THRESHOLD)
                gc.set_threshold(*_gc_set)
            else:  # collection is off or already rare: leave it as it is
                _gc_saved = _gc_set = None
        _gc_draining += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_draining -= 1
            if _gc_draining == 0 and _gc_saved is not None:
                if gc.get_threshold() == _gc_set:
                    gc.set_threshold(*_gc_saved)
                _gc_saved = _gc_set = None


class TimerService:
    """Claims due timers from a :class:`TimerStore` and calls ``wake`` for each.

    Many services may poll one database: the claim is exclusive (a row lock), and ``wake``
    re-checks the log under a fresh fence, so each wait ends once even if a claim expires and
    a timer is handed out again. A timer whose wake raises stays claimed until ``lease``
    seconds pass, then is retried. All time comes from ``clock``.

    ``prepare``, when given, is called with each claimed batch before its wakes start, in a
    context (``contextvars``) of the batch's own that its wakes then run in: what it sets
    there each wake of the batch sees (the runtime's reads every state of the batch in one
    query). It may return outcomes it decided itself (a timer it fired, say, or found
    stale): those timers get no wake of their own. If it raises, the wakes run all the same.

    :attr:`fired` keeps the last ``keep_fired`` timers this service fired (a long-running
    service must not grow without bound); :attr:`fired_count` counts them all.
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
        prepare: Prepare | None = None,
        keep_fired: int = 10_000,
    ) -> None:
        # A nan or inf setting would make a claim that never expires or a loop that never
        # polls; a lease of 0 is allowed (every claim is stale at once: tests use it).
        lease = seconds_setting(lease, "TimerService lease", zero_ok=True)
        poll_interval = seconds_setting(poll_interval, "TimerService poll_interval")
        early_retry = seconds_setting(early_retry, "TimerService early_retry")
        max_early_backoff = seconds_setting(max_early_backoff, "TimerService max_early_backoff")
        if batch < 1 or concurrency < 1:
            raise ConfigurationError(
                f"TimerService batch and concurrency must be at least 1 (got {batch}, "
                f"{concurrency})"
            )
        self.store = store
        self.wake = wake
        self.prepare = prepare
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
        #: how many wakes run at once (read by each run_due)
        self.concurrency = concurrency
        #: fired or stale timers whose deletion is not committed yet, and who commits it
        self._done: list[Timer] = []
        self._settler: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: the last ``keep_fired`` timers this service fired, oldest first (operators, tests)
        self._fired: deque[Timer] = deque(maxlen=max(0, keep_fired))
        #: how many timers this service fired in all
        self.fired_count = 0

    @property
    def fired(self) -> list[Timer]:
        """The last ``keep_fired`` timers this service fired, oldest first (a copy)."""
        return list(self._fired)

    async def _wake_one(self, timer: Timer, limit: asyncio.Semaphore) -> None:
        async with limit:
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
            await self._woken(timer, outcome)

    async def _woken(self, timer: Timer, outcome: WakeOutcome) -> None:
        """Settle ``timer`` by its wake's ``outcome``."""
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
            try:
                await self.store.schedule_timer(
                    replace(timer, fire_at=max(timer.fire_at, now + delay))
                )
            except Exception as exc:
                log.warning(
                    "handing back %s@%d failed; retried after the lease: %r",
                    timer.execution_id,
                    timer.position,
                    exc,
                )
            return
        self._early.pop(key, None)
        if outcome is WakeOutcome.FIRED:
            self._fired.append(timer)
            self.fired_count += 1
        self._settle(timer)

    async def _prepared(
        self, due: Sequence[Timer]
    ) -> tuple[contextvars.Context, Mapping[tuple[str, int], WakeOutcome]]:
        """The context the batch ``due`` is woken in, prepared for it, and the outcomes the
        preparation decided."""
        batch = contextvars.copy_context()
        decided: Mapping[tuple[str, int], WakeOutcome] | None = None
        if self.prepare is not None:
            try:
                decided = await asyncio.get_running_loop().create_task(
                    self.prepare(due), context=batch
                )
            except Exception as exc:  # only an optimisation: each wake can read its own state
                log.warning("preparing %d wakes failed; each reads its own: %r", len(due), exc)
        return batch, decided or {}

    def _settle(self, timer: Timer) -> None:
        """Queue a fired (or stale) timer's deletion. Deletions are grouped: one write
        settles every timer whose wake ended while the previous one committed. A crash before
        it commits loses nothing: the claim expires and the wake finds the wait ended."""
        self._done.append(timer)
        if self._settler is None or self._settler.done():
            self._settler = asyncio.get_running_loop().create_task(self._settle_loop())

    async def _settle_loop(self) -> None:
        while self._done:
            done, self._done = self._done, []
            try:
                await self.store.complete_timers(done)
            except Exception as exc:
                log.warning(
                    "deleting %d fired timers failed; their claims expire and a later wake "
                    "finds them stale: %r",
                    len(done),
                    exc,
                )

    async def _settled(self) -> None:
        while self._settler is not None and not self._settler.done():
            await asyncio.shield(self._settler)

    async def run_due(self) -> int:
        """Fire every timer due now; return how many were claimed.

        Claims come ``batch`` at a time (one statement each) and wakes run ``concurrency``
        at once; the next batch is claimed while the last one is being prepared, and as soon
        as fewer wakes than ``concurrency`` are left waiting for a slot, so neither a batch's
        preparation nor a slow wake at its end holds the rest back. Returns once every claimed
        timer's wake ended and its deletion committed. Once a claim comes back full (a
        backlog), full garbage collections are made rarer until the call returns
        (see ``_backlog_gc``).
        """
        total = 0
        backlog = contextlib.ExitStack()
        in_backlog = False
        loop = asyncio.get_running_loop()
        running: set[asyncio.Task[None]] = set()
        low_water = asyncio.Event()
        limit = asyncio.Semaphore(self.concurrency)
        preparing: asyncio.Task[None] | None = None

        def finished(task: asyncio.Task[None]) -> None:
            running.discard(task)
            if len(running) <= self.concurrency:
                low_water.set()

        async def start(due: Sequence[Timer]) -> None:
            batch, decided = await self._prepared(due)
            for timer in due:
                outcome = decided.get((timer.execution_id, timer.position))
                if outcome is not None:
                    await self._woken(timer, outcome)
                    continue
                task = loop.create_task(self._wake_one(timer, limit), context=batch)
                running.add(task)
                task.add_done_callback(finished)

        try:
            while True:
                # A claim's pool wait may have dropped the cancel of stop(): claiming on would
                # wake the whole backlog after it.
                raise_if_cancel_swallowed()
                due = await self.store.claim_due_timers(
                    self.clock.now(),
                    owner=self.owner,
                    lease=self.lease,
                    limit=self.batch,
                    flow_ids=None if self.flow_ids is None else self.flow_ids(),
                )
                if not due:
                    break
                if len(due) >= self.batch and not in_backlog:
                    backlog.enter_context(_backlog_gc())
                    in_backlog = True
                total += len(due)
                # Prepared in a task of its own: the next claim (and preparation) overlaps
                # this one's, at most one batch ahead.
                previous, preparing = preparing, loop.create_task(start(due))
                if previous is not None:
                    await previous
                # Claim more once the queue behind the running wakes is short: the next
                # claim then overlaps the wakes still running.
                if len(running) > self.concurrency:
                    low_water.clear()
                    await low_water.wait()
            if preparing is not None:
                await preparing
            while running:
                await asyncio.wait(list(running))
        except BaseException:
            if preparing is not None:
                preparing.cancel()
                await asyncio.gather(preparing, return_exceptions=True)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise
        finally:
            try:
                await self._settled()
            finally:
                backlog.close()
        return total

    def kick(self) -> None:
        """Look for due timers now (a timer was just scheduled)."""
        self._kick.set()

    async def run_forever(self) -> None:
        """Fire due timers until cancelled (what :meth:`start` runs in the background)."""
        while True:
            raise_if_cancel_swallowed()
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
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancel that arrives as the
            # kick lands (a sleep just scheduled its timer), and stop() then waits forever.
            try:
                async with asyncio.timeout(wait):
                    await self._kick.wait()
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
