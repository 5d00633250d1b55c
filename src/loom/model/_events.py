"""Envelopes and Loom's built-in event types: the append-only log's records."""

from __future__ import annotations

import enum
import json
import math
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from loom.errors import UnknownEventError
from loom.model._codec import (
    DEFAULT_LIMITS,
    PayloadLimits,
    encode_json,
    envelope_checksum,
)
from loom.model._registry import event_type_of, lookup
from loom.model._vocabulary import StepCompleted

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
    #: The checksum, once computed (never copied by ``dataclasses.replace``: not an init field).
    _checksum: str = field(repr=False, compare=False, default="", init=False)
    #: True when :meth:`of` gave it its derived id (so a store need not build the id again to
    #: compare); False says nothing. Not an init field: ``dataclasses.replace`` resets it.
    id_derived: bool = field(repr=False, compare=False, default=False, init=False)

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
        kind: str
        if type(event) is StepCompleted:  # every step's record: its type is known
            kind = EventType.STEP_COMPLETED
            wire = event.to_wire()
            text = _step_completed_json(event, limits)
        else:
            kind = event_type_of(event)
            wire = event.to_wire()
            text = None
        if text is None:
            text = encode_json(wire, limits=limits, what=f"{kind} payload")
        derived = not envelope_id
        eid = envelope_id or f"{execution_id}#{sequence}.{fence}"
        # Every step builds one: the slots are filled directly, as a frozen dataclass's own
        # __init__ does through a slower object.__setattr__ per field, and the checksum the
        # store writes is computed once here, from the parts at hand.
        env = _new_object(cls)
        _set_envelope_id(env, eid)
        _set_execution_id(env, execution_id)
        _set_sequence(env, sequence)
        _set_type(env, kind)
        _set_payload(env, wire)
        _set_recorded_at(env, recorded_at)
        _set_fence(env, fence)
        _set_payload_json(env, text)
        _set_typed(env, event)
        # The type as plain text: formatting an enum member costs a Python-level __format__.
        _set_checksum(
            env,
            envelope_checksum(
                eid, execution_id, sequence, _TYPE_TEXT.get(kind, kind), text, recorded_at, fence
            ),
        )
        if derived:
            _set_id_derived(env, True)
        return env

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
        known = self._checksum
        if known:
            return known
        return envelope_checksum(
            self.envelope_id,
            self.execution_id,
            self.sequence,
            self.type,
            self.payload_json,
            self.recorded_at,
            self.fence,
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


_new_object = object.__new__
# The slots' own setters (what a frozen dataclass's __init__ reaches through object.__setattr__).
(
    _set_envelope_id,
    _set_execution_id,
    _set_sequence,
    _set_type,
    _set_payload,
    _set_recorded_at,
    _set_fence,
    _set_payload_json,
    _set_typed,
    _set_checksum,
    _set_id_derived,
) = (getattr(Envelope, f.name).__set__ for f in fields(Envelope))

#: Each built-in type's name as a plain str (what formatting or str() of the member gives).
_TYPE_TEXT: dict[str, str] = {member: member.value for member in EventType}
_encode_str = json.encoder.encode_basestring
#: Step ids as JSON strings (a flow has a handful of step ids; bounded all the same).
_STEP_IDS: dict[str, str] = {}


def _step_completed_json(e: StepCompleted, limits: PayloadLimits) -> str | None:
    """``encode_json(e.to_wire())`` for the common record (plain output, no annotations), from
    pre-encoded keys and step id; None for anything else, which the generic encoder (and its
    refusals, word for word) then handles."""
    if e.annotations:
        return None
    pos, attempt, out, started = e.position, e.attempt, e.output, e.started_at
    if type(pos) is not int or type(attempt) is not int:
        return None
    kind = type(out)
    if out is None:
        output = "null"
    elif kind is str:
        output = _encode_str(out)
    elif kind is int:
        output = repr(out)  # exactly an int: repr() without the slot wrapper's call
    elif kind is bool:
        output = "true" if out else "false"
    else:
        return None
    if started is None:
        at = "null"
    elif type(started) is float and math.isfinite(started):
        at = repr(started)
    else:
        return None
    sid = _STEP_IDS.get(e.step_id)
    if sid is None:
        if type(e.step_id) is not str:
            return None
        sid = _encode_str(e.step_id)
        if len(_STEP_IDS) < 4096:
            _STEP_IDS[e.step_id] = sid
    text = (
        f'{{"position":{pos},"step_id":{sid},"attempt":{attempt},"output":{output},'
        f'"started_at":{at}}}'
    )
    if not text.isascii():
        try:
            text.encode()
        except UnicodeError:
            return None
    if len(text) * 4 > limits.max_bytes or limits.max_depth < 1:
        return None  # near a limit (this record is one level deep): the generic path decides
    return text


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
