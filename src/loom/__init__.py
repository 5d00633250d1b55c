"""Loom: durable execution for agent and workflow code.

A flow is plain async Python; every step, human approval and timer it passes is recorded in an
append-only event log, so an execution survives crashes and redeploys and resumes without
re-running the effects it already committed.
"""

from typing import TYPE_CHECKING

from loom import errors, faults
from loom._lazy import lazy_exports as _lazy_exports
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

if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_exports(globals(), dict.fromkeys(_AGENT_NAMES, "loom.agents"))


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
