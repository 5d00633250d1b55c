"""Decisions logged with their propensity, and the outcomes that score them.

``ctx.decide_with_policy`` records which action a policy chose, among which alternatives, for
which context, and with which probability; that is what off-policy evaluation needs to estimate
how another policy would have done from the same log. The events are namespaced extension
events (``learning.decision_recorded``, ``learning.outcome_recorded``), registered here, so the
core fold is not edited.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from loom.errors import LoomError
from loom.model import (
    Envelope,
    ExecutionState,
    OpRecord,
    OpStatus,
    Payload,
    encode_json,
    register_event,
)

if TYPE_CHECKING:
    from loom.runtime import WorkflowContext

__all__ = [
    "DECISION_EVENT",
    "DECISION_KIND",
    "OUTCOME_EVENT",
    "OUTCOME_KIND",
    "DecisionError",
    "OutcomeRecorded",
    "Policy",
    "PolicyDecisionRecorded",
]

DECISION_EVENT = "learning.decision_recorded"
OUTCOME_EVENT = "learning.outcome_recorded"
#: The op kinds replay compares for these operations.
DECISION_KIND = "learning.decision"
OUTCOME_KIND = "learning.outcome"


class DecisionError(LoomError):
    """A policy decision or outcome that cannot be recorded (bad propensity, an action not
    among the alternatives, a score that is not a finite number, no decision to score)."""

    code = "decision_invalid"
    default_hint = "Fix the policy or the call; nothing was recorded"


@runtime_checkable
class Policy(Protocol):
    """A decision policy: ``select(context, actions)`` returns ``(action, propensity)``, the
    probability with which it picks that action for that context (1.0 when deterministic).

    A stochastic *target* policy evaluated off-policy may also define
    ``probability(context, actions, action) -> float``; without it the policy is treated as
    deterministic (it picks what ``select`` returns with probability 1).
    """

    id: str
    version: str

    def select(self, context: Any, actions: Sequence[Any]) -> tuple[Any, float]: ...


@dataclass(frozen=True, slots=True)
class PolicyDecisionRecorded(Payload):
    """A decision taken by a policy, with the context, the alternatives and its propensity."""

    position: int
    decision_id: str
    action: Any
    context: Any
    actions: list[Any]
    policy_id: str
    policy_version: str
    propensity: float


@dataclass(frozen=True, slots=True)
class OutcomeRecorded(Payload):
    """The score of a decision under ``key`` (one per (decision, key))."""

    position: int
    decision_id: str | None
    key: str
    score: float


def _fold_decision(state: ExecutionState, e: PolicyDecisionRecorded, env: Envelope) -> None:
    state.ops[e.position] = OpRecord(
        DECISION_KIND, e.decision_id, OpStatus.COMPLETED, {"action": e.action}
    )


def _fold_outcome(state: ExecutionState, e: OutcomeRecorded, env: Envelope) -> None:
    state.ops[e.position] = OpRecord(
        OUTCOME_KIND,
        e.key,
        OpStatus.COMPLETED,
        {"decision_id": e.decision_id, "score": e.score},
    )


register_event(DECISION_EVENT, PolicyDecisionRecorded, _fold_decision)
register_event(OUTCOME_EVENT, OutcomeRecorded, _fold_outcome)


def _valid_propensity(p: Any) -> bool:
    return (
        isinstance(p, int | float)
        and not isinstance(p, bool)
        and math.isfinite(p)
        and 0.0 < p <= 1.0
    )


async def decide_with_policy(
    ctx: WorkflowContext, decision_id: str, policy: Policy, context: Any, actions: Sequence[Any]
) -> Any:
    """See :meth:`loom.WorkflowContext.decide_with_policy`."""
    pos, op = ctx.claim_position(DECISION_KIND, decision_id)
    if op is not None:
        return op.output["action"]  # replay: the recorded choice; the policy is not consulted
    alternatives = list(actions)
    if not alternatives:
        raise DecisionError(
            f"decision {decision_id!r} has no alternatives to choose from",
            execution_id=ctx.execution_id,
            decision_id=decision_id,
        )
    selected: Any = policy.select(context, alternatives)
    if inspect.isawaitable(selected):
        selected = await selected
    action, propensity = selected
    if action not in alternatives:
        raise DecisionError(
            f"policy {policy.id!r} chose {action!r} for decision {decision_id!r}, which is "
            f"not among the {len(alternatives)} alternatives",
            execution_id=ctx.execution_id,
            decision_id=decision_id,
            policy_id=policy.id,
        )
    if not _valid_propensity(propensity):
        raise DecisionError(
            f"policy {policy.id!r} gave propensity {propensity!r} for decision "
            f"{decision_id!r}; it must be a number in (0, 1]",
            execution_id=ctx.execution_id,
            decision_id=decision_id,
            policy_id=policy.id,
        )
    encode_json(context, what=f"context of decision {decision_id!r}")
    await ctx.record(
        PolicyDecisionRecorded(
            pos,
            decision_id,
            action,
            context,
            alternatives,
            str(policy.id),
            str(policy.version),
            float(propensity),
        )
    )
    return action


def _latest_decision(ctx: WorkflowContext, before: int) -> str | None:
    for p in range(before - 1, -1, -1):
        op = ctx.recorded(p)
        if op is not None and op.kind == DECISION_KIND:
            return op.name
    return None


def _already_scored(ctx: WorkflowContext, before: int, decision_id: str | None, key: str) -> bool:
    for p in range(before):
        op = ctx.recorded(p)
        if (
            op is not None
            and op.kind == OUTCOME_KIND
            and op.name == key
            and op.output.get("decision_id") == decision_id
        ):
            return True
    return False


async def record_outcome(
    ctx: WorkflowContext, key: str, score: float, decision_id: str | None = None
) -> bool:
    """See :meth:`loom.WorkflowContext.record_outcome`."""
    pos, op = ctx.claim_position(OUTCOME_KIND, key)
    if op is not None:
        return True
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise DecisionError(
            f"outcome {key!r} has score {score!r}; it must be a finite number",
            execution_id=ctx.execution_id,
        )
    if decision_id is None:
        decision_id = _latest_decision(ctx, pos)
        if decision_id is None:
            raise DecisionError(
                f"outcome {key!r} names no decision and the flow has taken none yet",
                execution_id=ctx.execution_id,
                hint="Pass decision_id=..., or record the outcome after ctx.decide_with_policy",
            )
    if _already_scored(ctx, pos, decision_id, key):
        return False  # idempotent per (decision, key): the first score stands
    await ctx.record(OutcomeRecorded(pos, decision_id, key, float(score)))
    return True
