"""Liveness leases: a runtime heartbeats one lease per execution it drives (see LeaseStore)."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid

from loom._aio import raise_if_cancel_swallowed
from loom.model import ExecutionStatus
from loom.runtime._clock import Clock
from loom.runtime._driver import Driver
from loom.storage import LeaseStore

__all__ = ["Heartbeat"]

log = logging.getLogger("loom.runtime")


class Heartbeat:
    """Renews the lease of every execution this runtime drives, every ``ttl / 3`` seconds.

    A driver's lease is written at the first beat after it starts driving and released when it
    stops (suspended, ended, stopped or cancelled). The cadence is real time on purpose: what a
    lease detects is a process that stopped running (killed, frozen by SIGSTOP, paused),
    whatever its clock says.
    Expiry times come from the runtime's clock, like every other stored time.
    """

    def __init__(self, store: LeaseStore, clock: Clock, ttl: float) -> None:
        self.store = store
        self.clock = clock
        self.ttl = ttl
        self.holder = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._drivers: set[Driver] = set()
        self._leased: set[Driver] = set()  # drivers whose lease was written (to release)
        self._task: asyncio.Task[None] | None = None

    async def begin(self, driver: Driver) -> None:
        """Keep ``driver``'s lease renewed from the next beat on, until :meth:`end`.

        The first lease is written at the first beat, not here: an execution that suspends or
        ends within ``ttl / 3`` never costs a lease write (it does not need one: the event
        that launched it is that recent, and ``lease_expired`` gives a lease-less execution
        the same ``grace`` from its last event).
        """
        self._drivers.add(driver)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"loom-leases:{self.holder}"
            )

    async def end(self, driver: Driver, *, release: bool) -> None:
        """Stop renewing ``driver``'s lease; drop it unless another driver here took over."""
        self._drivers.discard(driver)
        if not release or driver not in self._leased:
            self._leased.discard(driver)
            return
        self._leased.discard(driver)
        try:
            await self.store.release_lease(driver.state.execution_id, holder=self.holder)
        except Exception as exc:  # it expires on its own: an unreleased lease only delays
            log.warning("releasing the lease of %s failed: %r", driver.state.execution_id, exc)

    async def _renew(self, driver: Driver) -> None:
        live = driver.state.status in (ExecutionStatus.RUNNING, ExecutionStatus.PENDING)
        if driver.fenced_out is not None or driver.deferred is not None or not live:
            # A zombie or a settled driver must not look alive, nor one whose take-over is
            # not written yet (see DeferredTakeOver): it is not the holder until then.
            return
        try:
            self._leased.add(driver)
            await self.store.renew_lease(
                driver.state.execution_id,
                holder=self.holder,
                fence=driver.fence,
                expires_at=self.clock.now() + self.ttl,
            )
        except Exception as exc:  # a missed beat is retried; the lease has slack until ttl
            log.warning("renewing the lease of %s failed: %r", driver.state.execution_id, exc)

    async def _run(self) -> None:
        while self._drivers:
            raise_if_cancel_swallowed()  # a renewal's pool wait may have dropped stop()'s cancel
            await asyncio.sleep(self.ttl / 3)
            for driver in list(self._drivers):
                if not driver.done.is_set():
                    await self._renew(driver)
                    raise_if_cancel_swallowed()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
