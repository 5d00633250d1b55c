"""Timers seen from the runtime: storing one for a wait (and kicking the service when it is
due before its next poll), and the fenced wake that ends a due wait (alone, or as one of a
claimed batch whose states were read together)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from loom.errors import LoomError
from loom.model import ExecutionState, TimerFired, apply_event
from loom.runtime import _cancel
from loom.runtime._cancel import CANCEL_GRACE_POSITION, DEADLINE_POSITION
from loom.runtime._context import TIMER_EVENT
from loom.runtime._driving import continue_with
from loom.runtime._fence import RETRIES, Lease
from loom.runtime._handle import ExecutionHandle
from loom.runtime.timers import WakeOutcome
from loom.storage import LoadsMany, StoredExecution, Timer
from loom.storage._common import validate_snapshot

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


Loaded = tuple[ExecutionState, int]

#: The states read with the claimed batch a wake belongs to, by execution id (set by
#: :func:`prepare_wakes` in the context the batch's wakes run in; None outside a batch).
_BATCH: ContextVar[dict[str, Loaded] | None] = ContextVar("loom_timer_batch", default=None)


async def wake_locally(runtime: WorkflowRuntime, timer: Timer) -> WakeOutcome:
    runtime._check_open()
    batch = _BATCH.get()
    # Popped: a second timer of the same execution in the batch reads afresh.
    preloaded = None if batch is None else batch.pop(timer.execution_id, None)
    outcome, _ = await fire_timer(runtime, timer.execution_id, timer.position, preloaded=preloaded)
    return outcome


async def prepare_wakes(runtime: WorkflowRuntime, timers: Sequence[Timer]) -> None:
    """Read the states of a claimed batch's executions at once (one query where the store
    :class:`LoadsMany`), for the batch's wakes (run in this context) to start from.

    A state read with the batch is trusted only to *fire*: the take-over that ends the wait
    is a compare-and-swap on the fence and the log's end, so it fails (and the wake reads
    again) if anything moved since. Any other verdict (stale, early) is decided again on a
    fresh read, exactly as a lone wake decides it.
    """
    _BATCH.set(await load_states(runtime, [t.execution_id for t in timers if t.position >= 0]))


async def load_states(runtime: WorkflowRuntime, execution_ids: Sequence[str]) -> dict[str, Loaded]:
    """The folded states (and snapshot sequences) of the executions the store reads in one
    go; empty when it cannot (each wake then loads its own). An execution whose records do
    not fold cleanly is left out: its own load reports why."""
    store = runtime.store
    if not execution_ids or not isinstance(store, LoadsMany):
        return {}
    try:
        stored = await store.load_many(execution_ids)
    except LoomError as exc:
        log.debug(
            "reading %d executions at once failed; each is read alone: %r", len(execution_ids), exc
        )
        return {}
    states: dict[str, Loaded] = {}
    for eid, one in stored.items():
        try:
            states[eid] = _fold(one)
        except LoomError:
            continue
    return states


def _fold(stored: StoredExecution) -> Loaded:
    """The state ``stored`` describes (as ``WorkflowRuntime._load`` folds it)."""
    state, snap_seq = ExecutionState(stored.execution_id), -1
    if stored.snapshot is not None:
        state = validate_snapshot(
            stored.snapshot, stored.execution_id, last_sequence=stored.last_sequence
        )
        snap_seq = stored.snapshot.sequence
    for env in stored.events:
        apply_event(state, env)
    return state, snap_seq


def _verdict(
    runtime: WorkflowRuntime, state: ExecutionState | None, position: int
) -> WakeOutcome | None:
    """What a wake of the wait at ``position`` does given ``state``: None to fire it."""
    if state is None or state.is_terminal:
        return WakeOutcome.STALE
    op = state.ops.get(position)
    if op is not None and op.outcome is not None:
        return WakeOutcome.STALE
    gate = state.waiting
    if gate is None or gate.position != position or gate.timeout_at is None:
        return WakeOutcome.EARLY  # the wait is not in the log (yet)
    if runtime.clock.now() < gate.timeout_at:
        return WakeOutcome.EARLY
    return None


async def fire_timer(
    runtime: WorkflowRuntime,
    execution_id: str,
    position: int,
    *,
    holder: Lease | None = None,
    preloaded: Loaded | None = None,
) -> tuple[WakeOutcome, ExecutionHandle[Any] | None]:
    if position == DEADLINE_POSITION:
        return await _cancel.fire_deadline(runtime, execution_id), None
    if position == CANCEL_GRACE_POSITION:
        return await _cancel.fire_cancel_grace(runtime, execution_id), None
    for attempt in range(RETRIES):
        if preloaded is not None and _verdict(runtime, preloaded[0], position) is None:
            state, snap_seq = preloaded
        else:
            loaded, snap_seq = await runtime._load(execution_id)
            verdict = _verdict(runtime, loaded, position)
            if verdict is not None or loaded is None:
                return verdict or WakeOutcome.STALE, None
            state = loaded
        preloaded = None
        gate = state.waiting
        assert gate is not None  # _verdict saw it
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
