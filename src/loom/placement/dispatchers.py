"""LocalDispatcher (retry, timeout) and SupervisingDispatcher (restarts, circuit breaker)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from loom._aio import cancel_requested
from loom.errors import CircuitOpenError, ConfigurationError, DispatchError
from loom.placement._spi import (
    DISPATCHER_SPI_VERSION,
    ExecutionDispatcher,
    Health,
    WorkerRuntime,
    is_superseded_refusal,
    mark_redispatch,
)
from loom.placement._wire import ExecutionPackage, ExecutionResult
from loom.runtime import Clock, SystemClock

__all__ = ["LocalDispatcher", "SupervisingDispatcher"]

log = logging.getLogger("loom.placement")


class LocalDispatcher:
    """Runs each package on one :class:`WorkerRuntime`: allocate -> execute -> release.

    An attempt that raises or outlives ``execute_timeout`` (seconds) is a failed attempt; with
    ``max_attempts > 1`` the same package is dispatched again (the worker's idempotent execute
    resumes it). A flow-level failure is an outcome, returned, never retried. A superseded
    refusal is rethrown on the attempt that saw it, never retried: retrying would fence out the
    holder that won, which would retry in turn.
    """

    spi_version = DISPATCHER_SPI_VERSION

    def __init__(
        self,
        worker: WorkerRuntime,
        *,
        max_attempts: int = 1,
        execute_timeout: float | None = None,
        on_attempt_failed: Callable[[ExecutionPackage, int, BaseException], None] | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ConfigurationError("max_attempts must be at least 1")
        if execute_timeout is not None and execute_timeout <= 0:
            raise ConfigurationError("execute_timeout must be positive (seconds) or None")
        self.worker = worker
        self.max_attempts = max_attempts
        self.execute_timeout = execute_timeout
        self.on_attempt_failed = on_attempt_failed
        self._in_flight: dict[str, set[asyncio.Task[ExecutionResult]]] = {}
        self.attempts = 0

    async def _attempt(self, package: ExecutionPackage) -> ExecutionResult:
        lease = await self.worker.allocate(package)
        try:
            if self.execute_timeout is None:
                return await self.worker.execute(lease, package)
            try:
                # Not asyncio.wait_for: on 3.11 it can swallow a cancel of the dispatch.
                async with asyncio.timeout(self.execute_timeout):
                    return await self.worker.execute(lease, package)
            except TimeoutError as exc:
                raise TimeoutError(
                    f"attempt on {package.execution_id!r} exceeded execute_timeout="
                    f"{self.execute_timeout}s"
                ) from exc
        finally:
            await self.worker.release(lease)

    async def dispatch(self, package: ExecutionPackage) -> ExecutionResult:
        eid = package.execution_id
        last: BaseException | None = None
        for attempt in range(1, self.max_attempts + 1):
            self.attempts += 1
            attempt_package = package if attempt == 1 else mark_redispatch(package)
            task = asyncio.ensure_future(self._attempt(attempt_package))
            self._in_flight.setdefault(eid, set()).add(task)
            try:
                return await task
            except asyncio.CancelledError:
                if task.cancelled() and not cancel_requested():
                    raise DispatchError(
                        f"dispatch of {eid!r} was cancelled", execution_id=eid
                    ) from None
                raise
            except Exception as exc:
                if is_superseded_refusal(exc, eid):
                    raise
                last = exc
                log.warning("attempt %d/%d on %s failed: %r", attempt, self.max_attempts, eid, exc)
                if self.on_attempt_failed is not None:
                    self.on_attempt_failed(package, attempt, exc)
            finally:
                tasks = self._in_flight.get(eid)
                if tasks is not None:
                    tasks.discard(task)
                    if not tasks:
                        del self._in_flight[eid]
        assert last is not None
        if self.max_attempts == 1:
            raise last
        err = DispatchError(
            f"all {self.max_attempts} attempts on {eid!r} failed; the last: {last!r}",
            execution_id=eid,
            hint="The execution is resumable: redispatch it, or let recover_abandoned take it",
        )
        raise err from last

    async def cancel(self, execution_id: str) -> None:
        """Abandon the in-flight attempt(s) on ``execution_id`` (the lease is released)."""
        for task in list(self._in_flight.get(execution_id, ())):
            task.cancel()

    async def health(self) -> Health:
        worker = await self.worker.health()
        in_flight = sum(len(t) for t in self._in_flight.values())
        return Health(worker.healthy, in_flight, {"worker": worker.detail})


class SupervisingDispatcher:
    """Adds restarts and a circuit breaker over another dispatcher.

    A failed dispatch is restarted up to ``max_restarts`` times. ``failure_threshold``
    consecutive failures open the circuit: dispatches are refused with
    :class:`CircuitOpenError` until ``reset_after`` seconds pass, then one trial is let through.
    A superseded refusal is rethrown without a restart and does not count against the circuit
    (losing to another holder is not the target's fault); an earlier genuine failure in the
    same dispatch still counts.
    """

    spi_version = DISPATCHER_SPI_VERSION

    def __init__(
        self,
        target: ExecutionDispatcher,
        *,
        max_restarts: int = 0,
        failure_threshold: int = 5,
        reset_after: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        if max_restarts < 0 or failure_threshold < 1:
            raise ConfigurationError("max_restarts must be >= 0 and failure_threshold >= 1")
        self.target = target
        self.max_restarts = max_restarts
        self.failure_threshold = failure_threshold
        self.reset_after = reset_after
        self.clock = clock or SystemClock()
        self.consecutive_failures = 0
        self.opened_at: float | None = None
        self.restarts = 0

    @property
    def circuit_open(self) -> bool:
        if self.opened_at is None:
            return False
        return self.clock.now() - self.opened_at < self.reset_after

    def _failed(self) -> None:
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.failure_threshold:
            self.opened_at = self.clock.now()

    async def dispatch(self, package: ExecutionPackage) -> ExecutionResult:
        eid = package.execution_id
        restarts = 0
        while True:
            if self.circuit_open:
                raise CircuitOpenError(
                    f"circuit open after {self.consecutive_failures} consecutive failures; "
                    f"{eid!r} was not dispatched",
                    execution_id=eid,
                )
            try:
                result = await self.target.dispatch(package)
            except Exception as exc:
                if is_superseded_refusal(exc, eid):
                    raise
                self._failed()
                if restarts >= self.max_restarts or self.circuit_open:
                    raise
                restarts += 1
                self.restarts += 1
                package = mark_redispatch(package)
                log.warning(
                    "restarting dispatch of %s (%d/%d): %r", eid, restarts, self.max_restarts, exc
                )
                continue
            self.consecutive_failures = 0
            self.opened_at = None
            return result

    async def cancel(self, execution_id: str) -> None:
        await self.target.cancel(execution_id)

    async def health(self) -> Health:
        inner = await self.target.health()
        return Health(
            inner.healthy and not self.circuit_open,
            inner.in_flight,
            {
                "circuit": "open" if self.circuit_open else "closed",
                "consecutive_failures": self.consecutive_failures,
                "target": inner.detail,
            },
        )
