from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import loom

# The public surface changes only on purpose: update this list in the same change.
EXPECTED = {
    "Agent",
    "AgentResult",
    "ApprovalPolicy",
    "Budget",
    "Price",
    "Tool",
    "agent",
    "tool",
    "Clock",
    "ConcurrentWaitError",
    "Message",
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
    "lease_expired",
    "recover_abandoned",
    "register_error",
    "register_event",
    "replay",
    "resource",
    "step",
}


def test_public_names_are_pinned() -> None:
    assert set(loom.__all__) == EXPECTED
    for name in loom.__all__:
        assert hasattr(loom, name), name


def test_misusing_the_api_is_a_type_error() -> None:
    target = Path(__file__).parent / "typing" / "misuse.py"
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(target)],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    lines = target.read_text().splitlines()
    expected = {i + 1 for i, line in enumerate(lines) if "# error" in line}
    reported = {
        int(row.split("misuse.py:")[1].split(":")[0])
        for row in out.splitlines()
        if "misuse.py:" in row and ": error:" in row
    }
    assert reported == expected, out
