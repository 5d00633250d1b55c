"""The agents layer's own events, registered with :func:`loom.register_event`.

* ``agents.model_called``: one model call completed. It records at its position the same
  ``OpRecord`` a ``STEP_COMPLETED`` of the step ``agents.model:<agent>`` did (logs written
  before this event existed hold that shape and still replay), so the step machinery (replay,
  retries recorded as ``STEP_FAILED``) is unchanged; the payload is typed and smaller.
* ``agents.vote_recorded``: one approval vote. It follows, in the same write, the
  ``EXECUTION_RESUMED`` that resolves the ``agents.approval`` gate (the resume the execution
  index and change feed know) and puts the vote where the flow reads the gate's value. Older
  logs carry the vote as that resume's payload: both fold to the same state.

Neither reducer touches the core fold: they are plain registrations, like any extension's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Self

from loom.model import (
    Envelope,
    ExecutionState,
    OpKind,
    OpRecord,
    OpStatus,
    StepCompleted,
    WaitOutcome,
    register_event,
)

__all__ = [
    "MODEL_CALLED",
    "MODEL_STEP_PREFIX",
    "VOTE_RECORDED",
    "ModelCalled",
    "VoteRecorded",
]

MODEL_CALLED = "agents.model_called"
VOTE_RECORDED = "agents.vote_recorded"
#: The model call's step id is this prefix and the agent's id (what replay compares).
MODEL_STEP_PREFIX = "agents.model:"
#: The gate every approval vote resolves (see loom.agents._approval).
_APPROVAL_GATE = "agents.approval"


def _position(data: Mapping[str, Any]) -> int:
    pos = data.get("position")
    if type(pos) is not int or pos < 0:
        raise ValueError("payload has no valid 'position'")
    return pos


class ModelCalled(NamedTuple):
    """``agents.model_called``: the model call of ``turn`` of agent ``agent`` answered.

    ``fp`` holds the request-fingerprint components that changed since the previous call,
    ``added`` the addresses of the messages this call is the first to name, ``response`` the
    provider's response (as :meth:`loom.llm.CompletionResponse.to_dict`). ``annotations`` is
    what step interceptors attached (``tokens``, ``cost``).
    """

    position: int
    agent: str
    turn: int
    response: Mapping[str, Any]
    fp: Mapping[str, str]
    added: Sequence[str] = ()
    attempt: int = 1
    started_at: float | None = None
    annotations: Mapping[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "position": self.position,
            "agent": self.agent,
            "turn": self.turn,
            "attempt": self.attempt,
            "fp": dict(self.fp),
        }
        if self.added:
            wire["added"] = list(self.added)
        wire["response"] = dict(self.response)
        wire["started_at"] = self.started_at
        if self.annotations:
            wire["annotations"] = dict(self.annotations)
        return wire

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        response = data["response"]
        fp = data.get("fp") or {}
        if not isinstance(response, Mapping) or not isinstance(fp, Mapping):
            raise ValueError("'response' and 'fp' must be objects")
        annotations = data.get("annotations")
        return cls(
            _position(data),
            str(data["agent"]),
            int(data["turn"]),
            response,
            fp,
            tuple(str(h) for h in data.get("added") or ()),
            int(data.get("attempt", 1)),
            data.get("started_at"),
            dict(annotations) if annotations else None,
        )

    @classmethod
    def from_completion(cls, done: StepCompleted) -> ModelCalled:
        """The event for a model step's completion (its output is the loop's record)."""
        out = done.output
        return cls(
            done.position,
            done.step_id.removeprefix(MODEL_STEP_PREFIX),
            int(out["turn"]),
            out["response"],
            out.get("fp") or {},
            tuple(out.get("added") or ()),
            done.attempt,
            done.started_at,
            done.annotations,
        )

    def output(self) -> dict[str, Any]:
        """The step output this event records (the shape ``STEP_COMPLETED`` recorded)."""
        out: dict[str, Any] = {"turn": self.turn, "fp": dict(self.fp)}
        if self.added:
            out["added"] = list(self.added)
        out["response"] = self.response
        return out


def _model_called(state: ExecutionState, e: ModelCalled, env: Envelope) -> None:
    name = MODEL_STEP_PREFIX + e.agent
    op = state.ops.get(e.position)
    if op is not None and (op.kind != OpKind.STEP or op.name != name):
        raise ValueError(f"position {e.position} holds {op.kind} {op.name!r}, not {name!r}")
    if op is not None and op.status is OpStatus.COMPLETED:
        raise ValueError(f"the model call at position {e.position} already completed")
    annotations = dict(e.annotations) if e.annotations else None
    state.ops[e.position] = OpRecord(
        OpKind.STEP, name, OpStatus.COMPLETED, e.output(), None, e.attempt, annotations
    )


class VoteRecorded(NamedTuple):
    """``agents.vote_recorded``: ``by`` voted ``vote`` (``approve`` / ``reject``) on the
    approval gate at ``position`` for the arguments hashed ``args_hash``; ``args`` are
    edited arguments proposed with an approval (they need their own votes)."""

    position: int
    vote: str
    by: str
    args_hash: str
    reason: str | None = None
    args: Mapping[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "position": self.position,
            "vote": self.vote,
            "by": self.by,
            "args_hash": self.args_hash,
        }
        if self.reason is not None:
            wire["reason"] = self.reason
        if self.args is not None:
            wire["args"] = dict(self.args)
        return wire

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        vote = str(data["vote"])
        if vote not in ("approve", "reject"):
            raise ValueError(f"vote {vote!r} is neither 'approve' nor 'reject'")
        args = data.get("args")
        if args is not None and not isinstance(args, Mapping):
            raise ValueError("'args' must be an object")
        reason = data.get("reason")
        return cls(
            _position(data),
            vote,
            str(data["by"]),
            str(data["args_hash"]),
            None if reason is None else str(reason),
            None if args is None else dict(args),
        )

    def record(self) -> dict[str, Any]:
        """The vote as the flow receives it (the old resume payload's shape)."""
        out = self.to_wire()
        del out["position"]
        return out


def _vote_recorded(state: ExecutionState, e: VoteRecorded, env: Envelope) -> None:
    op = state.ops.get(e.position)
    if op is None or op.kind != OpKind.GATE or op.name != _APPROVAL_GATE:
        raise ValueError(f"no approval gate at position {e.position}")
    output = op.output if isinstance(op.output, dict) else None
    if op.outcome is not WaitOutcome.DECIDED or output is None:
        raise ValueError(f"the approval gate at position {e.position} was not just resumed")
    if output.get("payload") is not None:
        raise ValueError(f"the approval gate at position {e.position} already has a vote")
    op.output = {**output, "payload": e.record()}


register_event(MODEL_CALLED, ModelCalled, _model_called)
register_event(VOTE_RECORDED, VoteRecorded, _vote_recorded)
