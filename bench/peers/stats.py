"""Summaries of repeated measurements: the median, and the min-max spread."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Series"]


@dataclass
class Series:
    """One workload's samples on one system and backend (one value per repetition)."""

    unit: str
    samples: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def low(self) -> float | None:
        return min(self.samples) if self.samples else None

    @property
    def high(self) -> float | None:
        return max(self.samples) if self.samples else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "samples": self.samples,
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "extra": self.extra,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Series:
        return cls(
            unit=data["unit"],
            samples=list(data.get("samples", [])),
            extra=dict(data.get("extra", {})),
            error=data.get("error"),
        )
