"""Gate validators: checks a layer registers for its own gates' decisions.

A resume payload is validated before it is appended. A flow's ``resume_schemas`` check its
shape; a gate validator registered for an event type also sees the folded state and the
waiting gate, so a layer can refuse a decision the log makes invalid (an approval vote from
someone not allowed, or a second vote by the same person) with a typed ``ResumeError`` while
leaving the log unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loom.errors import ConfigurationError
from loom.model import EventPayload, ExecutionState, Gate

__all__ = ["GateRecord", "GateValidator", "gate_validator", "register_gate_validator"]

#: ``(state, gate, payload) -> payload to record`` (or a :class:`GateRecord`); raises a
#: ``ResumeError`` to refuse.
GateValidator = Callable[[ExecutionState, Gate, Any], Any]


@dataclass(frozen=True, slots=True)
class GateRecord:
    """What a gate validator may return instead of a bare payload: the payload the gate's
    ``EXECUTION_RESUMED`` carries, and the layer's own registered ``events``, appended right
    after it in the same atomic write. A layer records its decision as its own typed event
    that way (``agents.vote_recorded``: its reducer puts the vote where the flow reads the
    gate's value), while the resume itself stays the core event the index and feeds know."""

    payload: Any
    events: Sequence[EventPayload] = ()


_VALIDATORS: dict[str, GateValidator] = {}


def register_gate_validator(event_type: str, validator: GateValidator) -> None:
    """Validate every resume of gates named ``event_type`` with ``validator``."""
    current = _VALIDATORS.get(event_type)
    if current is not None and current is not validator:
        raise ConfigurationError(f"gate {event_type!r} already has a validator")
    _VALIDATORS[event_type] = validator


def gate_validator(event_type: str) -> GateValidator | None:
    return _VALIDATORS.get(event_type)
