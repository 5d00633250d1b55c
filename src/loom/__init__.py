"""Loom: durable execution for agent and workflow code.

A flow is plain async Python; every step, human approval and timer it passes is recorded in an
append-only event log, so an execution survives crashes and redeploys and resumes without
re-running the effects it already committed.
"""

import importlib
from typing import TYPE_CHECKING, Any

from loom import errors, faults
from loom.agents import _events as _agent_events  # noqa: F401  (registers them: every log folds)
from loom.errors import (
    ConcurrentWaitError,
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
    lease_expired,
    recover_abandoned,
    register_error,
    resource,
    step,
)
from loom.storage import InMemoryStore, Message, Snapshot, SQLiteStore

if TYPE_CHECKING:
    from loom.agents import (
        Agent,
        AgentResult,
        ApprovalPolicy,
        Budget,
        Price,
        Tool,
        agent,
        tool,
    )

#: The agent names, imported on first use (see ``loom.agents``): a process that runs only flows
#: never loads the agent loop and the model providers' types.
_AGENT_NAMES = frozenset(
    {"Agent", "AgentResult", "ApprovalPolicy", "Budget", "Price", "Tool", "agent", "tool"}
)

if not TYPE_CHECKING:  # a module __getattr__ seen by mypy would make every name resolve

    def __getattr__(name: str) -> Any:
        if name not in _AGENT_NAMES:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module("loom.agents"), name)
        globals()[name] = value  # later lookups find it without this hook
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_AGENT_NAMES})


__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentResult",
    "ApprovalPolicy",
    "Budget",
    "Clock",
    "ConcurrentWaitError",
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
    "Message",
    "NonDeterminismError",
    "NotWaitingError",
    "Price",
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
    "Tool",
    "UnknownEventError",
    "WorkflowContext",
    "WorkflowRuntime",
    "__version__",
    "agent",
    "current_step",
    "errors",
    "faults",
    "flow",
    "handler",
    "lease_expired",
    "recover_abandoned",
    "register_error",
    "register_event",
    "replay",
    "resource",
    "step",
    "tool",
]
