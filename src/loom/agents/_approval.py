"""Approval gates in front of tools: policy, votes, quorum and a durable deadline.

Before a tool with ``requires_approval`` runs, the agent records an approval request (the
tool, its exact arguments, their canonical hash, who may vote, the quorum and the deadline)
and suspends on the ``agents.approval`` gate. Each vote is a resume of that gate (recorded as
``EXECUTION_RESUMED`` plus the typed ``agents.vote_recorded`` event in one write), validated
against the request BEFORE it is appended: a voter not allowed, a vote for other arguments or
a second vote by the same person is refused with :class:`VoteRefusedError` and nothing is
recorded; a vote after the deadline is refused with ``GateTimedOutError``. The deadline is the
gate's durable timer. A rejection goes back to the model as an observation; an approval with
edited arguments opens a new request for them, which needs its own votes.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from loom.agents._events import VoteRecorded
from loom.errors import ConfigurationError, GateTimedOutError, NotWaitingError, ResumeError
from loom.llm import ToolCallPart, canonical_json
from loom.model import ExecutionState, ExecutionStatus, Gate
from loom.runtime import (
    ExecutionHandle,
    GateRecord,
    WorkflowContext,
    WorkflowRuntime,
    register_gate_validator,
)

if TYPE_CHECKING:
    from loom.agents._tool import Tool

__all__ = [
    "APPROVAL_EVENT",
    "APPROVAL_REQUEST",
    "ApprovalPolicy",
    "Verdict",
    "VoteRefusedError",
    "approval_gate",
    "args_hash",
    "open_request",
    "pending_approval",
    "vote",
]

APPROVAL_EVENT = "agents.approval"
APPROVAL_REQUEST = "agents.approval_request"


class VoteRefusedError(ResumeError):
    """A vote the open approval request cannot take; nothing was recorded.

    ``details["reason"]`` is ``not_allowed``, ``wrong_arguments``, ``duplicate_vote`` or
    ``invalid_vote``.
    """

    code = "vote_refused"


def args_hash(tool: str, args: Mapping[str, Any]) -> str:
    """The hash a vote names: sha256 of the tool name and its canonical JSON arguments."""
    return hashlib.sha256(canonical_json({"tool": tool, "args": dict(args)}).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    """Who must approve a tool call before it runs.

    ``approvers`` (None: anyone) may vote; ``quorum`` approvals run the tool; one rejection
    stops it. ``deadline`` (a duration) is a durable timer: when it passes first,
    ``on_timeout`` decides (``"reject"``: the model is told; ``"approve"``: the tool runs;
    ``"fail"``: GateTimedOutError in the flow).
    """

    approvers: Sequence[str] | None = None
    quorum: int = 1
    deadline: timedelta | float | None = None
    on_timeout: Literal["reject", "approve", "fail"] = "reject"

    def __post_init__(self) -> None:
        if self.quorum < 1:
            raise ConfigurationError("ApprovalPolicy.quorum must be at least 1")
        seconds = self.deadline_seconds
        if seconds is not None and not math.isfinite(seconds):
            raise ConfigurationError(f"ApprovalPolicy.deadline must be finite, not {seconds!r}")
        if self.approvers is not None:
            object.__setattr__(self, "approvers", tuple(self.approvers))
            if len(set(self.approvers)) < self.quorum:
                raise ConfigurationError(
                    f"ApprovalPolicy needs at least {self.quorum} distinct approvers for its quorum"
                )
        if self.on_timeout not in ("reject", "approve", "fail"):
            raise ConfigurationError("on_timeout must be 'reject', 'approve' or 'fail'")

    @property
    def deadline_seconds(self) -> float | None:
        if self.deadline is None:
            return None
        if isinstance(self.deadline, timedelta):
            return self.deadline.total_seconds()
        return float(self.deadline)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the gate decided for one tool call."""

    approved: bool
    args: Mapping[str, Any]
    by: tuple[str, ...] = ()
    reason: str | None = None
    timed_out: bool = False
    votes: tuple[Mapping[str, Any], ...] = field(default=())

    def observation(self) -> str:
        """What the model is told when the call does not run."""
        if self.timed_out:
            return "The call was not approved before its deadline; it did not run."
        who = ", ".join(self.by) or "an approver"
        reason = f": {self.reason}" if self.reason else ""
        return f"The call was rejected by {who}{reason}. It did not run."


async def approval_gate(
    ctx: WorkflowContext, agent_id: str, tool: Tool[Any, Any], call: ToolCallPart
) -> Verdict:
    """Open the request, collect votes (each a durable gate) and return the verdict."""
    policy = tool.requires_approval
    assert policy is not None
    args: dict[str, Any] = dict(call.args)
    seconds = policy.deadline_seconds
    clock = ctx.clock
    deadline_at = None
    if seconds is not None:
        deadline_at = await ctx.decide("agents.approval_deadline", lambda: clock.now() + seconds)
    votes: list[Mapping[str, Any]] = []
    while True:
        request = {
            "agent": agent_id,
            "tool": tool.name,
            "call_id": call.id,
            "args": args,
            "args_hash": args_hash(tool.name, args),
            "approvers": None if policy.approvers is None else list(policy.approvers),
            "quorum": policy.quorum,
            "deadline_at": deadline_at,
        }
        await ctx.decide(APPROVAL_REQUEST, lambda request=request: request)  # type: ignore[misc]
        approvals: list[str] = []
        edited: dict[str, Any] | None = None
        while len(approvals) < policy.quorum:
            timeout = None if deadline_at is None else max(0.0, deadline_at - clock.now())
            try:
                if timeout is not None and timeout <= 0 and not ctx.is_replaying:
                    raise GateTimedOutError(
                        "approval deadline passed", execution_id=ctx.execution_id
                    )
                vote = await ctx.suspend(
                    APPROVAL_EVENT,
                    correlation_key=f"{tool.name}:{args_hash(tool.name, args)[:16]}",
                    timeout=timeout,
                )
            except GateTimedOutError:
                if policy.on_timeout == "fail":
                    raise
                if policy.on_timeout == "approve":
                    return Verdict(True, args, tuple(approvals), None, True, tuple(votes))
                return Verdict(False, args, (), None, True, tuple(votes))
            votes.append(vote)
            if vote["vote"] == "reject":
                return Verdict(False, args, (vote["by"],), vote.get("reason"), False, tuple(votes))
            if vote.get("args") is not None:
                edited = dict(vote["args"])
                break
            approvals.append(vote["by"])
        if edited is None:
            return Verdict(True, args, tuple(approvals), None, False, tuple(votes))
        args = edited


# ---------------------------------------------------------------------- the vote validator


def open_request(state: ExecutionState, gate: Gate) -> tuple[dict[str, Any], list[str]]:
    """The approval request a waiting gate belongs to, and who already voted on it."""
    request_pos = max(
        (
            pos
            for pos, op in state.ops.items()
            if op.kind == "decision" and op.name == APPROVAL_REQUEST and pos < gate.position
        ),
        default=None,
    )
    if request_pos is None:
        raise VoteRefusedError(
            f"execution {state.execution_id!r} waits on an approval gate with no request",
            execution_id=state.execution_id,
            reason="invalid_vote",
        )
    request = dict(state.ops[request_pos].output or {})
    voters = [
        str((op.output or {}).get("payload", {}).get("by"))
        for pos, op in sorted(state.ops.items())
        if request_pos < pos < gate.position and op.kind == "gate" and op.name == APPROVAL_EVENT
    ]
    return request, voters


def _refuse(state: ExecutionState, message: str, reason: str, **details: Any) -> VoteRefusedError:
    return VoteRefusedError(
        f"vote on execution {state.execution_id!r} refused: {message}",
        execution_id=state.execution_id,
        hint="Nothing was recorded",
        reason=reason,
        **details,
    )


def validate_vote(state: ExecutionState, gate: Gate, payload: Any) -> GateRecord:
    """Check a vote against the open request; return what to record."""
    if not isinstance(payload, Mapping):
        raise _refuse(state, "a vote is an object", "invalid_vote")
    vote = payload.get("vote")
    by = payload.get("by")
    if vote not in ("approve", "reject"):
        raise _refuse(state, "'vote' must be 'approve' or 'reject'", "invalid_vote")
    if not isinstance(by, str) or not by.strip():
        raise _refuse(state, "'by' must name the voter", "invalid_vote")
    reason = payload.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise _refuse(state, "'reason' must be text", "invalid_vote")
    edited = payload.get("args")
    if edited is not None and (not isinstance(edited, Mapping) or vote != "approve"):
        raise _refuse(state, "edited 'args' must be an object on an approve vote", "invalid_vote")
    request, voters = open_request(state, gate)
    approvers = request.get("approvers")
    if approvers is not None and by not in approvers:
        raise _refuse(state, f"{by!r} may not vote on this call", "not_allowed", by=by)
    expected = request.get("args_hash")
    named = payload.get("args_hash")
    if named is not None and named != expected:
        raise _refuse(
            state,
            "the vote names other arguments than the open request "
            f"({str(named)[:12]}... is not {str(expected)[:12]}...)",
            "wrong_arguments",
            expected=expected,
        )
    if by in voters:
        raise _refuse(state, f"{by!r} already voted on this request", "duplicate_vote", by=by)
    # Recorded as agents.vote_recorded right after the gate's resume (same write): its
    # reducer hands the vote to the flow as the gate's value.
    vote_event = VoteRecorded(
        gate.position,
        vote,
        by,
        str(expected),
        reason,
        None if edited is None else canonical_args(edited, state),
    )
    return GateRecord(None, (vote_event,))


def canonical_args(args: Mapping[str, Any], state: ExecutionState) -> dict[str, Any]:
    try:
        canonical_json(dict(args))
    except Exception as exc:
        raise _refuse(state, f"edited args are not JSON: {exc}", "invalid_vote") from exc
    return dict(args)


register_gate_validator(APPROVAL_EVENT, validate_vote)


async def pending_approval(runtime: WorkflowRuntime, execution_id: str) -> dict[str, Any] | None:
    """The approval request an execution waits on (tool, args, args_hash, approvers, quorum,
    deadline_at, and ``voted``: who already voted), or None when it waits on none."""
    state = await runtime.load_state(execution_id)
    gate = None if state is None else state.waiting
    if state is None or gate is None or gate.event_type != APPROVAL_EVENT:
        return None
    request, voters = open_request(state, gate)
    return {**request, "voted": voters}


async def vote(
    runtime: WorkflowRuntime,
    execution_id: str,
    *,
    by: str,
    approve: bool = True,
    reason: str | None = None,
    args: Mapping[str, Any] | None = None,
    args_hash: str | None = None,
    wait: float = 30.0,
) -> ExecutionHandle[Any]:
    """Cast one vote on the approval an execution waits on (``runtime.resume`` underneath).

    ``args_hash`` pins the vote to the arguments the voter saw (a vote for other arguments is
    refused); ``args`` proposes edited arguments (they need their own votes). Between two
    votes of a quorum the execution briefly runs (it records the first and waits again): the
    vote waits for that, up to ``wait`` seconds, instead of failing with NotWaitingError.
    Refusals (:class:`VoteRefusedError`, ``GateTimedOutError``) record nothing.
    """
    payload: dict[str, Any] = {"vote": "approve" if approve else "reject", "by": by}
    if reason is not None:
        payload["reason"] = reason
    if args is not None:
        payload["args"] = dict(args)
    if args_hash is not None:
        payload["args_hash"] = args_hash
    loop = asyncio.get_running_loop()
    give_up = loop.time() + wait
    while True:
        try:
            return await runtime.resume(execution_id, APPROVAL_EVENT, payload)
        except NotWaitingError:
            state = await runtime.load_state(execution_id)
            left = give_up - loop.time()
            if state is None or state.status is not ExecutionStatus.RUNNING or left <= 0:
                raise
            await runtime.store.wait_for_append(
                execution_id, state.last_sequence, timeout=min(left, 1.0)
            )
