"""The pure fold ``replay(envelopes) -> ExecutionState``: one small reducer per event type.

``apply_event`` checks what holds for every event (its execution, its sequence, nothing after a
terminal event), looks the type's reducer up in the registry and lets it fold the typed
payload. Loom's own reducers are registered here; an extension registers its own with
:func:`~loom.model.register_event` and never edits this module.
"""

from __future__ import annotations

from collections.abc import Iterable

from loom.errors import CorruptEventError, LoomError
from loom.model._events import Envelope, EventType, ExecutionStatus, unknown_event
from loom.model._registry import _register, lookup
from loom.model._state import ExecutionState, Gate, OpKind, OpRecord, OpStatus
from loom.model._vocabulary import (
    DecisionRecorded,
    ExecutionCancelled,
    ExecutionCompleted,
    ExecutionFailed,
    ExecutionForked,
    ExecutionRecovered,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    StepCompleted,
    StepFailed,
    StepStarted,
    TimerFired,
    TimerScheduled,
    UIPatched,
)

__all__ = ["apply_event", "replay"]


def _bad(state: ExecutionState, env: Envelope, why: str) -> CorruptEventError:
    return CorruptEventError(
        f"cannot fold event {env.sequence} ({env.type}) of execution {state.execution_id!r}: {why}",
        execution_id=state.execution_id,
        sequence=env.sequence,
    )


def apply_event(state: ExecutionState, env: Envelope) -> None:
    """Fold one envelope into ``state`` in place. Total: anything unexpected raises.

    An event type no reducer is registered for raises :class:`UnknownEventError`; a record
    that cannot follow the state (or a payload its type cannot read) raises
    :class:`CorruptEventError`.
    """
    if env.execution_id != state.execution_id:
        raise _bad(state, env, f"it belongs to execution {env.execution_id!r}")
    if env.sequence != state.last_sequence + 1:
        raise _bad(state, env, f"expected sequence {state.last_sequence + 1}")
    entry = lookup(env.type)
    if entry is None:
        raise unknown_event(state.execution_id, env.sequence, env.type)
    if env.sequence == 0:
        if env.type is not EventType.EXECUTION_STARTED:
            raise _bad(state, env, "sequence 0 must be EXECUTION_STARTED")
    elif state.status in _ENDED:
        raise _bad(state, env, f"the execution is already {state.status}")
    try:
        event = env.typed
        if event is None:  # read from a store: decode (not cached; each event folds once)
            event = entry.decode(env.payload)
        entry.reducer(state, event, env)
    except LoomError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _bad(state, env, f"malformed payload ({exc})") from exc
    state.last_sequence = env.sequence
    state.updated_at = env.recorded_at
    state.fence = env.fence


_ENDED = frozenset({ExecutionStatus.COMPLETED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED})


def replay(
    envelopes: Iterable[Envelope],
    *,
    initial: ExecutionState | None = None,
    execution_id: str | None = None,
) -> ExecutionState:
    """Fold ``envelopes`` (in sequence order) into a new :class:`ExecutionState`.

    Pure: ``initial`` (a snapshot's state) is copied, never mutated. An out-of-order sequence,
    an event after a terminal one or a malformed payload raises :class:`CorruptEventError`; an
    event type this process cannot fold raises :class:`UnknownEventError`.
    """
    state: ExecutionState | None = initial.copy() if initial is not None else None
    for env in envelopes:
        if state is None:
            state = ExecutionState(execution_id or env.execution_id)
        apply_event(state, env)
    if state is None:
        if execution_id is None:
            raise ValueError("replay() of no envelopes needs an execution_id")
        state = ExecutionState(execution_id)
    return state


# ---------------------------------------------------------------------- Loom's own reducers


def _started(state: ExecutionState, e: ExecutionStarted, env: Envelope) -> None:
    state.flow_id = e.flow_id
    state.flow_version = e.flow_version
    state.input = e.input
    state.metadata = dict(e.metadata)
    state.status = ExecutionStatus.RUNNING
    state.started_at = env.recorded_at


# Bound once: the step reducers run for nearly every event of a log.
_STEP = OpKind.STEP
_COMPLETED = OpStatus.COMPLETED


def _already_completed(state: ExecutionState, env: Envelope, pos: int) -> CorruptEventError:
    return _bad(state, env, f"step at position {pos} already completed")


def _step_started(state: ExecutionState, e: StepStarted, env: Envelope) -> None:
    op = state.ops.get(e.position)
    if op is not None and op.status is _COMPLETED:
        raise _already_completed(state, env, e.position)
    if op is None:
        state.ops[e.position] = OpRecord(
            OpKind.STEP, e.step_id, OpStatus.STARTED, None, None, e.attempt
        )
    else:
        op.attempts = e.attempt
        op.status = OpStatus.STARTED


def _step_completed(state: ExecutionState, e: StepCompleted, env: Envelope) -> None:
    ops = state.ops
    pos = e.position
    op = ops.get(pos)
    if op is not None and op.status is _COMPLETED:
        raise _already_completed(state, env, pos)
    annotations = e.annotations
    ops[pos] = OpRecord(
        _STEP,
        e.step_id,
        _COMPLETED,
        e.output,
        None,
        e.attempt,
        dict(annotations) if annotations is not None else None,
    )


def _step_failed(state: ExecutionState, e: StepFailed, env: Envelope) -> None:
    op = state.ops.get(e.position)
    if op is not None and op.status is _COMPLETED:
        raise _already_completed(state, env, e.position)
    status = OpStatus.FAILED if e.final else OpStatus.RETRYING
    error = dict(e.error) if e.error is not None else None
    state.ops[e.position] = OpRecord(OpKind.STEP, e.step_id, status, None, error, e.attempt)


def _suspended(state: ExecutionState, e: ExecutionSuspended, env: Envelope) -> None:
    pos = e.position
    if e.timer:
        # A durable sleep: TIMER_SCHEDULED named the op; the suspension makes it wait.
        op = state.ops.get(pos) or OpRecord(OpKind.TIMER, "sleep", OpStatus.SCHEDULED)
        op.status = OpStatus.WAITING
        state.ops[pos] = op
    else:
        state.ops[pos] = OpRecord(OpKind.GATE, e.event_type, OpStatus.WAITING)
    state.waiting = Gate(pos, e.event_type, e.correlation_key, e.timeout_at)
    state.status = ExecutionStatus.SUSPENDED


def _resolve(
    state: ExecutionState, env: Envelope, pos: int, payload: object, timed_out: bool
) -> None:
    op = state.ops.get(pos)
    if op is None or op.status is not OpStatus.WAITING:
        raise _bad(state, env, f"nothing is waiting at position {pos}")
    op.resolve(payload, timed_out=timed_out)
    state.waiting = None
    state.status = ExecutionStatus.RUNNING


def _resumed(state: ExecutionState, e: ExecutionResumed, env: Envelope) -> None:
    _resolve(state, env, e.position, e.payload, False)
    if e.message_id is not None:
        # Which mailbox message (or keyed resume) the gate took: it decides idempotency.
        state.ops[e.position].output["message_id"] = e.message_id


def _timer_fired(state: ExecutionState, e: TimerFired, env: Envelope) -> None:
    _resolve(state, env, e.position, None, e.timed_out)


def _recovered(state: ExecutionState, e: ExecutionRecovered, env: Envelope) -> None:
    state.recoveries += 1
    state.status = ExecutionStatus.RUNNING


def _timer_scheduled(state: ExecutionState, e: TimerScheduled, env: Envelope) -> None:
    state.ops[e.position] = OpRecord(
        OpKind.TIMER, e.name, OpStatus.SCHEDULED, {"fire_at": e.fire_at}
    )


def _decision(state: ExecutionState, e: DecisionRecorded, env: Envelope) -> None:
    state.ops[e.position] = OpRecord(OpKind.DECISION, e.name, OpStatus.COMPLETED, e.value)


def _ui_patched(state: ExecutionState, e: UIPatched, env: Envelope) -> None:
    key, value = e.key, e.value
    current = state.ui.get(key)
    if e.op == "merge" and isinstance(value, dict) and isinstance(current, dict):
        state.ui[key] = {**current, **value}
    elif e.op in ("set", "merge"):
        state.ui[key] = value
    else:
        raise _bad(state, env, f"unknown UI op {e.op!r}")
    state.ops[e.position] = OpRecord(OpKind.UI, key, OpStatus.COMPLETED)


def _forked(state: ExecutionState, e: ExecutionForked, env: Envelope) -> None:
    state.forked_from = dict(e.source)


def _completed(state: ExecutionState, e: ExecutionCompleted, env: Envelope) -> None:
    state.status = ExecutionStatus.COMPLETED
    state.output = e.output
    state.waiting = None


def _failed(state: ExecutionState, e: ExecutionFailed, env: Envelope) -> None:
    state.status = ExecutionStatus.FAILED
    state.error = dict(e.error) if e.error is not None else None
    state.waiting = None


def _cancelled(state: ExecutionState, e: ExecutionCancelled, env: Envelope) -> None:
    state.status = ExecutionStatus.CANCELLED
    state.cancel_reason = e.reason
    state.waiting = None


_register(EventType.EXECUTION_STARTED, ExecutionStarted, _started)
_register(EventType.STEP_STARTED, StepStarted, _step_started)
_register(EventType.STEP_COMPLETED, StepCompleted, _step_completed)
_register(EventType.STEP_FAILED, StepFailed, _step_failed)
_register(EventType.EXECUTION_SUSPENDED, ExecutionSuspended, _suspended)
_register(EventType.EXECUTION_RESUMED, ExecutionResumed, _resumed)
_register(EventType.EXECUTION_RECOVERED, ExecutionRecovered, _recovered)
_register(EventType.TIMER_SCHEDULED, TimerScheduled, _timer_scheduled)
_register(EventType.TIMER_FIRED, TimerFired, _timer_fired)
_register(EventType.DECISION_RECORDED, DecisionRecorded, _decision)
_register(EventType.UI_PATCHED, UIPatched, _ui_patched)
_register(EventType.EXECUTION_FORKED, ExecutionForked, _forked)
_register(EventType.EXECUTION_COMPLETED, ExecutionCompleted, _completed)
_register(EventType.EXECUTION_FAILED, ExecutionFailed, _failed)
_register(EventType.EXECUTION_CANCELLED, ExecutionCancelled, _cancelled)
