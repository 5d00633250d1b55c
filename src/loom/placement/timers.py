"""Waking timers through a dispatcher: the multi-node TimerService."""

from __future__ import annotations

from typing import Any

from loom.errors import LoomError
from loom.model import WaitOutcome
from loom.placement._spi import ExecutionDispatcher, is_superseded_refusal
from loom.placement.local import timer_package
from loom.runtime.timers import TimerService, WakeOutcome
from loom.storage import Timer, TimerStore

__all__ = ["dispatching_timer_service"]


def dispatching_timer_service(
    store: TimerStore, dispatcher: ExecutionDispatcher, **options: Any
) -> TimerService:
    """A :class:`TimerService` that wakes each due timer by dispatching a timer package.

    The worker fires the wait under the fence its allocate took (a fenced wake), so a wake
    racing a resume or a cancel cannot double-drive the execution. A superseded refusal means
    another holder has the execution: the timer's wait is no longer this service's to end.
    """

    async def wake(timer: Timer) -> WakeOutcome:
        try:
            result = await dispatcher.dispatch(timer_package(timer))
        except LoomError as exc:
            if is_superseded_refusal(exc, timer.execution_id):
                return WakeOutcome.STALE
            raise
        state = result.folded
        op = state.ops.get(timer.position)
        outcome = op.outcome if op is not None else None
        if outcome is not None:
            # A sleep ends only by its timer; a gate also by a decision, which is not ours.
            return WakeOutcome.STALE if outcome is WaitOutcome.DECIDED else WakeOutcome.FIRED
        if state.is_terminal:
            return WakeOutcome.STALE
        # Still waiting (not due by the worker's clock), or the wait is not logged yet (its
        # timer is stored first): hand the timer back for a later try, never drop it.
        return WakeOutcome.EARLY

    return TimerService(store, wake, **options)
