"""The commands that move an execution from outside its flow: start, resume, recover and
an outright cancel. Each reads the log, checks the command against it and appends under a
held lease or a conditional take-over, then drives the flow on (see ``_driving``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import pydantic
import pydantic_core

from loom import faults
from loom.errors import (
    ExecutionAlreadyExistsError,
    ExecutionSupersededError,
    GateTimedOutError,
    NotWaitingError,
    PayloadError,
    ResumeValidationError,
    StaleFenceError,
    StorageError,
)
from loom.model import (
    EventPayload,
    ExecutionCancelled,
    ExecutionRecovered,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionState,
    ExecutionStatus,
    Gate,
    OpKind,
    WaitOutcome,
    encode_json,
    new_envelope_id,
)
from loom.runtime import _cancel, _children, _mailbox
from loom.runtime._cancel import DEADLINE_KEY, DEADLINE_POSITION
from loom.runtime._context import TIMER_EVENT
from loom.runtime._driving import continue_with, launch, new_driver
from loom.runtime._fence import RETRIES, Lease, check_id, held
from loom.runtime._fork import refuse_superseded
from loom.runtime._gates import GateRecord, gate_validator
from loom.runtime._handle import ExecutionHandle
from loom.runtime._sdk import _NOT_JSON, Flow, json_dump
from loom.storage import Timer

if TYPE_CHECKING:
    from loom.runtime._runtime import WorkflowRuntime

log = logging.getLogger("loom.runtime")

OutputT = TypeVar("OutputT")


async def attach(
    runtime: WorkflowRuntime, flow: Flow[Any, OutputT] | str, execution_id: str
) -> ExecutionHandle[OutputT]:
    state, _ = await runtime._require(execution_id)
    flow_id = flow if isinstance(flow, str) else flow.id
    if state.flow_id != flow_id:
        raise ExecutionAlreadyExistsError(
            f"execution {execution_id!r} exists and runs flow {state.flow_id!r}, not "
            f"{flow_id!r}; cannot attach",
            execution_id=execution_id,
            hint="Pick another execution id",
        )
    log.info("start of %s attached to the existing execution", execution_id)
    return runtime.handle(execution_id)


async def start(
    runtime: WorkflowRuntime,
    flow: Flow[Any, OutputT] | str,
    input: Any,
    execution_id: str | None,
    holder: Lease | None,
    metadata: dict[str, Any] | None,
    flow_version: str | None,
    deadline: timedelta | float | datetime | None = None,
) -> ExecutionHandle[OutputT]:
    resolved = runtime.get_flow(flow, flow_version) if isinstance(flow, str) else flow
    if isinstance(flow, Flow) and runtime._flows.get(flow.id, {}).get(flow.version) is not flow:
        runtime.register(flow)
    # Time-ordered by default: new executions land at the right edge of the store's indexes
    # instead of dirtying a random page each (measured: random ids halve throughput once
    # the database outgrows its page cache).
    if holder is not None:
        execution_id = held(holder, execution_id)
    execution_id = execution_id or new_envelope_id()
    check_id(execution_id)
    encoded = resolved.encode_input(input, execution_id, limits=runtime.limits)
    if deadline is not None:
        at = _cancel.deadline_at(runtime, deadline)
        metadata = {**(metadata or {}), DEADLINE_KEY: at}
        if await runtime.store.last_sequence(execution_id) < 0:
            # Stored before the start, like every timer before its wait: a crash between
            # the two leaves a timer that finds nothing (harmless), never an execution
            # whose deadline nothing enforces. (An existing id's timer is left alone.)
            await _cancel.schedule_deadline(
                runtime, Timer(execution_id, DEADLINE_POSITION, at, "deadline", resolved.id)
            )
    started = [ExecutionStarted(resolved.id, resolved.version, encoded, metadata or {})]
    try:
        fence = holder.fence if holder is not None else 0
        driver = new_driver(runtime, ExecutionState(execution_id), fence, last_snapshot=-1)
        if holder is not None:
            await driver.append(started)
        else:
            # One atomic write takes the first fence and records sequence 0. An existing
            # execution is refused without being fenced, so a duplicate start can never
            # evict a live holder; a fence taken by someone who wrote nothing is taken
            # over (that holder's own start then loses cleanly).
            current = 0
            for _ in range(RETRIES):
                try:
                    await driver.take_over(started, from_fence=current)
                    break
                except StaleFenceError as exc:
                    if exc.execution_id != execution_id:
                        raise
                    current = await runtime.store.current_fence(execution_id)
            else:
                raise StorageError(
                    f"could not start {execution_id!r}: its fence kept moving",
                    execution_id=execution_id,
                    hint="Another process is fencing this id; retry the start",
                )
    except PayloadError as exc:
        raise PayloadError(exc.message, execution_id=execution_id) from exc
    faults.hit("after_start_before_drive")
    return launch(runtime, driver, resolved)


async def resume(
    runtime: WorkflowRuntime,
    execution_id: str,
    event_type: str,
    payload: Any = None,
    *,
    holder: Lease | None = None,
    position: int | None = None,
    idempotency_key: str | None = None,
) -> ExecutionHandle[Any]:
    message_id = None if idempotency_key is None else _mailbox.keyed_id(idempotency_key)
    for _ in range(RETRIES):
        state, snap_seq = await runtime._require(execution_id)
        if message_id is not None and _mailbox.taken(state, message_id) is not None:
            return ExecutionHandle(runtime, execution_id, runtime._drivers.get(execution_id))
        gate = waiting_gate(runtime, state, event_type)
        if position is not None and gate.position != position:
            raise NotWaitingError(
                f"execution {execution_id!r} waits for {event_type!r} at gate position "
                f"{gate.position}, not {position}: the decision is for another gate",
                execution_id=execution_id,
                hint=f"Nothing was recorded; see `loom show {execution_id}`",
                waiting_position=gate.position,
                position=position,
            )
        flow = runtime.get_flow(state.flow_id, state.flow_version)
        normalized = validate_resume(runtime, flow, state, event_type, payload)
        validator = gate_validator(event_type)
        extra: Sequence[EventPayload] = ()
        if validator is not None:
            normalized = validator(state, gate, normalized)
            if isinstance(normalized, GateRecord):
                normalized, extra = normalized.payload, normalized.events
        resumed = ExecutionResumed(gate.position, event_type, normalized, message_id)
        handle = await continue_with(runtime, state, snap_seq, holder, resumed, flow, extra=extra)
        if handle is not None:
            return handle
        # another decision or holder moved first: look again
    raise NotWaitingError(
        f"execution {execution_id!r} kept changing while resuming; try again",
        execution_id=execution_id,
    )


def waiting_gate(runtime: WorkflowRuntime, state: ExecutionState, event_type: str) -> Gate:
    eid = state.execution_id
    gate = state.waiting
    _children.refuse_outside_answer(eid, event_type)
    if event_type == TIMER_EVENT:
        raise NotWaitingError(
            f"{TIMER_EVENT!r} is a durable sleep of execution {eid!r}, not a gate: only its "
            "timer ends it (never early)",
            execution_id=eid,
        )
    if (
        gate is not None
        and gate.event_type == event_type
        and state.status is ExecutionStatus.SUSPENDED
    ):
        if gate.timeout_at is not None and runtime.clock.now() >= gate.timeout_at:
            raise GateTimedOutError(
                f"gate {event_type!r} of execution {eid!r} timed out; the decision is refused",
                execution_id=eid,
                event_type=event_type,
            )
        return gate
    # Not waiting for this event: say why as precisely as the log allows.
    refuse_superseded(state, event_type)
    if any(
        op.kind == OpKind.GATE and op.name == event_type and op.outcome is WaitOutcome.TIMED_OUT
        for op in state.ops.values()
    ):
        raise GateTimedOutError(
            f"gate {event_type!r} of execution {eid!r} already timed out; the decision is refused",
            execution_id=eid,
            event_type=event_type,
        )
    if state.is_terminal:
        raise NotWaitingError(
            f"execution {eid!r} is {state.status}; it waits for nothing",
            execution_id=eid,
            status=state.status.value,
        )
    if gate is None or state.status is not ExecutionStatus.SUSPENDED:
        raise NotWaitingError(
            f"execution {eid!r} is {state.status}, not waiting on a gate",
            execution_id=eid,
            hint=f"It may already have been decided; see `loom show {eid}`",
        )
    raise NotWaitingError(
        f"execution {eid!r} is waiting for {gate.event_type!r}, not {event_type!r}",
        execution_id=eid,
        waiting_for=gate.event_type,
    )


def validate_resume(
    runtime: WorkflowRuntime,
    flow: Flow[Any, Any],
    state: ExecutionState,
    event_type: str,
    payload: Any,
) -> Any:
    codec = flow.resume_schemas.get(event_type)
    eid = state.execution_id
    try:
        if codec is None or codec.adapter is None:
            encode_json(payload, limits=runtime.limits, what="the resume payload")
            return payload
        value = codec.adapter.validate_python(payload)
        return json_dump(codec.adapter, value)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<payload>'}: {e['msg']}" for e in exc.errors()
        )
        raise ResumeValidationError(
            f"resume payload for gate {event_type!r} of execution {eid!r} is invalid: {problems}",
            execution_id=eid,
            hint="Nothing was recorded; send a payload that matches the gate's schema",
            event_type=event_type,
            problems=exc.errors(include_url=False, include_context=False),
        ) from exc
    except (pydantic_core.PydanticSerializationError, *_NOT_JSON) as exc:
        raise ResumeValidationError(
            f"resume payload for gate {event_type!r} of execution {eid!r} is not "
            f"storable as JSON: {exc!r}",
            execution_id=eid,
            hint="Nothing was recorded; send JSON values only (no NaN, bytes, objects, "
            "cycles or deep nesting)",
            event_type=event_type,
        ) from exc


async def recover(
    runtime: WorkflowRuntime, execution_id: str, *, holder: Lease | None = None
) -> ExecutionHandle[Any]:
    live = runtime._drivers.get(execution_id)
    if holder is not None:
        held(holder, execution_id)
    elif live is not None and not live.done.is_set():
        # Already driven here: do not fence out our own live holder. A worker that passes
        # the lease from its allocate() means to take over, so it skips this.
        return ExecutionHandle(runtime, execution_id, live)
    state, snap_seq = await runtime._require(execution_id)
    if state.status not in (ExecutionStatus.RUNNING, ExecutionStatus.PENDING):
        # A parent waiting on a child that ended without telling it is told now.
        await _children.recheck_wait(runtime, state)
        return ExecutionHandle(runtime, execution_id, runtime._drivers.get(execution_id))
    handle = await recover_from(runtime, state, snap_seq, holder=holder)
    if handle is None:
        raise ExecutionSupersededError(
            f"execution {execution_id!r} moved while it was being recovered: another "
            "holder is driving it",
            execution_id=execution_id,
        )
    return handle


async def recover_from(
    runtime: WorkflowRuntime,
    state: ExecutionState,
    snap_seq: int,
    *,
    holder: Lease | None = None,
    from_fence: int | None = None,
) -> ExecutionHandle[Any] | None:
    """Append ``EXECUTION_RECOVERED`` after exactly ``state`` and drive the flow on.

    With ``from_fence`` (the fence read before ``state`` was), the take-over is
    conditional on both: if the execution moved since (a newer fence, a newer sequence),
    nothing is written and None is returned. ``recover_abandoned`` uses this so that a
    pass acts only on the state its predicate judged, never on whatever is current.
    """
    if from_fence is not None:
        live = runtime._drivers.get(state.execution_id)
        if live is not None and not live.done.is_set():
            return None  # driven here since it was judged: it is not abandoned
    flow = runtime.get_flow(state.flow_id, state.flow_version)
    recovered = ExecutionRecovered(state.last_sequence, snap_seq)
    handle = await continue_with(
        runtime, state, snap_seq, holder, recovered, flow, from_fence=from_fence
    )
    if handle is not None:
        log.info(
            "recovered execution %s (flow %s) from sequence %d",
            state.execution_id,
            flow.id,
            state.last_sequence,
            extra={"execution_id": state.execution_id, "flow_id": flow.id},
        )
    return handle


async def hard_cancel(
    runtime: WorkflowRuntime, execution_id: str, reason: str | None
) -> ExecutionState:
    for _ in range(RETRIES):
        state, snap_seq = await runtime._require(execution_id)
        if state.is_terminal:
            return state
        live = runtime._drivers.get(execution_id)
        if live is not None:
            live.cancel_requested = True  # its refused write is this cancel, not a takeover
        fence = await runtime.store.acquire_fence(execution_id)
        # Re-read under the new fence: nothing older can append after this point.
        state, snap_seq = await runtime._require(execution_id)
        if state.is_terminal:
            return state
        driver = new_driver(runtime, state, fence, last_snapshot=snap_seq)
        try:
            await driver.append([ExecutionCancelled(reason)])
        except StaleFenceError as exc:
            if exc.execution_id != execution_id:
                raise
            continue
        if runtime._timer_store is not None:
            await runtime._timer_store.cancel_timers(execution_id)
        live = runtime._drivers.get(execution_id)
        if live is not None and live.task is not None and not live.done.is_set():
            live.stop_reason = "cancelled"  # its handle reports the cancellation
            live.task.cancel()
        await _children.notify_parent(runtime, driver.state)
        await _children.cancel_children(runtime, driver.state, reason)
        return driver.state
    raise StorageError(
        f"could not cancel {execution_id!r}: it kept changing", execution_id=execution_id
    )
