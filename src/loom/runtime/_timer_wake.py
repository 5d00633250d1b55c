"""Timers seen from the runtime: storing one for a wait (and kicking the service when it is
due before its next poll), and the fenced wake that ends a due wait."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from loom.model import TimerFired
from loom.runtime import _cancel
from loom.runtime._cancel import CANCEL_GRACE_POSITION, DEADLINE_POSITION
from loom.runtime._context import TIMER_EVENT
from loom.runtime._driving import continue_with
from loom.runtime._fence import RETRIES, Lease
from loom.runtime._handle import ExecutionHandle
from loom.runtime.timers import WakeOutcome
from loom.storage import Timer

if TYPE_CHECKING:
    from loom.runtime._runtime import WorkflowRuntime

log = logging.getLogger("loom.runtime")


async def schedule_timer(runtime: WorkflowRuntime, timer: Timer) -> None:
    assert runtime._timer_store is not None
    await runtime._timer_store.schedule_timer(timer)
    runtime._first_use()
    if (
        runtime.timers is not None
        and runtime.timers.running
        and timer.fire_at <= runtime.clock.now() + runtime.timers.poll_interval
    ):
        runtime.timers.kick()  # due before the next poll: look now


async def wake_locally(runtime: WorkflowRuntime, timer: Timer) -> WakeOutcome:
    outcome, _ = await runtime.fire_timer(timer.execution_id, timer.position)
    return outcome


async def fire_timer(
    runtime: WorkflowRuntime, execution_id: str, position: int, *, holder: Lease | None = None
) -> tuple[WakeOutcome, ExecutionHandle[Any] | None]:
    if position == DEADLINE_POSITION:
        return await _cancel.fire_deadline(runtime, execution_id), None
    if position == CANCEL_GRACE_POSITION:
        return await _cancel.fire_cancel_grace(runtime, execution_id), None
    for attempt in range(RETRIES):
        state, snap_seq = await runtime._load(execution_id)
        if state is None or state.is_terminal:
            return WakeOutcome.STALE, None
        op = state.ops.get(position)
        if op is not None and op.outcome is not None:
            return WakeOutcome.STALE, None
        gate = state.waiting
        if gate is None or gate.position != position or gate.timeout_at is None:
            return WakeOutcome.EARLY, None  # the wait is not in the log (yet)
        if runtime.clock.now() < gate.timeout_at:
            return WakeOutcome.EARLY, None
        flow = runtime.get_flow(state.flow_id, state.flow_version)
        fired = TimerFired(position, timed_out=gate.event_type != TIMER_EVENT)
        # The fence of the log's last event is nearly always the current one (the holder
        # that suspended wrote it): trying it first saves a read per wake. The take-over
        # is a compare-and-swap, so a wrong guess changes nothing and the retry reads it.
        guess = state.fence if attempt == 0 and holder is None and state.fence > 0 else None
        handle = await continue_with(
            runtime, state, snap_seq, holder, fired, flow, from_fence=guess
        )
        if handle is not None:
            log.info(
                "execution %s: %s at position %d",
                execution_id,
                "sleep woke" if gate.event_type == TIMER_EVENT else "gate timed out",
                position,
                extra={"execution_id": execution_id, "flow_id": flow.id},
            )
            return WakeOutcome.FIRED, handle
    return WakeOutcome.EARLY, None
