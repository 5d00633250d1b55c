"""Placement: where executions run (ADR 0001) and how failed attempts recover (ADR 0004)."""

from loom.placement._spi import (
    DISPATCHER_SPI_VERSION,
    ExecutionDispatcher,
    Health,
    WorkerLease,
    WorkerRuntime,
    is_superseded_refusal,
)
from loom.placement._wire import (
    WIRE_VERSION,
    ExecutionPackage,
    ExecutionResult,
    Intent,
    ResumeEvent,
)
from loom.placement.dispatchers import LocalDispatcher, SupervisingDispatcher
from loom.placement.local import TIMER_WAKE, LocalWorkerRuntime, timer_package
from loom.placement.timers import dispatching_timer_service

__all__ = [
    "DISPATCHER_SPI_VERSION",
    "TIMER_WAKE",
    "WIRE_VERSION",
    "ExecutionDispatcher",
    "ExecutionPackage",
    "ExecutionResult",
    "Health",
    "Intent",
    "LocalDispatcher",
    "LocalWorkerRuntime",
    "ResumeEvent",
    "SupervisingDispatcher",
    "WorkerLease",
    "WorkerRuntime",
    "dispatching_timer_service",
    "is_superseded_refusal",
    "timer_package",
]
