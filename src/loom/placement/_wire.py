"""ExecutionPackage and ExecutionResult: the immutable, JSON wire shapes of placement."""

from __future__ import annotations

import enum
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

__all__ = [
    "READABLE_VERSIONS",
    "REDISPATCH",
    "TIMER_WAKE",
    "WIRE_VERSION",
    "ExecutionPackage",
    "ExecutionResult",
    "Intent",
    "ResumeEvent",
]

#: The wire shape's version this Loom writes. Version 2 added a package's ``intent`` and
#: ``redispatch`` flag; version 1 (where a worker inferred both) is still read.
WIRE_VERSION = 2
#: What a reader accepts; anything else is refused with WireFormatError.
READABLE_VERSIONS = frozenset({1, 2})

#: The resume event of a timer wake package (the payload names the waiting position).
TIMER_WAKE = "loom.timer-wake"

#: Where a version-1 package carried the redispatch marker (its metadata).
REDISPATCH = "loom.redispatch"


class Intent(enum.StrEnum):
    """What a package asks a worker to do (one worker method each)."""

    #: Run a new execution (a redispatched start whose first attempt ran continues it).
    START = "start"
    #: Deliver a gate's decision (``resume_event``) to a suspended execution.
    RESUME = "resume"
    #: End the timed wait at a position whose timer is due (a timer service's wake).
    WAKE = "wake"
    #: Continue a running execution whose holder stopped (recovery), from its newest snapshot.
    CONTINUE = "continue"


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
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise WireFormatError(
            f"{what} has wire_version {version!r}; this Loom reads "
            f"{', '.join(map(str, sorted(READABLE_VERSIONS)))}",
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
    #: The gate position the decision is for (optional): a worker refuses it for another gate.
    position: int | None = None


@dataclass(frozen=True, slots=True)
class ExecutionPackage:
    """What to run, by reference: identity and resume coordinates, never code.

    ``flow_id`` names code the worker already holds. ``intent`` says what to do (see
    :class:`Intent`): a ``RESUME`` carries the gate's decision in ``resume_event``, a ``WAKE``
    the timer's position (``resume_event`` of type :data:`TIMER_WAKE`); ``START`` and
    ``CONTINUE`` carry none. Built without an intent, a package with a ``resume_event`` is a
    resume (or a wake), as version 1 of the wire inferred. ``redispatch`` marks a dispatcher's
    retry after its own failed attempt: only then may a resume take over a running execution
    that the failed attempt left. ``from_sequence`` (optional) is the highest sequence the
    caller has seen, so a worker whose store is behind refuses instead of acting on stale state.
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
    intent: Intent = Intent.START
    redispatch: bool = False

    def __post_init__(self) -> None:
        event = self.resume_event
        intent = Intent(self.intent)
        if event is not None and intent is Intent.START:  # no intent given: as version 1 did
            intent = Intent.WAKE if event.event_type == TIMER_WAKE else Intent.RESUME
        object.__setattr__(self, "intent", intent)
        waits = intent in (Intent.RESUME, Intent.WAKE)
        if waits != (event is not None):
            raise WireFormatError(
                f"a {intent} package {'needs' if waits else 'takes no'} resume_event",
                execution_id=self.execution_id,
            )
        if event is not None and (event.event_type == TIMER_WAKE) != (intent is Intent.WAKE):
            raise WireFormatError(
                f"a {intent} package cannot carry a {event.event_type!r} event",
                execution_id=self.execution_id,
            )

    @property
    def wake_position(self) -> int | None:
        """The position a ``WAKE`` package ends the wait at (None if it names none)."""
        event = self.resume_event if self.intent is Intent.WAKE else None
        payload = event.payload if event is not None else None
        position = payload.get("position") if isinstance(payload, dict) else None
        return position if type(position) is int else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "wire_version": WIRE_VERSION,
            "intent": self.intent.value,
            "redispatch": self.redispatch,
            "execution_id": self.execution_id,
            "workflow_id": self.workflow_id,
            "flow_id": self.flow_id,
            "flow_version": self.flow_version,
            "input": self.input,
            "resume_event": self._resume_dict(),
            "snapshot_id": self.snapshot_id,
            "from_sequence": self.from_sequence,
            "metadata": self.metadata,
        }

    def _resume_dict(self) -> dict[str, Any] | None:
        event = self.resume_event
        if event is None:
            return None
        out = {"event_type": event.event_type, "payload": event.payload}
        if event.position is not None:
            out["position"] = event.position  # absent otherwise: older readers stay happy
        return out

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
            position = _maybe(resume, "position", int, what)
            if position is not None and (isinstance(position, bool) or position < 0):
                raise WireFormatError(f"{what}: resume_event.position must be a gate position")
            event = ResumeEvent(
                _need(resume, "event_type", str, what), resume.get("payload"), position
            )
        execution_id = _need(d, "execution_id", str, what)
        problem = execution_id_problem(execution_id)
        if problem is not None:
            raise WireFormatError(f"{what}: {problem} (got {execution_id!r})")
        metadata = d.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise WireFormatError(f"{what}: metadata must be an object")
        if d["wire_version"] == 1:
            intent = Intent.START  # inferred from resume_event in __post_init__
            redispatch = bool(metadata.get(REDISPATCH))
        else:
            try:
                intent = Intent(_need(d, "intent", str, what))
            except ValueError as exc:
                raise WireFormatError(f"{what}: unknown intent {d.get('intent')!r}") from exc
            if intent is Intent.START and event is not None:
                raise WireFormatError(f"{what}: a start package takes no resume_event")
            redispatch = _need(d, "redispatch", bool, what)
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
            intent=intent,
            redispatch=redispatch,
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
