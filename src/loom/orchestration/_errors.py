"""The typed errors of the orchestration layer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loom.errors import ConfigurationError, LoomError, TerminalError

__all__ = [
    "GraphDispatchError",
    "GraphValidationError",
    "PlanValidationError",
    "TaskNotFoundError",
    "TaskRejectedError",
    "TaskTerminalError",
    "UnknownAgentError",
]


class ProblemsError(ConfigurationError):
    """A refusal listing every problem found, before anything was dispatched."""

    problems: list[str]

    def __init__(self, what: str, problems: Sequence[str], **details: Any) -> None:
        listed = "; ".join(problems)
        super().__init__(
            f"{what} refused ({len(problems)} problem(s)): {listed}",
            hint="Nothing was dispatched; fix the problems and submit it again",
            problems=list(problems),
            **details,
        )


class GraphValidationError(ProblemsError):
    """A graph with a cycle, a missing node or an input mapping naming a missing output."""

    code = "graph_invalid"


class PlanValidationError(ProblemsError):
    """A plan naming an unknown agent or skill, with a bad input shape or a cycle."""

    code = "plan_invalid"


class UnknownAgentError(LoomError):
    """No agent (or flow) of that name is registered on the bus."""

    code = "unknown_agent"


class TaskNotFoundError(LoomError):
    """No task (execution) of that id exists."""

    code = "task_not_found"
    default_hint = (
        "Check the task id (send() returns it) and that this bus reads the store its workers "
        "write to; bus.wait(task_id, missing_ok=True) waits for a task still being started"
    )


class TaskTerminalError(LoomError):
    """A message was sent to a task that already ended (completed, failed, canceled,
    rejected): a terminal task takes no more input. Nothing was dispatched."""

    code = "task_terminal"
    state: str


class TaskRejectedError(TerminalError):
    """Raise it in a flow or agent to end its task as ``rejected`` (A2A's "the agent
    declined the task"), e.g. after an operator rejected it at a gate."""

    code = "task_rejected"


class GraphDispatchError(LoomError):
    """A node's dispatch was refused because another holder owns its execution, and the
    graph has no store to await that holder's outcome by id."""

    code = "graph_dispatch"
    node: str
