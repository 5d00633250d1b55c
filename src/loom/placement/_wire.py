"""ExecutionPackage and ExecutionResult: the immutable, JSON wire shapes of placement."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from loom.errors import PayloadError, WireFormatError
from loom.model import (
    DEFAULT_LIMITS,
    ExecutionState,
    ExecutionStatus,
    PayloadLimits,
    decode_json,
    encode_json,
    execution_id_problem,
)

__all__ = ["WIRE_VERSION", "ExecutionPackage", "ExecutionResult", "ResumeEvent"]

#: The wire shape's version. A reader refuses any other with WireFormatError.
WIRE_VERSION = 1

#: A result carries a whole folded state, so it may be as large and deep as a snapshot.
RESULT_LIMITS = PayloadLimits(max_bytes=256 << 20, max_depth=900)


def _need(data: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise WireFormatError(f"{what}: field {key!r} must be {kind}, got {value!r}")
    return value


def _maybe(data: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if data.get(key) is None:
        return None
    return _need(data, key, kind, what)


def _check_version(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise WireFormatError(f"{what} must be a JSON object")
    version = data.get("wire_version")
    if version != WIRE_VERSION:
        raise WireFormatError(
            f"{what} has wire_version {version!r}; this Loom speaks {WIRE_VERSION}",
            hint="Run the same Loom version on dispatchers and workers",
        )
    return data


def _loads(text: str | bytes, what: str, limits: PayloadLimits = DEFAULT_LIMITS) -> Any:
    try:
        return decode_json(text, limits=limits)
    except PayloadError as exc:
        raise WireFormatError(f"{what} is not valid JSON: {exc.message}") from exc


@dataclass(frozen=True, slots=True)
class ResumeEvent:
    """A gate's decision carried by a resume dispatch."""

    event_type: str
    payload: Any = None


@dataclass(frozen=True, slots=True)
class ExecutionPackage:
    """What to run, by reference: identity and resume coordinates, never code.

    ``flow_id`` names code the worker already holds. A package with ``resume_event`` delivers a
    gate's decision; ``from_sequence`` (optional) is the highest sequence the caller has seen,
    so a worker whose store is behind refuses instead of acting on stale state.
    """

    execution_id: str
    flow_id: str
    workflow_id: str | None = None
    input: Any = None
    resume_event: ResumeEvent | None = None
    snapshot_id: str | None = None
    from_sequence: int | None = None
    flow_version: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "wire_version": WIRE_VERSION,
            "execution_id": self.execution_id,
            "workflow_id": self.workflow_id,
            "flow_id": self.flow_id,
            "flow_version": self.flow_version,
            "input": self.input,
            "resume_event": (
                {"event_type": self.resume_event.event_type, "payload": self.resume_event.payload}
                if self.resume_event is not None
                else None
            ),
            "snapshot_id": self.snapshot_id,
            "from_sequence": self.from_sequence,
            "metadata": self.metadata,
        }

    def to_json(self) -> str:
        return encode_json(self.to_dict(), what="execution package")

    @classmethod
    def from_dict(cls, data: Any) -> ExecutionPackage:
        what = "execution package"
        d = _check_version(data, what)
        resume = d.get("resume_event")
        event = None
        if resume is not None:
            if not isinstance(resume, dict):
                raise WireFormatError(f"{what}: resume_event must be an object")
            event = ResumeEvent(_need(resume, "event_type", str, what), resume.get("payload"))
        execution_id = _need(d, "execution_id", str, what)
        problem = execution_id_problem(execution_id)
        if problem is not None:
            raise WireFormatError(f"{what}: {problem} (got {execution_id!r})")
        metadata = d.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise WireFormatError(f"{what}: metadata must be an object")
        return cls(
            execution_id=execution_id,
            flow_id=_need(d, "flow_id", str, what),
            workflow_id=_maybe(d, "workflow_id", str, what),
            input=d.get("input"),
            resume_event=event,
            snapshot_id=_maybe(d, "snapshot_id", str, what),
            from_sequence=_maybe(d, "from_sequence", int, what),
            flow_version=_maybe(d, "flow_version", str, what),
            metadata=metadata,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> ExecutionPackage:
        return cls.from_dict(_loads(text, "execution package"))


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """What a worker returns: the outcome, the folded state and the highest persisted sequence.

    A suspended execution is a normal, non-terminal result.
    """

    execution_id: str
    status: ExecutionStatus
    last_sequence: int
    state: dict[str, Any]

    @classmethod
    def from_state(cls, state: ExecutionState) -> ExecutionResult:
        return cls(state.execution_id, state.status, state.last_sequence, state.to_dict())

    @property
    def folded(self) -> ExecutionState:
        return ExecutionState.from_dict(self.state)

    @property
    def output(self) -> Any:
        return self.state.get("output")

    @property
    def error(self) -> dict[str, Any] | None:
        error: dict[str, Any] | None = self.state.get("error")
        return error

    def to_dict(self) -> dict[str, Any]:
        return {
            "wire_version": WIRE_VERSION,
            "execution_id": self.execution_id,
            "status": self.status.value,
            "last_sequence": self.last_sequence,
            "state": self.state,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, data: Any) -> ExecutionResult:
        what = "execution result"
        d = _check_version(data, what)
        try:
            status = ExecutionStatus(_need(d, "status", str, what))
        except ValueError as exc:
            raise WireFormatError(f"{what}: unknown status {d.get('status')!r}") from exc
        return cls(
            execution_id=_need(d, "execution_id", str, what),
            status=status,
            last_sequence=_need(d, "last_sequence", int, what),
            state=_need(d, "state", dict, what),
        )

    @classmethod
    def from_json(
        cls, text: str | bytes, *, limits: PayloadLimits = RESULT_LIMITS
    ) -> ExecutionResult:
        """Decode a result; ``limits`` defaults to snapshot-sized (a whole folded state)."""
        return cls.from_dict(_loads(text, "execution result", limits))
