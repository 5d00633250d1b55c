"""FailoverWorkerRuntime: spread attempts over several workers; a retry goes elsewhere."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence

from loom.errors import ConfigurationError
from loom.placement._spi import Health, WorkerLease, WorkerRuntime, is_superseded_refusal
from loom.placement._wire import ExecutionPackage, ExecutionResult

__all__ = ["FailoverWorkerRuntime"]

log = logging.getLogger("loom.placement.http")

_MAX_REMEMBERED = 10_000


class FailoverWorkerRuntime:
    """A WorkerRuntime over several workers: round-robin placement, failover on retry.

    Each ``allocate`` picks the next worker in turn, skipping those that already failed an
    attempt on the same execution (so the dispatcher's retry after a dead or wedged worker
    lands on another one) and those cooling down after they could not be reached (connection
    errors, timeouts: ``cooldown`` seconds). When every worker is excluded, it tries them all
    again in turn rather than refusing.

    Pair it with a dispatcher that retries: ``LocalDispatcher(FailoverWorkerRuntime([a, b]),
    max_attempts=2, execute_timeout=...)``. A superseded refusal is passed through untouched
    and never counts against a worker (another holder won; the worker did nothing wrong).
    """

    def __init__(
        self,
        workers: Sequence[WorkerRuntime],
        *,
        name: str = "failover",
        cooldown: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not workers:
            raise ConfigurationError("FailoverWorkerRuntime needs at least one worker")
        self.workers = list(workers)
        self.name = name
        self.cooldown = cooldown
        self._clock = clock
        self._turn = itertools.count()
        self._leases: dict[str, tuple[int, WorkerLease]] = {}
        self._failed_for: OrderedDict[str, set[int]] = OrderedDict()
        self._cooling_until: dict[int, float] = {}

    def _order(self, execution_id: str) -> list[int]:
        n = len(self.workers)
        start = next(self._turn) % n
        rotation = [(start + i) % n for i in range(n)]
        failed = self._failed_for.get(execution_id, set())
        now = self._clock()
        # Stable sort: healthy workers first in round-robin order, excluded ones last.
        return sorted(
            rotation,
            key=lambda i: (i in failed, self._cooling_until.get(i, 0.0) > now),
        )

    def _failed(self, execution_id: str, index: int, exc: BaseException) -> None:
        self._failed_for.setdefault(execution_id, set()).add(index)
        self._failed_for.move_to_end(execution_id)
        while len(self._failed_for) > _MAX_REMEMBERED:
            self._failed_for.popitem(last=False)
        if len(self._failed_for[execution_id]) >= len(self.workers):
            del self._failed_for[execution_id]  # every worker failed it: start afresh
        if isinstance(exc, asyncio.CancelledError) or getattr(exc, "unreachable", False):
            self._cooling_until[index] = self._clock() + self.cooldown

    async def allocate(self, package: ExecutionPackage) -> WorkerLease:
        eid = package.execution_id
        last: Exception | None = None
        for index in self._order(eid):
            try:
                inner = await self.workers[index].allocate(package)
            except Exception as exc:
                if is_superseded_refusal(exc, eid):
                    raise
                self._failed(eid, index, exc)
                last = exc
                continue
            lease = WorkerLease(uuid.uuid4().hex, eid, inner.fence, f"{self.name}:{inner.worker}")
            self._leases[lease.lease_id] = (index, inner)
            return lease
        assert last is not None
        raise last

    async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
        index, inner = self._leases[lease.lease_id]
        eid = package.execution_id
        try:
            result = await self.workers[index].execute(inner, package)
        except BaseException as exc:
            # A CancelledError here is usually the dispatcher's execute_timeout: a wedged
            # worker, so it counts against the worker as much as a refused connection does.
            if not (isinstance(exc, Exception) and is_superseded_refusal(exc, eid)):
                self._failed(eid, index, exc)
                log.info("attempt on %s failed on worker %d: %r", eid, index, exc)
            raise
        self._failed_for.pop(eid, None)
        self._cooling_until.pop(index, None)
        return result

    async def release(self, lease: WorkerLease) -> None:
        entry = self._leases.pop(lease.lease_id, None)
        if entry is not None:
            index, inner = entry
            await self.workers[index].release(inner)

    async def health(self) -> Health:
        healths = await asyncio.gather(*(w.health() for w in self.workers), return_exceptions=True)
        details: list[object] = []
        healthy = False
        in_flight = 0
        for h in healths:
            if isinstance(h, BaseException):
                details.append({"error": repr(h)})
                continue
            healthy = healthy or h.healthy
            in_flight += h.in_flight
            details.append({"healthy": h.healthy, **h.detail})
        return Health(healthy, in_flight, {"workers": details})
