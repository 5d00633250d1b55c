"""no_live_holder: a recover_abandoned predicate that asks the HTTP workers what they hold."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from loom.model import ExecutionState
from loom.placement.http._errors import RemoteWorkerError

__all__ = ["HoldsExecutions", "no_live_holder"]

log = logging.getLogger("loom.placement.http")


class HoldsExecutions(Protocol):
    """A worker that can say which executions it is running (RemoteWorkerRuntime,
    CloudRunWorkerRuntime)."""

    async def in_flight(self) -> set[str]: ...


def no_live_holder(
    workers: Sequence[HoldsExecutions], *, unreachable_is_dead: bool
) -> Callable[[ExecutionState], Awaitable[bool]]:
    """An ``is_abandoned`` predicate for :func:`loom.recover_abandoned`: True when no worker
    in ``workers`` reports an attempt on the execution (``GET /inflight``).

    It asks every worker afresh for each execution, right when the pass decides, so an
    execution a live worker picked up after the pass began is not claimed.

    ``unreachable_is_dead`` is required, because it is the deployment's call: True treats a
    worker that cannot be reached at all (connection refused, timeout) as dead, so what it held
    is recovered; if it was only partitioned away, its in-flight step may run twice (fencing
    still keeps the log whole). False leaves such executions for a later pass. A worker that
    answers but refuses (401, 5xx) is never taken for dead.

    ``workers`` must list every worker that can hold executions of this store: a worker that
    is not asked cannot object.
    """

    async def is_abandoned(state: ExecutionState) -> bool:
        for worker in workers:
            try:
                held = await worker.in_flight()
            except RemoteWorkerError as exc:
                if exc.unreachable and unreachable_is_dead:
                    log.info("worker %r is unreachable: taken for dead", worker)
                    continue
                log.warning("cannot tell who holds %s: %r", state.execution_id, exc)
                return False
            except Exception as exc:
                log.warning("cannot tell who holds %s: %r", state.execution_id, exc)
                return False
            if state.execution_id in held:
                return False
        return True

    return is_abandoned
