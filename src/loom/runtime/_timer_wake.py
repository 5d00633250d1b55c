"""Timers seen from the runtime: storing one for a wait (and kicking the service when it is
due before its next poll), and the fenced wake that ends a due wait (alone, or as one of a
claimed batch whose states were read together)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loom.errors import LoomError
from loom.model import Envelope, ExecutionState, TimerFired, apply_event
from loom.runtime import _cancel
from loom.runtime._cancel import CANCEL_GRACE_POSITION, DEADLINE_POSITION
from loom.runtime._context import TIMER_EVENT
from loom.runtime._driver import Driver
from loom.runtime._driving import continue_with, launch, new_driver
from loom.runtime._fence import RETRIES, Lease
from loom.runtime._handle import ExecutionHandle
from loom.runtime._sdk import Flow
from loom.runtime.timers import WakeOutcome
from loom.storage import LoadsMany, StoredExecution, TakesOverMany, Timer
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


@dataclass(slots=True)
class _Taken:
    """A wake whose take-over (TIMER_FIRED under the next fence) was committed with its
    batch's: the wake only starts its driver."""

    position: int
    driver: Driver
    flow: Flow[Any, Any]
    woke: str


#: What :func:`prepare_wakes` did for the claimed batch a wake belongs to, by execution id: the
#: state read with the batch, or the take-over committed with it (set in the context the
#: batch's wakes run in; None outside a batch).
_BATCH: ContextVar[dict[str, Loaded | _Taken] | None] = ContextVar("loom_timer_batch", default=None)


async def wake_locally(runtime: WorkflowRuntime, timer: Timer) -> WakeOutcome:
    runtime._check_open()
    batch = _BATCH.get()
    # Popped: a second timer of the same execution in the batch reads afresh.
    entry = None if batch is None else batch.pop(timer.execution_id, None)
    if isinstance(entry, _Taken):
        if entry.position == timer.position:
            launch(runtime, entry.driver, entry.flow)
            _log_fired(timer.execution_id, entry.woke, timer.position, entry.flow)
            return WakeOutcome.FIRED
        assert batch is not None
        batch[timer.execution_id] = entry  # its own timer's wake starts it
        entry = None
    outcome, _ = await fire_timer(runtime, timer.execution_id, timer.position, preloaded=entry)
    return outcome


async def prepare_wakes(runtime: WorkflowRuntime, timers: Sequence[Timer]) -> None:
    """Read the states of a claimed batch's executions at once (one query where the store
    :class:`LoadsMany`), and take over every execution whose wait they show due in one write
    (where the store :class:`TakesOverMany`), for the batch's wakes (run in this context).

    A state read with the batch is trusted only to *fire*: the take-over that ends the wait
    is a compare-and-swap on the fence and the log's end, so it is refused (and the wake
    reads again) if anything moved since. Any other verdict (stale, early) is decided again
    on a fresh read, exactly as a lone wake decides it. A take-over committed here is the
    same write a lone wake makes, durable before its flow runs on (in the wake).
    """
    states: dict[str, Loaded | _Taken] = {}
    states.update(await load_states(runtime, [t.execution_id for t in timers if t.position >= 0]))
    _BATCH.set(states)
    store = runtime.store
    if states and isinstance(store, TakesOverMany):
        await _take_over_batch(runtime, store, timers, states)


async def _take_over_batch(
    runtime: WorkflowRuntime,
    store: TakesOverMany,
    timers: Sequence[Timer],
    states: dict[str, Loaded | _Taken],
) -> None:
    wakes: list[tuple[Timer, Driver, Flow[Any, Any], str, list[Envelope]]] = []
    for timer in timers:
        loaded = states.get(timer.execution_id)
        if not isinstance(loaded, tuple) or _verdict(runtime, loaded[0], timer.position):
            continue
        state, snap_seq = loaded
        gate = state.waiting
        if gate is None or state.fence < 1:
            continue
        try:
            flow = runtime.get_flow(state.flow_id, state.flow_version)
        except LoomError:
            continue  # its wake reports it
        driver = new_driver(runtime, state, state.fence + 1, last_snapshot=snap_seq)
        fired = TimerFired(timer.position, timed_out=gate.event_type != TIMER_EVENT)
        try:
            envelopes = driver.take_over_envelopes([fired], from_fence=state.fence)
        except LoomError:
            continue
        woke = "sleep woke" if gate.event_type == TIMER_EVENT else "gate timed out"
        wakes.append((timer, driver, flow, woke, envelopes))
        # Its state is the driver's now: no wake may start from it again.
        del states[timer.execution_id]
    if not wakes:
        return
    try:
        outcomes = await store.take_over_many([(w[4], w[1].fence - 1) for w in wakes])
    except Exception as exc:
        # Nothing written (or, if the outcome is unknown, found out by each wake's fresh read,
        # which sees its wait ended and leaves the execution to recovery, as a lone wake would).
        log.debug("taking over %d executions at once failed: %r", len(wakes), exc)
        return
    for (timer, driver, flow, woke, envelopes), refusal in zip(wakes, outcomes, strict=True):
        if refusal is None:
            driver.taken_over(envelopes)
            states[timer.execution_id] = _Taken(timer.position, driver, flow, woke)


def _log_fired(execution_id: str, woke: str, position: int, flow: Flow[Any, Any]) -> None:
    log.info(
        "execution %s: %s at position %d",
        execution_id,
        woke,
        position,
        extra={"execution_id": execution_id, "flow_id": flow.id},
    )


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
            woke = "sleep woke" if gate.event_type == TIMER_EVENT else "gate timed out"
            _log_fired(execution_id, woke, position, flow)
            return WakeOutcome.FIRED, handle
    return WakeOutcome.EARLY, None
