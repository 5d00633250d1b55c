"""Placement: where executions run (ADR 0001) and how failed attempts recover (ADR 0004)."""

from loom.placement._spi import (
    DISPATCHER_SPI_VERSION,
    ExecutionDispatcher,
    Health,
    WorkerLease,
    WorkerRuntime,
    is_superseded_refusal,
)
from loom.placement._wire import WIRE_VERSION, ExecutionPackage, ExecutionResult, ResumeEvent
from loom.placement.dispatchers import LocalDispatcher, SupervisingDispatcher
from loom.placement.local import LocalWorkerRuntime

__all__ = [
    "DISPATCHER_SPI_VERSION",
    "WIRE_VERSION",
    "ExecutionDispatcher",
    "ExecutionPackage",
    "ExecutionResult",
    "Health",
    "LocalDispatcher",
    "LocalWorkerRuntime",
    "ResumeEvent",
    "SupervisingDispatcher",
    "WorkerLease",
    "WorkerRuntime",
    "is_superseded_refusal",
]
