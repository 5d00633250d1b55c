"""Envelopes and event types: the append-only log's vocabulary."""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loom.model._codec import DEFAULT_LIMITS, PayloadLimits, checksum, encode_json

__all__ = ["TERMINAL_STATUSES", "Envelope", "EventType", "ExecutionStatus", "new_envelope_id"]


class EventType(enum.StrEnum):
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
    """A unique id whose time-ordered prefix keeps the store's uniqueness index append-mostly."""
    return f"{time.time_ns():016x}{os.urandom(8).hex()}"


@dataclass(frozen=True, slots=True)
class Envelope:
    """One immutable record of the log.

    ``payload_json`` is the exact stored text of ``payload``; stores persist it verbatim and the
    checksum covers it, so what was validated before the append is byte-for-byte what is read.
    """

    envelope_id: str
    execution_id: str
    sequence: int
    type: EventType
    payload: Mapping[str, Any]
    recorded_at: float
    fence: int
    payload_json: str = field(repr=False, compare=False, default="")

    @classmethod
    def create(
        cls,
        execution_id: str,
        sequence: int,
        type: EventType,
        payload: Mapping[str, Any],
        *,
        fence: int,
        recorded_at: float,
        envelope_id: str | None = None,
        limits: PayloadLimits = DEFAULT_LIMITS,
    ) -> Envelope:
        """Build an envelope, encoding (and so validating) its payload up front."""
        text = encode_json(payload, limits=limits, what=f"{type} payload")
        return cls(
            envelope_id or new_envelope_id(),
            execution_id,
            sequence,
            type,
            payload,
            recorded_at,
            fence,
            text,
        )

    def checksum(self) -> str:
        return checksum(
            self.envelope_id,
            self.execution_id,
            str(self.sequence),
            self.type.value,
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
            EventType(data["type"]),
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
            "type": self.type.value,
            "payload": dict(self.payload),
            "recorded_at": self.recorded_at,
            "fence": self.fence,
        }
