"""ExecutionState and the pure fold ``replay(envelopes) -> ExecutionState`` (no I/O)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loom.errors import CorruptEventError
from loom.model._events import TERMINAL_STATUSES, Envelope, EventType, ExecutionStatus

__all__ = ["ExecutionState", "Gate", "OpRecord", "apply_event", "replay"]


@dataclass(slots=True)
class OpRecord:
    """What the log holds for one position of the flow: a step, gate, decision, UI patch or timer.

    ``kind`` and ``name`` are what replay compares against the code; ``status`` is one of
    ``completed``, ``failed``, ``waiting``, ``resolved`` or ``scheduled``.
    """

    kind: str
    name: str
    status: str
    output: Any = None
    error: dict[str, Any] | None = None
    attempts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "status": self.status,
            "output": self.output,
            "error": self.error,
            "attempts": self.attempts,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpRecord:
        return cls(
            d["kind"],
            d["name"],
            d["status"],
            d.get("output"),
            d.get("error"),
            int(d.get("attempts", 0)),
        )


@dataclass(slots=True)
class Gate:
    """The durable wait an execution is suspended on (a human gate or a timer)."""

    position: int
    event_type: str
    correlation_key: str | None = None
    timeout_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "event_type": self.event_type,
            "correlation_key": self.correlation_key,
            "timeout_at": self.timeout_at,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Gate:
        return cls(
            int(d["position"]), str(d["event_type"]), d.get("correlation_key"), d.get("timeout_at")
        )


@dataclass(slots=True)
class ExecutionState:
    """Everything the log says about one execution, folded. Runs nothing."""

    execution_id: str
    flow_id: str = ""
    flow_version: str = ""
    input: Any = None
    status: ExecutionStatus = ExecutionStatus.PENDING
    last_sequence: int = -1
    started_at: float | None = None
    updated_at: float | None = None
    ops: dict[int, OpRecord] = field(default_factory=dict)
    waiting: Gate | None = None
    ui: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    error: dict[str, Any] | None = None
    cancel_reason: str | None = None
    recoveries: int = 0
    fence: int = 0
    forked_from: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def completed_steps(self) -> int:
        return sum(1 for op in self.ops.values() if op.kind == "step" and op.status == "completed")

    def copy(self) -> ExecutionState:
        """An independent copy. JSON values are shared: the fold replaces them, never mutates
        them in place, so only the containers and op records need copying."""
        new = copy.copy(self)
        new.ops = {
            k: OpRecord(op.kind, op.name, op.status, op.output, op.error, op.attempts)
            for k, op in self.ops.items()
        }
        if self.waiting is not None:
            w = self.waiting
            new.waiting = Gate(w.position, w.event_type, w.correlation_key, w.timeout_at)
        new.ui = dict(self.ui)
        new.metadata = dict(self.metadata)
        return new

    def to_dict(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "flow_id": self.flow_id,
            "flow_version": self.flow_version,
            "input": self.input,
            "status": self.status.value,
            "last_sequence": self.last_sequence,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "ops": {str(k): v.to_dict() for k, v in self.ops.items()},
            "waiting": self.waiting.to_dict() if self.waiting else None,
            "ui": self.ui,
            "output": self.output,
            "error": self.error,
            "cancel_reason": self.cancel_reason,
            "recoveries": self.recoveries,
            "fence": self.fence,
            "forked_from": self.forked_from,
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExecutionState:
        waiting = d.get("waiting")
        return cls(
            execution_id=d["execution_id"],
            flow_id=d.get("flow_id", ""),
            flow_version=d.get("flow_version", ""),
            input=d.get("input"),
            status=ExecutionStatus(d.get("status", "pending")),
            last_sequence=int(d.get("last_sequence", -1)),
            started_at=d.get("started_at"),
            updated_at=d.get("updated_at"),
            ops={int(k): OpRecord.from_dict(v) for k, v in (d.get("ops") or {}).items()},
            waiting=Gate.from_dict(waiting) if waiting else None,
            ui=dict(d.get("ui") or {}),
            output=d.get("output"),
            error=d.get("error"),
            cancel_reason=d.get("cancel_reason"),
            recoveries=int(d.get("recoveries", 0)),
            fence=int(d.get("fence", 0)),
            forked_from=d.get("forked_from"),
            metadata=dict(d.get("metadata") or {}),
        )


def _bad(state: ExecutionState, env: Envelope, why: str) -> CorruptEventError:
    return CorruptEventError(
        f"cannot fold event {env.sequence} ({env.type}) of execution {state.execution_id!r}: {why}",
        execution_id=state.execution_id,
        sequence=env.sequence,
    )


def _pos(state: ExecutionState, env: Envelope) -> int:
    pos = env.payload.get("position")
    if not isinstance(pos, int) or pos < 0:
        raise _bad(state, env, "payload has no valid 'position'")
    return pos


def apply_event(state: ExecutionState, env: Envelope) -> None:
    """Fold one envelope into ``state`` in place. Total: anything unexpected raises."""
    if env.execution_id != state.execution_id:
        raise _bad(state, env, f"it belongs to execution {env.execution_id!r}")
    if env.sequence != state.last_sequence + 1:
        raise _bad(state, env, f"expected sequence {state.last_sequence + 1}")
    t = env.type
    p = env.payload
    if env.sequence == 0:
        if t is not EventType.EXECUTION_STARTED:
            raise _bad(state, env, "sequence 0 must be EXECUTION_STARTED")
    elif state.is_terminal:
        raise _bad(state, env, f"the execution is already {state.status}")
    if t is EventType.EXECUTION_STARTED:
        if env.sequence != 0:
            raise _bad(state, env, "EXECUTION_STARTED only at sequence 0")
        state.flow_id = str(p["flow_id"])
        state.flow_version = str(p.get("flow_version", ""))
        state.input = p.get("input")
        state.metadata = dict(p.get("metadata") or {})
        state.status = ExecutionStatus.RUNNING
        state.started_at = env.recorded_at
    elif t is EventType.STEP_STARTED:
        pos = _pos(state, env)
        op = state.ops.get(pos)
        if op is None:
            state.ops[pos] = OpRecord(
                "step", str(p["step_id"]), "started", attempts=int(p.get("attempt", 1))
            )
        elif op.status in ("completed",):
            raise _bad(state, env, f"step at position {pos} already completed")
        else:
            op.attempts = int(p.get("attempt", op.attempts + 1))
            op.status = "started"
    elif t is EventType.STEP_COMPLETED:
        pos = _pos(state, env)
        op = state.ops.get(pos)
        if op is not None and op.status == "completed":
            raise _bad(state, env, f"step at position {pos} already completed")
        state.ops[pos] = OpRecord(
            "step", str(p["step_id"]), "completed", p.get("output"), None, int(p.get("attempt", 1))
        )
    elif t is EventType.STEP_FAILED:
        pos = _pos(state, env)
        op = state.ops.get(pos)
        if op is not None and op.status == "completed":
            raise _bad(state, env, f"step at position {pos} already completed")
        state.ops[pos] = OpRecord(
            "step",
            str(p["step_id"]),
            "failed" if p.get("final") else "retrying",
            None,
            p.get("error"),
            int(p.get("attempt", 1)),
        )
    elif t is EventType.EXECUTION_SUSPENDED:
        pos = _pos(state, env)
        if p.get("timer"):
            # A durable sleep: TIMER_SCHEDULED named the op; the suspension makes it wait.
            op = state.ops.get(pos) or OpRecord("timer", "sleep", "scheduled")
            op.status = "waiting"
            state.ops[pos] = op
        else:
            state.ops[pos] = OpRecord("gate", str(p["event_type"]), "waiting")
        state.waiting = Gate(
            pos, str(p["event_type"]), p.get("correlation_key"), p.get("timeout_at")
        )
        state.status = ExecutionStatus.SUSPENDED
    elif t in (EventType.EXECUTION_RESUMED, EventType.TIMER_FIRED):
        pos = _pos(state, env)
        op = state.ops.get(pos)
        if op is None or op.status != "waiting":
            raise _bad(state, env, f"nothing is waiting at position {pos}")
        op.status = "resolved"
        op.output = {"payload": p.get("payload"), "timed_out": bool(p.get("timed_out"))}
        state.waiting = None
        state.status = ExecutionStatus.RUNNING
    elif t is EventType.EXECUTION_RECOVERED:
        state.recoveries += 1
        state.status = ExecutionStatus.RUNNING
    elif t is EventType.TIMER_SCHEDULED:
        pos = _pos(state, env)
        state.ops[pos] = OpRecord(
            "timer", str(p.get("name", "sleep")), "scheduled", {"fire_at": p.get("fire_at")}
        )
    elif t is EventType.DECISION_RECORDED:
        pos = _pos(state, env)
        state.ops[pos] = OpRecord("decision", str(p["name"]), "completed", p.get("value"))
    elif t is EventType.UI_PATCHED:
        pos = _pos(state, env)
        op_name = str(p.get("op", "set"))
        key = str(p["key"])
        value = p.get("value")
        if op_name == "merge" and isinstance(value, dict) and isinstance(state.ui.get(key), dict):
            merged = dict(state.ui[key])
            merged.update(value)
            state.ui[key] = merged
        elif op_name in ("set", "merge"):
            state.ui[key] = value
        else:
            raise _bad(state, env, f"unknown UI op {op_name!r}")
        state.ops[pos] = OpRecord("ui", key, "completed")
    elif t is EventType.EXECUTION_FORKED:
        state.forked_from = dict(p)
    elif t is EventType.EXECUTION_COMPLETED:
        state.status = ExecutionStatus.COMPLETED
        state.output = p.get("output")
        state.waiting = None
    elif t is EventType.EXECUTION_FAILED:
        state.status = ExecutionStatus.FAILED
        state.error = p.get("error")
        state.waiting = None
    elif t is EventType.EXECUTION_CANCELLED:
        state.status = ExecutionStatus.CANCELLED
        state.cancel_reason = p.get("reason")
        state.waiting = None
    else:  # pragma: no cover - EventType is closed, but a new member must be folded explicitly
        raise _bad(state, env, "unknown event type")
    state.last_sequence = env.sequence
    state.updated_at = env.recorded_at
    state.fence = env.fence


def replay(
    envelopes: Iterable[Envelope],
    *,
    initial: ExecutionState | None = None,
    execution_id: str | None = None,
) -> ExecutionState:
    """Fold ``envelopes`` (in sequence order) into a new :class:`ExecutionState`.

    Pure: ``initial`` (a snapshot's state) is copied, never mutated. An out-of-order sequence,
    an event after a terminal one or a malformed payload raises :class:`CorruptEventError`.
    """
    state: ExecutionState | None = initial.copy() if initial is not None else None
    for env in envelopes:
        if state is None:
            state = ExecutionState(execution_id or env.execution_id)
        try:
            apply_event(state, env)
        except (KeyError, TypeError, ValueError) as exc:
            raise _bad(state, env, f"malformed payload ({exc!r})") from exc
    if state is None:
        if execution_id is None:
            raise ValueError("replay() of no envelopes needs an execution_id")
        state = ExecutionState(execution_id)
    return state
