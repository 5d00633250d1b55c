"""Loom's own event payloads: one immutable type per :class:`EventType`.

Each ``to_wire()`` writes exactly the keys (and key order) Loom has always stored, so logs
written before the vocabulary was typed and logs written after it are byte-identical; each
``from_wire()`` reads what older writers stored, filling the defaults they left out.

They are named tuples rather than frozen dataclasses because every load decodes one per event:
building a tuple costs a fraction of a frozen dataclass's per-field ``object.__setattr__``, and
keeps a replay as cheap as the untyped fold was (``bench/fold.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Self

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_new = tuple.__new__

__all__ = [
    "DecisionRecorded",
    "ExecutionCancelled",
    "ExecutionCompleted",
    "ExecutionFailed",
    "ExecutionForked",
    "ExecutionRecovered",
    "ExecutionResumed",
    "ExecutionStarted",
    "ExecutionSuspended",
    "StepCompleted",
    "StepFailed",
    "StepStarted",
    "TimerFired",
    "TimerScheduled",
    "UIPatched",
]


def _bad_position() -> ValueError:
    return ValueError("payload has no valid 'position'")


class ExecutionStarted(NamedTuple):
    """Sequence 0 of every log: which flow (and version) runs, with what input."""

    flow_id: str
    flow_version: str = ""
    input: Any = None
    metadata: Mapping[str, Any] = _EMPTY

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "flow_id": self.flow_id,
            "flow_version": self.flow_version,
            "input": self.input,
        }
        if self.metadata:
            wire["metadata"] = dict(self.metadata)
        return wire

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        return _new(
            cls,
            (
                str(data["flow_id"]),
                str(data.get("flow_version", "")),
                data.get("input"),
                dict(data.get("metadata") or {}),
            ),
        )


class StepStarted(NamedTuple):
    """An attempt of a step began (only for steps declared with ``record_start``)."""

    position: int
    step_id: str
    attempt: int = 1

    def to_wire(self) -> dict[str, Any]:
        return {"position": self.position, "step_id": self.step_id, "attempt": self.attempt}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        pos = data.get("position")
        if type(pos) is not int or pos < 0:  # bool is an int, but True is no position
            raise _bad_position()
        return _new(
            cls,
            (
                pos,
                str(data["step_id"]),
                int(data.get("attempt", 1)),
            ),
        )


class StepCompleted(NamedTuple):
    """A step's effect ran and returned ``output``.

    ``annotations`` is what step interceptors attached to the record (tokens, cost); it is
    stored only when present, so records without it keep their old bytes.
    """

    position: int
    step_id: str
    attempt: int = 1
    output: Any = None
    started_at: float | None = None
    annotations: Mapping[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "position": self.position,
            "step_id": self.step_id,
            "attempt": self.attempt,
            "output": self.output,
            "started_at": self.started_at,
        }
        if self.annotations:
            wire["annotations"] = dict(self.annotations)
        return wire

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        annotations = data.get("annotations")
        pos = data.get("position")
        if type(pos) is not int or pos < 0:  # bool is an int, but True is no position
            raise _bad_position()
        return _new(
            cls,
            (
                pos,
                str(data["step_id"]),
                int(data.get("attempt", 1)),
                data.get("output"),
                data.get("started_at"),
                dict(annotations) if annotations else None,
            ),
        )


class StepFailed(NamedTuple):
    """An attempt of a step raised; ``final`` when the retry policy gave up."""

    position: int
    step_id: str
    attempt: int = 1
    error: Mapping[str, Any] | None = None
    final: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "step_id": self.step_id,
            "attempt": self.attempt,
            "error": self.error,
            "final": self.final,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        error = data.get("error")
        pos = data.get("position")
        if type(pos) is not int or pos < 0:  # bool is an int, but True is no position
            raise _bad_position()
        return _new(
            cls,
            (
                pos,
                str(data["step_id"]),
                int(data.get("attempt", 1)),
                error if isinstance(error, dict) or error is None else {"message": str(error)},
                bool(data.get("final")),
            ),
        )


class ExecutionSuspended(NamedTuple):
    """The execution waits at ``position``: on a gate named ``event_type``, or (``timer``)
    on a durable sleep whose timer ends it at ``timeout_at``."""

    position: int
    event_type: str
    correlation_key: str | None = None
    timeout_at: float | None = None
    timer: bool = False

    def to_wire(self) -> dict[str, Any]:
        if self.timer:
            return {
                "position": self.position,
                "event_type": self.event_type,
                "timer": True,
                "timeout_at": self.timeout_at,
            }
        return {
            "position": self.position,
            "event_type": self.event_type,
            "correlation_key": self.correlation_key,
            "timeout_at": self.timeout_at,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        pos = data.get("position")
        if type(pos) is not int or pos < 0:  # bool is an int, but True is no position
            raise _bad_position()
        return _new(
            cls,
            (
                pos,
                str(data["event_type"]),
                data.get("correlation_key"),
                data.get("timeout_at"),
                bool(data.get("timer")),
            ),
        )


class ExecutionResumed(NamedTuple):
    """A gate's decision arrived (validated against the flow's resume schema)."""

    position: int
    event_type: str
    payload: Any = None
    #: The mailbox message the gate consumed (runtime.send), or a keyed resume's id; stored
    #: only when present.
    message_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        wire = {"position": self.position, "event_type": self.event_type, "payload": self.payload}
        if self.message_id is not None:
            wire["message_id"] = self.message_id
        return wire

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        pos = data.get("position")
        if type(pos) is not int or pos < 0:  # bool is an int, but True is no position
            raise _bad_position()
        return _new(
            cls,
            (
                pos,
                str(data.get("event_type", "")),
                data.get("payload"),
                None if data.get("message_id") is None else str(data["message_id"]),
            ),
        )


class TimerScheduled(NamedTuple):
    """A durable sleep at ``position`` will end at ``fire_at``."""

    position: int
    fire_at: float | None = None
    name: str = "sleep"

    def to_wire(self) -> dict[str, Any]:
        return {"position": self.position, "name": self.name, "fire_at": self.fire_at}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        pos = data.get("position")
        if type(pos) is not int or pos < 0:  # bool is an int, but True is no position
            raise _bad_position()
        return _new(
            cls,
            (
                pos,
                data.get("fire_at"),
                str(data.get("name", "sleep")),
            ),
        )


class TimerFired(NamedTuple):
    """The timed wait at ``position`` ended by its timer: a sleep elapsed, or (``timed_out``)
    a gate's timeout passed before its decision."""

    position: int
    timed_out: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {"position": self.position, "timed_out": self.timed_out}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        pos = data.get("position")
        if type(pos) is not int or pos < 0:  # bool is an int, but True is no position
            raise _bad_position()
        return _new(
            cls,
            (
                pos,
                bool(data.get("timed_out")),
            ),
        )


class DecisionRecorded(NamedTuple):
    """A value computed once by ``ctx.decide`` (returned as recorded on every replay)."""

    position: int
    name: str
    value: Any = None

    def to_wire(self) -> dict[str, Any]:
        return {"position": self.position, "name": self.name, "value": self.value}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        pos = data.get("position")
        if type(pos) is not int or pos < 0:  # bool is an int, but True is no position
            raise _bad_position()
        return _new(
            cls,
            (
                pos,
                str(data["name"]),
                data.get("value"),
            ),
        )


class UIPatched(NamedTuple):
    """A change to the UI projection: ``op`` is ``set`` or ``merge`` (shallow)."""

    position: int
    key: str
    value: Any = None
    op: str = "set"

    def to_wire(self) -> dict[str, Any]:
        return {"position": self.position, "op": self.op, "key": self.key, "value": self.value}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        pos = data.get("position")
        if type(pos) is not int or pos < 0:  # bool is an int, but True is no position
            raise _bad_position()
        return _new(
            cls,
            (
                pos,
                str(data["key"]),
                data.get("value"),
                str(data.get("op", "set")),
            ),
        )


class ExecutionRecovered(NamedTuple):
    """A new holder took over a running execution whose last holder stopped."""

    from_sequence: int = -1
    snapshot_sequence: int = -1

    def to_wire(self) -> dict[str, Any]:
        return {"from_sequence": self.from_sequence, "snapshot_sequence": self.snapshot_sequence}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        return _new(
            cls,
            (
                int(data.get("from_sequence", -1)),
                int(data.get("snapshot_sequence", -1)),
            ),
        )


class ExecutionForked(NamedTuple):
    """This execution's log is a prefix of another's: what it was forked from.

    ``source`` is the whole stored record (a parent id and a fork point, plus whatever the
    writer added), kept as the state's ``forked_from``.
    """

    source: Mapping[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return dict(self.source)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        return _new(cls, (dict(data),))


class ExecutionCompleted(NamedTuple):
    """The flow returned ``output`` (terminal)."""

    output: Any = None

    def to_wire(self) -> dict[str, Any]:
        return {"output": self.output}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        return _new(cls, (data.get("output"),))


class ExecutionFailed(NamedTuple):
    """The flow raised; ``error`` is the recorded description (terminal)."""

    error: Mapping[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"error": self.error}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        error = data.get("error")
        return _new(
            cls, (error if isinstance(error, dict) or error is None else {"message": str(error)},)
        )


class ExecutionCancelled(NamedTuple):
    """The execution was cancelled (terminal)."""

    reason: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"reason": self.reason}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        return _new(cls, (data.get("reason"),))
