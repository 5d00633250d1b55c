"""Plans: what a planner agent returns, checked against the registered agents' cards before
anything runs, recorded, then executed like a graph."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import pydantic

from loom.errors import ExecutionAlreadyExistsError, FlowNotFoundError
from loom.orchestration._cards import AgentCard
from loom.orchestration._errors import GraphValidationError, PlanValidationError
from loom.orchestration._graph import Graph, GraphRun, Node, NodeRun, execute_graph
from loom.placement import ExecutionDispatcher, ResumeEvent
from loom.runtime import WorkflowRuntime, flow
from loom.storage import Store

__all__ = ["AgentRegistry", "Plan", "PlanStep", "dispatch_plan", "record_plan"]

log = logging.getLogger("loom.orchestration")


class PlanStep(pydantic.BaseModel):
    """One step: which agent (and optionally which of its skills) runs, with what input.

    ``input`` is a constant; ``inputs`` maps from the plan's input and earlier steps'
    outputs (references as in :class:`~loom.orchestration.Node`); ``depends_on`` names the
    steps that must complete first.
    """

    model_config = pydantic.ConfigDict(extra="forbid")

    id: str
    agent: str
    skill: str | None = None
    input: Any = None
    inputs: str | dict[str, str] | None = None
    depends_on: list[str] = pydantic.Field(default_factory=list)


class Plan(pydantic.BaseModel):
    """A plan a planner agent returns (use it as the planner's ``output_type``)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    goal: str = ""
    steps: list[PlanStep]


@runtime_checkable
class AgentRegistry(Protocol):
    """Where plans look agents up: an :class:`InProcessA2ABus` is one."""

    def cards(self) -> list[AgentCard]: ...


def _validate(plan: Plan, cards: Mapping[str, AgentCard]) -> tuple[Graph | None, list[str]]:
    problems: list[str] = []
    nodes: list[Node] = []
    for step in plan.steps:
        card = cards.get(step.agent)
        if card is None:
            known = ", ".join(sorted(cards)) or "none"
            problems.append(f"step {step.id!r}: unknown agent {step.agent!r} (known: {known})")
            continue
        if step.skill is not None and card.skill(step.skill) is None:
            skills = ", ".join(s.id for s in card.skills) or "none"
            problems.append(
                f"step {step.id!r}: agent {step.agent!r} has no skill {step.skill!r} "
                f"(skills: {skills})"
            )
        if step.input is not None and step.inputs is None:
            problem = _shape_problem(step, card)
            if problem:
                problems.append(problem)
        nodes.append(
            Node(
                step.id,
                card.flow_id,
                tuple(step.depends_on),
                step.inputs,
                step.input,
            )
        )
    # Structural problems (cycles, missing steps, references) over every step, known or not.
    all_nodes = [Node(s.id, s.agent, tuple(s.depends_on), s.inputs, s.input) for s in plan.steps]
    try:
        Graph(all_nodes, id="plan")
    except GraphValidationError as exc:
        problems.extend(exc.problems)
    if problems:
        return None, problems
    return Graph(nodes, id="plan"), []


def _shape_problem(step: PlanStep, card: AgentCard) -> str | None:
    value = step.input
    if isinstance(value, str):
        if "text/plain" not in card.input_modes:
            return f"step {step.id!r}: agent {card.name!r} takes no text input"
    elif "application/json" not in card.input_modes:
        return f"step {step.id!r}: agent {card.name!r} takes only text input"
    schema = card.input_schema
    if schema is None:
        return None
    kind = schema.get("type")
    types: dict[str, Any] = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
    }
    expected = types.get(kind) if isinstance(kind, str) else None
    if expected is not None and not isinstance(value, expected):
        return f"step {step.id!r}: agent {card.name!r} takes a {kind}, not {type(value).__name__}"
    if isinstance(value, dict):
        required = schema.get("required") or []
        missing = [r for r in required if r not in value]
        if missing:
            return f"step {step.id!r}: input for {card.name!r} lacks {', '.join(missing)}"
        props = schema.get("properties")
        if isinstance(props, dict) and schema.get("additionalProperties") is False:
            extra = [k for k in value if k not in props]
            if extra:
                return f"step {step.id!r}: input for {card.name!r} has unknown {extra}"
    return None


@flow(id="loom.plan", version="1")
async def _plan_record(ctx: Any, plan: dict[str, Any]) -> dict[str, Any]:
    """The durable record of a validated plan (its input is the plan)."""
    return {"recorded": True, "steps": [s["id"] for s in plan.get("steps", [])]}


async def record_plan(runtime: WorkflowRuntime, plan: Plan, run_id: str) -> None:
    """Record ``plan`` as the execution ``run_id`` (flow ``loom.plan``): the log says what
    was planned before any step ran. Idempotent for the same run id."""
    try:
        runtime.get_flow(_plan_record.id)
    except FlowNotFoundError:
        runtime.register(_plan_record)
    try:
        handle = await runtime.start(
            _plan_record, plan.model_dump(mode="json"), execution_id=run_id
        )
    except ExecutionAlreadyExistsError:
        return
    await handle.settled()


OnStep = Callable[[PlanStep, NodeRun], Awaitable[None] | None]


async def dispatch_plan(
    plan: Plan | Mapping[str, Any],
    registry: AgentRegistry | Mapping[str, AgentCard],
    *,
    dispatcher: ExecutionDispatcher | None = None,
    on_step: OnStep | None = None,
    input: Any = None,
    run_id: str | None = None,
    store: Store | None = None,
    decisions: Mapping[str, ResumeEvent] | None = None,
) -> GraphRun:
    """Validate ``plan`` against ``registry``'s cards, record it, then run it like a graph.

    Every problem (an unknown agent or skill, an input whose shape the agent's card does not
    take, a cycle, a dependency on or reference to a missing step) is listed in one
    :class:`PlanValidationError`, and then nothing was dispatched or recorded. With a bus as
    the registry, ``dispatcher`` and ``store`` default to the bus's and the plan is recorded
    as the execution ``run_id`` (steps run as ``{run_id}.{step}``). ``on_step(step,
    node_run)`` is called after each step settles. Calling again with the same ``run_id``
    (and ``decisions`` for steps waiting at gates) continues the run.
    """
    if not isinstance(plan, Plan):
        try:
            plan = Plan.model_validate(plan)
        except pydantic.ValidationError as exc:
            raise PlanValidationError(
                "plan", [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
            ) from exc
    if isinstance(registry, Mapping):
        cards = dict(registry)
    else:
        cards = {c.name: c for c in registry.cards()}
    graph, problems = _validate(plan, cards)
    if problems or graph is None:
        raise PlanValidationError("plan", problems)
    runtime: WorkflowRuntime | None = getattr(registry, "runtime", None)
    if dispatcher is None:
        dispatcher = getattr(registry, "dispatcher", None)
        if dispatcher is None:
            raise PlanValidationError("plan", ["no dispatcher: pass dispatcher= or a bus"])
    if store is None and runtime is not None:
        store = runtime.store
    import uuid

    run_id = run_id or f"plan-{uuid.uuid4().hex[:16]}"
    if runtime is not None:
        await record_plan(runtime, plan, run_id)
    steps = {s.id: s for s in plan.steps}

    async def on_node(run: NodeRun) -> None:
        if on_step is None:
            return
        maybe = on_step(steps[run.node], run)
        if inspect.isawaitable(maybe):
            await maybe

    return await execute_graph(
        dispatcher,
        graph,
        input,
        store=store,
        run_id=run_id,
        decisions=decisions,
        on_node=on_node,
    )
