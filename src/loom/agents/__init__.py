"""Durable agents: ``loom.agent`` (a tool loop whose every model call and tool call is a
recorded step), ``@loom.tool``, approval gates, budgets and the live text channel."""

# The names are imported on first use (PEP 562), not with the package: a process that only runs
# flows (a worker, a recovery, the CLI) never loads the agent loop, the model providers' types
# and what they import (~25 ms of every `import loom`). What every process does need from here,
# the agent events' registrations (a log holding them must fold anywhere), lives in
# ``loom.agents._events``, which ``loom`` imports itself.

from __future__ import annotations

from typing import TYPE_CHECKING

from loom._lazy import lazy_exports

if TYPE_CHECKING:
    from loom.agents._agent import (
        Agent,
        AgentOutputError,
        AgentResult,
        Budget,
        Outcome,
        Price,
        UsageAccounting,
        agent,
    )
    from loom.agents._approval import (
        APPROVAL_EVENT,
        ApprovalPolicy,
        Verdict,
        VoteRefusedError,
        args_hash,
        pending_approval,
        vote,
    )
    from loom.agents._events import ModelCalled, VoteRecorded
    from loom.agents._live import LIVE, LiveText
    from loom.agents._tool import FatalToolError, Tool, ToolArgumentsError, tool

_EXPORTS: dict[str, str] = {
    "APPROVAL_EVENT": "loom.agents._approval",
    "Agent": "loom.agents._agent",
    "AgentOutputError": "loom.agents._agent",
    "AgentResult": "loom.agents._agent",
    "ApprovalPolicy": "loom.agents._approval",
    "Budget": "loom.agents._agent",
    "FatalToolError": "loom.agents._tool",
    "LIVE": "loom.agents._live",
    "LiveText": "loom.agents._live",
    "ModelCalled": "loom.agents._events",
    "Outcome": "loom.agents._agent",
    "Price": "loom.agents._agent",
    "Tool": "loom.agents._tool",
    "ToolArgumentsError": "loom.agents._tool",
    "UsageAccounting": "loom.agents._agent",
    "Verdict": "loom.agents._approval",
    "VoteRecorded": "loom.agents._events",
    "VoteRefusedError": "loom.agents._approval",
    "agent": "loom.agents._agent",
    "args_hash": "loom.agents._approval",
    "pending_approval": "loom.agents._approval",
    "tool": "loom.agents._tool",
    "vote": "loom.agents._approval",
}

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)


__all__ = [
    "APPROVAL_EVENT",
    "LIVE",
    "Agent",
    "AgentOutputError",
    "AgentResult",
    "ApprovalPolicy",
    "Budget",
    "FatalToolError",
    "LiveText",
    "ModelCalled",
    "Outcome",
    "Price",
    "Tool",
    "ToolArgumentsError",
    "UsageAccounting",
    "Verdict",
    "VoteRecorded",
    "VoteRefusedError",
    "agent",
    "args_hash",
    "pending_approval",
    "tool",
    "vote",
]
