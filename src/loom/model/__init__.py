"""The model layer: events, envelopes, ExecutionState and the pure replay fold. No I/O."""

from loom.model._codec import DEFAULT_LIMITS, PayloadLimits, checksum, decode_json, encode_json
from loom.model._events import (
    TERMINAL_STATUSES,
    Envelope,
    EventType,
    ExecutionStatus,
    new_envelope_id,
)
from loom.model._state import ExecutionState, Gate, OpRecord, apply_event, replay

__all__ = [
    "DEFAULT_LIMITS",
    "TERMINAL_STATUSES",
    "Envelope",
    "EventType",
    "ExecutionState",
    "ExecutionStatus",
    "Gate",
    "OpRecord",
    "PayloadLimits",
    "apply_event",
    "checksum",
    "decode_json",
    "encode_json",
    "new_envelope_id",
    "replay",
]
