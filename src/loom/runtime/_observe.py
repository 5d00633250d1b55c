"""Observation hooks: how tracing (OpenTelemetry or anything else) sees steps run."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Protocol, runtime_checkable

from loom.runtime._sdk import StepInfo

__all__ = ["NO_OBSERVER", "StepObserver"]


@runtime_checkable
class StepObserver(Protocol):
    """Wraps each attempt of each step's effect (not replays: a replayed step runs nothing)."""

    def step(self, info: StepInfo) -> AbstractContextManager[object]: ...


class _NoObserver:
    def step(self, info: StepInfo) -> AbstractContextManager[object]:
        return nullcontext()


NO_OBSERVER: StepObserver = _NoObserver()
