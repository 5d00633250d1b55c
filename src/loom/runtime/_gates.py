"""Gate validators: checks a layer registers for its own gates' decisions.

A resume payload is validated before it is appended. A flow's ``resume_schemas`` check its
shape; a gate validator registered for an event type also sees the folded state and the
waiting gate, so a layer can refuse a decision the log makes invalid (an approval vote from
someone not allowed, or a second vote by the same person) with a typed ``ResumeError`` while
leaving the log unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loom.errors import ConfigurationError
from loom.model import ExecutionState, Gate

__all__ = ["GateValidator", "gate_validator", "register_gate_validator"]

#: ``(state, gate, payload) -> payload to record``; raises a ``ResumeError`` to refuse.
GateValidator = Callable[[ExecutionState, Gate, Any], Any]

_VALIDATORS: dict[str, GateValidator] = {}


def register_gate_validator(event_type: str, validator: GateValidator) -> None:
    """Validate every resume of gates named ``event_type`` with ``validator``."""
    current = _VALIDATORS.get(event_type)
    if current is not None and current is not validator:
        raise ConfigurationError(f"gate {event_type!r} already has a validator")
    _VALIDATORS[event_type] = validator


def gate_validator(event_type: str) -> GateValidator | None:
    return _VALIDATORS.get(event_type)
