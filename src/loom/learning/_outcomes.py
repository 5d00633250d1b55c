"""Outcomes recorded after the fact: ``runtime.record_outcome(execution_id, decision_id, score)``.

A reward often arrives after the execution that took the decision has ended (a click, a
refund, a review a day later), and nothing may follow a terminal event in a log. So an outcome
recorded from outside is its own small log, an *outcome record*: an execution of the built-in
flow ``loom.outcome`` whose id is derived from (execution, decision, key), holding the score in
one ``learning.outcome_attached`` event. Deriving the id makes the write idempotent on every
store for free: a second score for the same pair loses the sequence-0 race and is refused by
the store itself, across processes. The record names the scored execution as its parent
(``loom.parent_id``), and :func:`loom.learning.trajectories` joins it to the decision; a score
the flow itself recorded (``ctx.record_outcome``) for the same pair comes first and wins.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loom.errors import ExecutionAlreadyExistsError, ExecutionNotFoundError, StaleFenceError
from loom.learning._decisions import DECISION_EVENT, OUTCOME_EVENT, DecisionError
from loom.model import (
    Envelope,
    EventType,
    ExecutionCompleted,
    ExecutionStarted,
    ExecutionState,
    OpKind,
    OpRecord,
    OpStatus,
    Payload,
    register_event,
)

if TYPE_CHECKING:
    from loom.runtime import WorkflowRuntime

__all__ = ["OUTCOME_ATTACHED_EVENT", "OUTCOME_FLOW", "OutcomeAttached", "record_outcome_after"]

OUTCOME_ATTACHED_EVENT = "learning.outcome_attached"
#: The flow id of an outcome record (no code runs: the record is complete when written).
OUTCOME_FLOW = "loom.outcome"


@dataclass(frozen=True, slots=True)
class OutcomeAttached(Payload):
    """The score ``key`` of decision ``decision_id`` of execution ``execution_id``."""

    execution_id: str
    decision_id: str
    key: str
    score: float


def _fold_attached(state: ExecutionState, e: OutcomeAttached, env: Envelope) -> None:
    state.ops[0] = OpRecord(
        OpKind.DECISION,
        e.key,
        OpStatus.COMPLETED,
        {"execution_id": e.execution_id, "decision_id": e.decision_id, "score": e.score},
    )


register_event(OUTCOME_ATTACHED_EVENT, OutcomeAttached, _fold_attached)


def outcome_record_id(execution_id: str, decision_id: str, key: str) -> str:
    digest = hashlib.sha256(f"{execution_id}\x00{decision_id}\x00{key}".encode()).hexdigest()
    return f"{execution_id[:80]}.outcome.{digest[:24]}"


def _scored_in_log(envelopes: list[Envelope], decision_id: str, key: str) -> tuple[bool, bool]:
    """(the decision is in the log, the flow already scored it under ``key``)."""
    decided = scored = False
    for env in envelopes:
        p = env.payload
        if (env.type == DECISION_EVENT and p.get("decision_id") == decision_id) or (
            env.type == EventType.DECISION_RECORDED and p.get("name") == decision_id
        ):
            decided = True
        elif (
            env.type == OUTCOME_EVENT
            and p.get("decision_id") == decision_id
            and p.get("key") == key
        ):
            scored = True
    return decided, scored


async def record_outcome_after(
    runtime: WorkflowRuntime, execution_id: str, decision_id: str, score: Any, key: str
) -> bool:
    """See :meth:`loom.WorkflowRuntime.record_outcome`."""
    runtime._check_open()
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise DecisionError(
            f"outcome {key!r} of decision {decision_id!r} has score {score!r}; it must be a "
            "finite number",
            execution_id=execution_id,
        )
    if not isinstance(key, str) or not key or not isinstance(decision_id, str):
        raise DecisionError("an outcome needs a non-empty key and a decision id")
    envelopes = await runtime.store.read(execution_id)
    if not envelopes:
        raise ExecutionNotFoundError(
            f"no execution {execution_id!r} in this store", execution_id=execution_id
        )
    decided, scored = _scored_in_log(envelopes, decision_id, key)
    if not decided:
        raise DecisionError(
            f"execution {execution_id!r} recorded no decision {decision_id!r}; nothing to score",
            execution_id=execution_id,
            decision_id=decision_id,
            hint=f"`loom logs {execution_id}` shows its decisions",
        )
    if scored:
        return False  # the flow scored it already: the first score stands
    record_id = outcome_record_id(execution_id, decision_id, key)
    value = float(score)
    now = runtime.clock.now()
    events: list[Any] = [
        ExecutionStarted(
            OUTCOME_FLOW,
            "1",
            {"execution_id": execution_id, "decision_id": decision_id, "key": key},
            {"loom.parent_id": execution_id},
        ),
        OutcomeAttached(execution_id, decision_id, key, value),
        ExecutionCompleted({"score": value}),
    ]
    batch = [
        Envelope.of(record_id, i, e, fence=1, recorded_at=now, limits=runtime.limits)
        for i, e in enumerate(events)
    ]
    try:
        await runtime.store.take_over(batch, from_fence=0)
    except (ExecutionAlreadyExistsError, StaleFenceError) as exc:
        if exc.execution_id != record_id or await runtime.store.last_sequence(record_id) < 0:
            raise
        return False  # scored before (by this call's earlier attempt or another process)
    return True
