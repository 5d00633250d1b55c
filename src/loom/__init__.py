"""Loom: durable execution for agent and workflow code.

A flow is plain async Python; every step, human approval and timer it passes is recorded in an
append-only event log, so an execution survives crashes and redeploys and resumes without
re-running the effects it already committed.
"""

from loom import errors, faults
from loom.errors import (
    ExecutionAlreadyExistsError,
    ExecutionCancelledError,
    ExecutionFailedError,
    ExecutionNotFoundError,
    ExecutionSupersededError,
    FlowNotFoundError,
    GateTimedOutError,
    InvalidInputError,
    LoomError,
    NonDeterminismError,
    NotWaitingError,
    ResumeValidationError,
    RetryableError,
    StepFailedError,
    TerminalError,
    UnknownEventError,
)
from loom.model import (
    Envelope,
    EventType,
    ExecutionState,
    ExecutionStatus,
    register_event,
    replay,
)
from loom.runtime import (
    Clock,
    ExecutionHandle,
    Flow,
    RetryPolicy,
    Step,
    StepInfo,
    SystemClock,
    WorkflowContext,
    WorkflowRuntime,
    current_step,
    flow,
    handler,
    recover_abandoned,
    step,
)
from loom.storage import InMemoryStore, Snapshot, SQLiteStore

__version__ = "0.1.0"

__all__ = [
    "Clock",
    "Envelope",
    "EventType",
    "ExecutionAlreadyExistsError",
    "ExecutionCancelledError",
    "ExecutionFailedError",
    "ExecutionHandle",
    "ExecutionNotFoundError",
    "ExecutionState",
    "ExecutionStatus",
    "ExecutionSupersededError",
    "Flow",
    "FlowNotFoundError",
    "GateTimedOutError",
    "InMemoryStore",
    "InvalidInputError",
    "LoomError",
    "NonDeterminismError",
    "NotWaitingError",
    "ResumeValidationError",
    "RetryPolicy",
    "RetryableError",
    "SQLiteStore",
    "Snapshot",
    "Step",
    "StepFailedError",
    "StepInfo",
    "SystemClock",
    "TerminalError",
    "UnknownEventError",
    "WorkflowContext",
    "WorkflowRuntime",
    "__version__",
    "current_step",
    "errors",
    "faults",
    "flow",
    "handler",
    "recover_abandoned",
    "register_event",
    "replay",
    "step",
]
