"""The runtime: flows, steps, the workflow context and the WorkflowRuntime that drives them."""

from loom.runtime._clock import Clock, SystemClock
from loom.runtime._context import SuspendExecution, UIState, WorkflowContext
from loom.runtime._dryrun import DryRun
from loom.runtime._fork import Branch
from loom.runtime._gates import GateRecord, GateValidator, register_gate_validator
from loom.runtime._intercept import CallNext, StepCall, StepInterceptor, resource
from loom.runtime._runtime import ExecutionHandle, Lease, WorkflowRuntime
from loom.runtime._sdk import (
    Flow,
    RetryPolicy,
    Step,
    StepInfo,
    current_step,
    flow,
    handler,
    register_error,
    step,
)
from loom.runtime.recovery import RecoveryReport, lease_expired, recover_abandoned
from loom.runtime.timers import TimerService, WakeOutcome

__all__ = [
    "Branch",
    "CallNext",
    "Clock",
    "DryRun",
    "ExecutionHandle",
    "Flow",
    "GateRecord",
    "GateValidator",
    "Lease",
    "RecoveryReport",
    "RetryPolicy",
    "Step",
    "StepCall",
    "StepInfo",
    "StepInterceptor",
    "SuspendExecution",
    "SystemClock",
    "TimerService",
    "UIState",
    "WakeOutcome",
    "WorkflowContext",
    "WorkflowRuntime",
    "current_step",
    "flow",
    "handler",
    "lease_expired",
    "recover_abandoned",
    "register_error",
    "register_gate_validator",
    "resource",
    "step",
]
