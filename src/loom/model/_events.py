"""Envelopes and Loom's built-in event types: the append-only log's records."""

from __future__ import annotations

import enum
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loom.errors import UnknownEventError
from loom.model._codec import DEFAULT_LIMITS, PayloadLimits, checksum, encode_json
from loom.model._registry import event_type_of, lookup

__all__ = [
    "TERMINAL_STATUSES",
    "Envelope",
    "EventType",
    "ExecutionStatus",
    "derived_envelope_id",
    "has_derived_form",
    "new_envelope_id",
]


class EventType(enum.StrEnum):
    """Loom's own event types. An envelope's ``type`` is one of these members for a built-in
    event, or the registered name of an extension's event (see :func:`register_event`)."""

    EXECUTION_STARTED = "EXECUTION_STARTED"
    STEP_STARTED = "STEP_STARTED"
    STEP_COMPLETED = "STEP_COMPLETED"
    STEP_FAILED = "STEP_FAILED"
    EXECUTION_SUSPENDED = "EXECUTION_SUSPENDED"
    EXECUTION_RESUMED = "EXECUTION_RESUMED"
    EXECUTION_RECOVERED = "EXECUTION_RECOVERED"
    TIMER_SCHEDULED = "TIMER_SCHEDULED"
    TIMER_FIRED = "TIMER_FIRED"
    DECISION_RECORDED = "DECISION_RECORDED"
    UI_PATCHED = "UI_PATCHED"
    EXECUTION_FORKED = "EXECUTION_FORKED"
    EXECUTION_COMPLETED = "EXECUTION_COMPLETED"
    EXECUTION_FAILED = "EXECUTION_FAILED"
    EXECUTION_CANCELLED = "EXECUTION_CANCELLED"


class ExecutionStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {ExecutionStatus.COMPLETED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED}
)


def new_envelope_id() -> str:
    """A unique random id with a time-ordered prefix (message ids, execution ids, and the
    envelope ids of a take-over, which racers at one fence must not share)."""
    return f"{time.time_ns():016x}{os.urandom(8).hex()}"


def derived_envelope_id(execution_id: str, sequence: int, fence: int) -> str:
    """The id of an envelope built without one: ``f"{execution_id}#{sequence}.{fence}"``.

    Unique because (execution, sequence) is (a log has one record per sequence), so a store
    need not index it: it stores an empty id for a record carrying its own derived id and
    rebuilds it on reading, and only explicit ids pay for a uniqueness index. The fence is
    part of it so that a record of a fenced-out writer never shares its id with the record
    that replaced it. It starts with the execution id, so a tenant view's scoping (a prefix
    on both) maps derived ids to derived ids. Injective: the text after the last ``#`` holds
    no ``#``.
    """
    return f"{execution_id}#{sequence}.{fence}"


_DERIVED_TAIL = re.compile(r"#(?:0|[1-9][0-9]*)\.(?:0|[1-9][0-9]*)\Z")


def has_derived_form(envelope_id: str) -> bool:
    """Whether ``envelope_id`` is the derived id of some (execution, sequence, fence)."""
    return _DERIVED_TAIL.search(envelope_id) is not None


@dataclass(frozen=True, slots=True)
class Envelope:
    """One immutable record of the log.

    ``type`` is an :class:`EventType` member for Loom's own events and the registered name
    (``"agents.model_called"``) for an extension's. ``payload`` is the stored JSON object and
    ``payload_json`` its exact stored text; stores persist that verbatim and the checksum
    covers it, so what was validated before the append is byte-for-byte what is read.
    :attr:`event` is the payload as its registered type.
    """

    envelope_id: str
    execution_id: str
    sequence: int
    type: str
    payload: Mapping[str, Any]
    recorded_at: float
    fence: int
    payload_json: str = field(repr=False, compare=False, default="")
    #: The typed payload this envelope was built from (or decoded to), once known.
    typed: Any = field(repr=False, compare=False, default=None)

    @classmethod
    def create(
        cls,
        execution_id: str,
        sequence: int,
        type: str,
        payload: Mapping[str, Any],
        *,
        fence: int,
        recorded_at: float,
        envelope_id: str | None = None,
        limits: PayloadLimits = DEFAULT_LIMITS,
    ) -> Envelope:
        """Build an envelope from a wire payload, encoding (and so validating) it up front.
        Without ``envelope_id`` it gets its derived id (:func:`derived_envelope_id`)."""
        kind = as_event_type(type)
        text = encode_json(payload, limits=limits, what=f"{kind} payload")
        return cls(
            envelope_id or f"{execution_id}#{sequence}.{fence}",
            execution_id,
            sequence,
            kind,
            payload,
            recorded_at,
            fence,
            text,
        )

    @classmethod
    def of(
        cls,
        execution_id: str,
        sequence: int,
        event: Any,
        *,
        fence: int,
        recorded_at: float,
        envelope_id: str | None = None,
        limits: PayloadLimits = DEFAULT_LIMITS,
    ) -> Envelope:
        """Build an envelope from a typed payload of a registered event type (without
        ``envelope_id``: its derived id, inlined here as every step builds one)."""
        kind = event_type_of(event)
        wire = event.to_wire()
        text = encode_json(wire, limits=limits, what=f"{kind} payload")
        return cls(
            envelope_id or f"{execution_id}#{sequence}.{fence}",
            execution_id,
            sequence,
            kind,
            wire,
            recorded_at,
            fence,
            text,
            event,
        )

    @property
    def event(self) -> Any:
        """The payload as its registered type.

        Raises :class:`UnknownEventError` when no payload type is registered for ``type``, and
        ``KeyError``/``TypeError``/``ValueError`` for a payload its type cannot read.
        """
        typed = self.typed
        if typed is None:
            entry = lookup(self.type)
            if entry is None:
                raise unknown_event(self.execution_id, self.sequence, self.type)
            typed = entry.payload_type.from_wire(self.payload)
            object.__setattr__(self, "typed", typed)
        return typed

    def checksum(self) -> str:
        return checksum(
            self.envelope_id,
            self.execution_id,
            str(self.sequence),
            str(self.type),
            self.payload_json,
            repr(self.recorded_at),
            str(self.fence),
        )

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, limits: PayloadLimits = DEFAULT_LIMITS
    ) -> Envelope:
        """Rebuild an envelope from :meth:`to_dict` output (golden logs, exports)."""
        return cls.create(
            str(data["execution_id"]),
            int(data["sequence"]),
            str(data["type"]),
            dict(data["payload"]),
            fence=int(data["fence"]),
            recorded_at=float(data["recorded_at"]),
            envelope_id=str(data["envelope_id"]),
            limits=limits,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "envelope_id": self.envelope_id,
            "execution_id": self.execution_id,
            "sequence": self.sequence,
            "type": str(self.type),
            "payload": dict(self.payload),
            "recorded_at": self.recorded_at,
            "fence": self.fence,
        }


def as_event_type(name: str) -> str:
    """``name`` as its :class:`EventType` member when it is a built-in type, else as given."""
    return EventType._value2member_map_.get(name, name)  # type: ignore[return-value]


def unknown_event(execution_id: str, sequence: int, type: str) -> UnknownEventError:
    return UnknownEventError(
        f"event {sequence} of execution {execution_id!r} has type {type!r}, which this "
        "process cannot fold: it was written by a newer Loom or an unregistered extension",
        execution_id=execution_id,
        sequence=sequence,
        event_type=type,
    )


#: The longest execution id any entry point accepts.
MAX_EXECUTION_ID = 256


def execution_id_problem(execution_id: object) -> str | None:
    """Why ``execution_id`` is not a valid execution id, or None if it is.

    One rule for every entry point (runtime calls, the wire decoder, a worker's allocate), so a
    malformed id is refused before anything (not even a fence) is written for it.
    """
    if not isinstance(execution_id, str) or not execution_id:
        return "an execution id must be a non-empty string"
    if len(execution_id) > MAX_EXECUTION_ID:
        return f"an execution id must be at most {MAX_EXECUTION_ID} characters"
    if not execution_id.isprintable():
        # Control characters, NUL, ESC and line/paragraph separators would corrupt logs,
        # terminals and headers that show the id.
        return "an execution id must not contain control or separator characters"
    return None
