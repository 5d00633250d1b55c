"""The event registry: which event types this process can fold, with their payload types.

The log's vocabulary is open. Loom registers its own events (``EventType``); a layer built on
Loom registers its namespaced events (``agents.model_called``, ``branches.promoted``) with
:func:`register_event`, each with a frozen payload type and a small reducer, so a new layer
never edits the core fold. An event whose type no reducer is registered for cannot be folded:
:class:`~loom.errors.UnknownEventError`, which is not corruption (the record is intact; this
process is older than its writer or lacks the extension that defines it).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, TypeVar, runtime_checkable

from loom.errors import ConfigurationError

if TYPE_CHECKING:
    from loom.model._events import Envelope
    from loom.model._state import ExecutionState

__all__ = [
    "EventPayload",
    "Payload",
    "Reducer",
    "event_type_of",
    "lookup",
    "register_event",
    "registered_event_types",
]


@runtime_checkable
class EventPayload(Protocol):
    """What a payload type gives the log: its wire form and a way back from it.

    ``to_wire()`` returns the JSON object stored as the event's payload (key order is part of
    the stored bytes). ``from_wire(data)`` rebuilds the payload from a stored object; it must
    tolerate keys it does not know (a newer writer may add optional ones) and raise
    ``KeyError``/``TypeError``/``ValueError`` for a payload it cannot read (the fold reports
    that as a corrupt record).
    """

    def to_wire(self) -> dict[str, Any]: ...

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self: ...


class Payload:
    """Base for a payload declared as a frozen dataclass of JSON values.

    The wire form is the dataclass's fields in declaration order; reading ignores unknown keys
    and fills missing ones from the field defaults::

        @dataclass(frozen=True, slots=True)
        class ModelCalled(loom.model.Payload):
            position: int
            model: str
            tokens: int = 0
    """

    __slots__ = ()
    _wire_fields: ClassVar[tuple[str, ...]]

    @classmethod
    def _fields(cls) -> tuple[str, ...]:
        names = cls.__dict__.get("_wire_fields")
        if names is None:
            if not dataclasses.is_dataclass(cls):
                raise TypeError(f"{cls.__name__} must be a dataclass to use Payload")
            names = tuple(f.name for f in dataclasses.fields(cls))
            cls._wire_fields = names
        return names  # type: ignore[no-any-return]

    def to_wire(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields()}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        return cls(**{name: data[name] for name in cls._fields() if name in data})


P = TypeVar("P")

#: A reducer folds one event into the state in place: ``reducer(state, payload, envelope)``.
#: It raises ``ValueError`` (or :class:`~loom.errors.CorruptEventError`) for an event that
#: cannot follow the state it is given; it must not do I/O or read the clock.
Reducer = Callable[["ExecutionState", P, "Envelope"], None]


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    payload_type: type[Any]
    reducer: Callable[[ExecutionState, Any, Envelope], None]
    #: ``payload_type.from_wire``, bound once: the fold calls it for every event it loads.
    decode: Callable[[Mapping[str, Any]], Any]


_BY_TYPE: dict[str, _Entry] = {}
_TYPE_OF: dict[type[Any], str] = {}
_NAMESPACED = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
_MAX_TYPE = 128


def _register(type: str, payload_type: type[P], reducer: Reducer[P]) -> None:
    existing = _BY_TYPE.get(type)
    if existing is not None:
        if existing.payload_type is payload_type and existing.reducer is reducer:
            return  # the same registration again (an extension imported twice): harmless
        raise ConfigurationError(
            f"event type {type!r} is already registered (payload "
            f"{existing.payload_type.__qualname__})",
            hint="Each event type has one payload type and one reducer; pick another name",
        )
    other = _TYPE_OF.get(payload_type)
    if other is not None:
        raise ConfigurationError(
            f"payload type {payload_type.__qualname__} already belongs to event {other!r}",
            hint="Declare one payload class per event type",
        )
    for method in ("to_wire", "from_wire"):
        if not callable(getattr(payload_type, method, None)):
            raise ConfigurationError(
                f"payload type {payload_type.__qualname__} has no {method}()",
                hint="Derive it from loom.model.Payload (a frozen dataclass of JSON values)",
            )
    decode = getattr(payload_type, "from_wire")  # noqa: B009 - checked callable above
    _BY_TYPE[type] = _Entry(type, payload_type, reducer, decode)
    _TYPE_OF[payload_type] = type


def register_event(type: str, payload_type: type[P], reducer: Reducer[P]) -> None:
    """Teach this process to fold events of ``type`` (an extension's namespaced event).

    ``type`` is the name stored in the log: lower-case dotted words with a namespace, e.g.
    ``"agents.model_called"`` (Loom's own event types are upper-case and cannot be replaced).
    ``payload_type`` has ``to_wire()`` / ``from_wire()`` (derive it from :class:`Payload`);
    ``reducer(state, payload, envelope)`` folds one event into the state in place. It may
    change an op record that is not completed in place, but replaces a completed one
    (``state.ops[pos] = OpRecord(...)``) rather than changing it, and replaces JSON values
    rather than mutating them: a snapshot carries only the records that changed, found that
    way, so a completed record changed in place would load as it was.

    Register at import time of the module that defines the event, in every process that reads
    such logs (workers, the CLI, a console): a process that meets an event type nobody
    registered refuses to fold it with :class:`~loom.errors.UnknownEventError` rather than
    guess. Registering the same triple twice is a no-op; anything else that reuses a name or
    a payload type raises :class:`~loom.errors.ConfigurationError`.
    """
    if not isinstance(type, str) or len(type) > _MAX_TYPE or not _NAMESPACED.fullmatch(type):
        raise ConfigurationError(
            f"event type {type!r} is not a namespaced name",
            hint="Use lower-case dotted words with a namespace, e.g. 'agents.model_called'",
        )
    if not callable(reducer):
        raise ConfigurationError(f"the reducer for {type!r} is not callable")
    _register(type, payload_type, reducer)


def lookup(type: str) -> _Entry | None:
    """The registration for ``type``, or None when this process cannot fold it."""
    return _BY_TYPE.get(type)


def event_type_of(payload: object) -> str:
    """The registered event type of a payload instance."""
    name = _TYPE_OF.get(payload.__class__)
    if name is None:
        raise ConfigurationError(
            f"{payload.__class__.__qualname__} is not a registered event payload",
            hint="Register it with loom.register_event(type, payload_type, reducer)",
        )
    return name


def registered_event_types() -> frozenset[str]:
    """Every event type this process can fold (built-in and registered)."""
    return frozenset(_BY_TYPE)
