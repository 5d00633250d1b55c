"""The durable mailbox's runtime side: ``runtime.send`` and delivering to a waiting gate.

Messages wait in the store's mailbox (outside the log); a gate takes the oldest one for its
event type and the log records which (``ExecutionResumed.message_id``). An idempotency key maps
to one message id, so a keyed ``send`` or ``resume`` is delivered at most once per execution.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from loom.errors import ConfigurationError, NotWaitingError
from loom.model import ExecutionResumed, ExecutionState, ExecutionStatus, new_envelope_id
from loom.runtime._context import TIMER_EVENT
from loom.storage import MailboxStore, Message

if TYPE_CHECKING:
    from loom.runtime._runtime import WorkflowRuntime

__all__ = ["deliver", "keyed_id", "send", "taken"]

#: How often delivery re-reads an execution that keeps moving before it leaves the message to
#: the holder (which takes it when it reaches the gate).
_RETRIES = 8


async def send(
    rt: WorkflowRuntime,
    execution_id: str,
    event_type: str,
    payload: Any,
    idempotency_key: str | None,
) -> Message:
    """See :meth:`WorkflowRuntime.send`."""
    rt._check_open()
    rt._first_use()
    mailbox = rt.store if isinstance(rt.store, MailboxStore) else None
    if mailbox is None:
        raise ConfigurationError(
            f"cannot send to {execution_id!r}: this runtime's store keeps no mailbox",
            execution_id=execution_id,
            hint="Use a store that implements MailboxStore (memory, SQLite, PostgreSQL), "
            "or resume() a waiting gate",
        )
    state, _ = await rt._require(execution_id)
    from loom.runtime._children import refuse_outside_answer

    refuse_outside_answer(execution_id, event_type)
    if event_type == TIMER_EVENT:
        raise NotWaitingError(
            f"{TIMER_EVENT!r} is a durable sleep of execution {execution_id!r}: only its "
            "timer ends it",
            execution_id=execution_id,
        )
    message_id = new_envelope_id() if idempotency_key is None else keyed_id(idempotency_key)
    delivered = taken(state, message_id)
    if delivered is not None:
        return Message(execution_id, message_id, event_type, delivered.get("payload"))
    if state.is_terminal:
        raise NotWaitingError(
            f"execution {execution_id!r} is {state.status}; no gate will take a message",
            execution_id=execution_id,
            status=state.status.value,
        )
    flow = rt.get_flow(state.flow_id, state.flow_version)
    normalized = rt._validate_resume(flow, state, event_type, payload)
    stored = await mailbox.put_message(
        Message(execution_id, message_id, event_type, normalized, rt.clock.now())
    )
    await deliver(rt, mailbox, execution_id, event_type)
    return stored


async def deliver(
    rt: WorkflowRuntime, mailbox: MailboxStore, execution_id: str, event_type: str
) -> None:
    """Resume a gate of ``event_type`` that is waiting now with its oldest message. A gate
    not reached yet takes it itself (see WorkflowContext.suspend)."""
    for _ in range(_RETRIES):
        state, snap_seq = await rt._require(execution_id)
        gate = state.waiting
        if (
            state.status is not ExecutionStatus.SUSPENDED
            or gate is None
            or gate.event_type != event_type
            or (gate.timeout_at is not None and rt.clock.now() >= gate.timeout_at)
        ):
            return
        taken = {
            str(op.output["message_id"])
            for op in state.ops.values()
            if op.kind == "gate" and isinstance(op.output, dict) and "message_id" in op.output
        }
        pending = [
            m
            for m in await mailbox.pending_messages(execution_id, event_type)
            if m.message_id not in taken
        ]
        if not pending:
            return  # another deliverer took it
        message = pending[0]
        flow = rt.get_flow(state.flow_id, state.flow_version)
        resumed = ExecutionResumed(gate.position, event_type, message.payload, message.message_id)
        if await rt._continue_with(state, snap_seq, None, resumed, flow) is not None:
            await mailbox.consume_message(execution_id, message.message_id)
            return
    # The execution kept moving: whichever holder reaches the gate takes the message.


def keyed_id(idempotency_key: str) -> str:
    """The message id of a keyed decision: one id per key, whichever call delivers it."""
    if not isinstance(idempotency_key, str) or not idempotency_key:
        raise ConfigurationError("an idempotency key must be a non-empty string")
    return "key-" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]


def taken(state: ExecutionState, message_id: str) -> dict[str, Any] | None:
    """The resolved gate output that took ``message_id``, if any gate did."""
    for op in state.ops.values():
        if (
            op.kind == "gate"
            and isinstance(op.output, dict)
            and op.output.get("message_id") == message_id
        ):
            return op.output
    return None
