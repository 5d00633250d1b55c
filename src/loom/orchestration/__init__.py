"""Orchestration: agents addressed by name on an A2A-shaped bus, graphs of flows and agents,
plans a planner returns; every run placed through an ExecutionDispatcher (ADR 0001).

The A2A protocol edge (``loom.orchestration.a2a``) needs the ``a2a`` extra.
"""

from loom.orchestration import _in_flow  # noqa: F401 - installs ctx.execute_graph
from loom.orchestration._bus import InProcessA2ABus, card_for
from loom.orchestration._cards import AgentCard, AgentSkill
from loom.orchestration._errors import (
    GraphDispatchError,
    GraphValidationError,
    PlanValidationError,
    TaskNotFoundError,
    TaskRejectedError,
    TaskTerminalError,
    UnknownAgentError,
)
from loom.orchestration._graph import (
    Graph,
    GraphRun,
    Node,
    NodeRun,
    alternative_execution_id,
    cancel_graph,
    execute_graph,
    node_execution_id,
)
from loom.orchestration._plan import AgentRegistry, Plan, PlanStep, dispatch_plan, record_plan
from loom.orchestration._simulate import SimulatedBranch, Simulation, simulate
from loom.orchestration._tasks import Task, TaskState, settled

__all__ = [
    "AgentCard",
    "AgentRegistry",
    "AgentSkill",
    "Graph",
    "GraphDispatchError",
    "GraphRun",
    "GraphValidationError",
    "InProcessA2ABus",
    "Node",
    "NodeRun",
    "Plan",
    "PlanStep",
    "PlanValidationError",
    "SimulatedBranch",
    "Simulation",
    "Task",
    "TaskNotFoundError",
    "TaskRejectedError",
    "TaskState",
    "TaskTerminalError",
    "UnknownAgentError",
    "alternative_execution_id",
    "cancel_graph",
    "card_for",
    "dispatch_plan",
    "execute_graph",
    "node_execution_id",
    "record_plan",
    "settled",
    "simulate",
]
