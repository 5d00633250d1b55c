"""Durable agents: ``loom.agent`` (a tool loop whose every model call and tool call is a
recorded step), ``@loom.tool``, approval gates, budgets and the live text channel."""

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
