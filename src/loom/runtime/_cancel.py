"""Cancellation a flow can react to, and the durable timers that bound an execution.

A flow declared with ``cancel_grace`` is cancelled in two phases: ``runtime.cancel`` records a
``loom.cancel_requested`` event (naming the position where the flow receives the
cancellation) and a timer at the end of the grace period; the flow replays, gets
:class:`~loom.errors.ExecutionCancelledError` at that position, may run compensating steps
(recorded like any others), and ends ``cancelled`` whatever it returns. If it has not ended
when the grace period does, the timer cancels it outright. A flow without ``cancel_grace``
stops at once, as it always did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from loom.errors import ConfigurationError, StaleFenceError, StorageError
from loom.model import Envelope, ExecutionState, ExecutionStatus, OpStatus, Payload, register_event
from loom.runtime.timers import WakeOutcome
from loom.storage import Timer

if TYPE_CHECKING:
    from loom.runtime._runtime import WorkflowRuntime
    from loom.runtime._sdk import Flow

__all__ = [
    "CANCEL_GRACE_POSITION",
    "CANCEL_KEY",
    "CANCEL_REQUESTED",
    "DEADLINE_KEY",
    "DEADLINE_POSITION",
    "CancelRequested",
    "cancel_request",
    "deadline_at",
    "delivery_position",
    "fire_cancel_grace",
    "fire_deadline",
    "request_cancel",
    "schedule_deadline",
]

#: How often a cancel request is retried after losing its fence to another writer.
_RETRIES = 8

#: The event type of a cancel request (a flow with ``cancel_grace`` cleans up, then ends).
CANCEL_REQUESTED = "loom.cancel_requested"
#: Where the fold keeps the request in ``ExecutionState.metadata``.
CANCEL_KEY = "loom.cancel_requested"
#: Where the start record's metadata keeps an execution deadline (epoch seconds).
DEADLINE_KEY = "loom.deadline"
#: Timer positions of an execution's own timers (wait positions start at 0).
DEADLINE_POSITION = -1
CANCEL_GRACE_POSITION = -2


@dataclass(frozen=True, slots=True)
class CancelRequested(Payload):
    """A cancel the flow may react to: delivered at ``at_position``; by ``until`` (epoch
    seconds) a timer ends the execution whatever it is doing."""

    reason: str | None
    at_position: int
    until: float


def _cancel_requested(state: ExecutionState, e: CancelRequested, env: Envelope) -> None:
    if not isinstance(e.at_position, int) or e.at_position < 0:
        raise ValueError("a cancel request needs a valid 'at_position'")
    state.metadata = {
        **state.metadata,
        CANCEL_KEY: {"reason": e.reason, "at_position": e.at_position, "until": e.until},
    }
    # A wait the flow was suspended on is where it now receives the cancellation.
    state.waiting = None
    state.status = ExecutionStatus.RUNNING


register_event(CANCEL_REQUESTED, CancelRequested, _cancel_requested)


def cancel_request(state: ExecutionState) -> dict[str, Any] | None:
    """The execution's pending cancel request, if one was recorded."""
    request = state.metadata.get(CANCEL_KEY)
    return request if isinstance(request, dict) else None


_UNFINISHED = (OpStatus.STARTED, OpStatus.RETRYING, OpStatus.WAITING, OpStatus.SCHEDULED)


def delivery_position(state: ExecutionState) -> int:
    """Where the flow receives a cancellation requested now: the operation it is waiting on or
    running (the first unfinished one the log knows), else the next one it will take."""
    unfinished = [p for p, op in state.ops.items() if op.status in _UNFINISHED]
    if unfinished:
        return min(unfinished)
    return max(state.ops) + 1 if state.ops else 0


async def request_cancel(
    rt: WorkflowRuntime, execution_id: str, reason: str | None, flow: Flow[Any, Any], grace: float
) -> ExecutionState:
    """Record a cancel request the flow reacts to, bounded by a durable grace timer."""
    until = rt.clock.now() + grace
    # The bound is durable before the request: a crash in between leaves a timer that
    # cancels outright at ``until`` (what a flow without cleanup gets at once).
    await schedule_deadline(
        rt, Timer(execution_id, CANCEL_GRACE_POSITION, until, "cancel_grace", flow.id)
    )
    for _ in range(_RETRIES):
        live = rt._drivers.get(execution_id)
        if live is not None:
            live.cancel_requested = True
            live.stop_reason = "cancelled"  # its handle follows the cleaning-up holder
        fence = await rt.store.acquire_fence(execution_id)
        state, snap_seq = await rt._require(execution_id)
        if state.is_terminal:
            return state
        driver = rt._new_driver(state, fence, last_snapshot=snap_seq)
        try:
            await driver.append([CancelRequested(reason, delivery_position(state), until)])
        except StaleFenceError as exc:
            if exc.execution_id != execution_id:
                raise
            continue
        requested = driver.state.copy()
        rt._launch(driver, flow)
        return requested
    raise StorageError(
        f"could not cancel {execution_id!r}: it kept changing", execution_id=execution_id
    )


def deadline_at(rt: WorkflowRuntime, deadline: timedelta | float | datetime) -> float:
    """Epoch seconds of a deadline given as a duration from now or an aware datetime."""
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None:
            raise ConfigurationError("a deadline datetime must be timezone-aware")
        return deadline.timestamp()
    seconds = deadline.total_seconds() if isinstance(deadline, timedelta) else float(deadline)
    if not math.isfinite(seconds):
        raise ConfigurationError(f"a deadline must be a finite number of seconds, not {seconds!r}")
    if seconds <= 0:
        raise ConfigurationError("a deadline must lie in the future")
    now: float = rt.clock.now()
    return now + seconds


async def schedule_deadline(rt: WorkflowRuntime, timer: Timer) -> None:
    """Store one of the execution's own timers (deadline, cancel grace)."""
    if rt._timer_store is None:
        raise ConfigurationError(
            f"execution {timer.execution_id!r} asks for a deadline, but this runtime's "
            "store keeps no timers",
            execution_id=timer.execution_id,
            hint="Use a store that implements TimerStore (memory, SQLite, PostgreSQL)",
        )
    await rt._schedule_timer(timer)


async def fire_deadline(rt: WorkflowRuntime, execution_id: str) -> WakeOutcome:
    """The deadline timer: cancel the execution (gracefully if its flow allows) once due."""
    state = await rt.load_state(execution_id)
    if state is None or state.is_terminal:
        return WakeOutcome.STALE
    at = state.metadata.get(DEADLINE_KEY)
    if not isinstance(at, int | float):
        return WakeOutcome.STALE  # not this execution's timer (an id reused after a crash)
    if rt.clock.now() < at:
        return WakeOutcome.EARLY
    when = datetime.fromtimestamp(at, UTC).isoformat()
    ended = await rt.cancel(execution_id, reason=f"deadline exceeded ({when})")
    return WakeOutcome.FIRED if ended.status is ExecutionStatus.CANCELLED else WakeOutcome.STALE


async def fire_cancel_grace(rt: WorkflowRuntime, execution_id: str) -> WakeOutcome:
    """The end of a cleanup's grace period: cancel outright if the flow has not ended."""
    state = await rt.load_state(execution_id)
    request = None if state is None or state.is_terminal else cancel_request(state)
    if state is None or request is None:
        return WakeOutcome.STALE
    if rt.clock.now() < float(request["until"]):
        return WakeOutcome.EARLY
    why = request.get("reason")
    ended = await rt._hard_cancel(
        execution_id, f"{why or 'cancelled'} (cleanup did not finish within its grace period)"
    )
    return WakeOutcome.FIRED if ended.status is ExecutionStatus.CANCELLED else WakeOutcome.STALE
