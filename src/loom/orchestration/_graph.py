"""Graphs: a pure, validated DAG of flow/agent nodes, and an executor that runs it through a
dispatcher, each node its own execution with a deterministic id under the run's id."""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic

from loom.errors import NotWaitingError, ResumeError
from loom.model import ExecutionState, ExecutionStatus, Gate, execution_id_problem
from loom.orchestration._errors import GraphDispatchError, GraphValidationError
from loom.orchestration._tasks import TaskState, fold, settled, task_state
from loom.placement import (
    ExecutionDispatcher,
    ExecutionPackage,
    ExecutionResult,
    Intent,
    ResumeEvent,
    is_superseded_refusal,
)
from loom.runtime import Flow, WorkflowRuntime
from loom.storage import Store

__all__ = [
    "Graph",
    "GraphRun",
    "GraphStatus",
    "Node",
    "NodeRun",
    "cancel_graph",
    "execute_graph",
    "node_execution_id",
]

log = logging.getLogger("loom.orchestration")

INPUT = "$input"
_NODE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: What an agent node's output (``AgentResult.to_dict()``) holds.
_AGENT_KEYS = frozenset({"output", "outcome", "turns", "usage", "cost", "text", "exhausted"})

GraphStatus = str  # "completed" | "suspended" | "failed" | "rejected" | "cancelled"


@dataclass(frozen=True, slots=True)
class Node:
    """One node: a flow or an agent (by id, or the object itself, which lets the graph check
    references into its output), the nodes it depends on, and how its input is built.

    ``inputs`` maps from upstream outputs: a reference (``"node"``, ``"node.field.sub"``,
    ``"$input"``, ``"$input.field"``) is the whole input; a mapping of field -> reference
    builds a dict (merged over ``constant`` when that is a dict). Without ``inputs``: the
    ``constant`` if given, else the graph's input (no dependencies), the one dependency's
    output, or ``{dep: output}`` in the declared order of ``deps``.
    """

    id: str
    flow: str | Flow[Any, Any]
    deps: tuple[str, ...] = ()
    inputs: str | Mapping[str, str] | None = None
    constant: Any = None

    @property
    def flow_id(self) -> str:
        return self.flow if isinstance(self.flow, str) else self.flow.id

    def references(self) -> list[str]:
        if self.inputs is None:
            return []
        if isinstance(self.inputs, str):
            return [self.inputs]
        return list(self.inputs.values())


def _problems(nodes: Sequence[Node], known_flows: Iterable[str] | None) -> list[str]:
    problems: list[str] = []
    by_id: dict[str, Node] = {}
    for node in nodes:
        if not isinstance(node.id, str) or not _NODE_ID.match(node.id):
            problems.append(f"node id {node.id!r} must be 1-64 of [A-Za-z0-9_-]")
        if node.id in by_id:
            problems.append(f"two nodes are named {node.id!r}")
        by_id[node.id] = node
    known = None if known_flows is None else set(known_flows)
    for node in nodes:
        if known is not None and node.flow_id not in known:
            problems.append(f"node {node.id!r}: no flow or agent {node.flow_id!r} is registered")
        for dep in node.deps:
            if dep not in by_id:
                problems.append(f"node {node.id!r} depends on a missing node {dep!r}")
            elif dep == node.id:
                problems.append(f"node {node.id!r} depends on itself")
        if node.inputs is not None and not isinstance(node.inputs, (str, Mapping)):
            problems.append(f"node {node.id!r}: inputs must be a reference or a mapping of them")
            continue
        mapped = isinstance(node.inputs, Mapping)
        if mapped and node.constant is not None and not isinstance(node.constant, Mapping):
            problems.append(f"node {node.id!r}: a mapped input merges only a dict constant")
    cycle = _cycle(nodes, by_id)
    if cycle:
        problems.append("a cycle: " + " -> ".join(cycle))
    else:
        for node in nodes:
            ancestors = _ancestors(node.id, by_id)
            for ref in node.references():
                problem = _reference_problem(node, ref, by_id, ancestors)
                if problem:
                    problems.append(problem)
    return problems


def _cycle(nodes: Sequence[Node], by_id: Mapping[str, Node]) -> list[str]:
    colour: dict[str, int] = {}
    path: list[str] = []

    def visit(nid: str) -> list[str]:
        colour[nid] = 1
        path.append(nid)
        for dep in by_id[nid].deps:
            if dep not in by_id:
                continue
            if colour.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in colour:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        colour[nid] = 2
        return []

    for node in nodes:
        if node.id not in colour:
            found = visit(node.id)
            if found:
                return found
    return []


def _ancestors(nid: str, by_id: Mapping[str, Node]) -> set[str]:
    seen: set[str] = set()
    todo = [d for d in by_id[nid].deps if d in by_id]
    while todo:
        dep = todo.pop()
        if dep not in seen:
            seen.add(dep)
            todo.extend(d for d in by_id[dep].deps if d in by_id)
    return seen


def _reference_problem(
    node: Node, ref: Any, by_id: Mapping[str, Node], ancestors: set[str]
) -> str | None:
    if not isinstance(ref, str) or not ref:
        return f"node {node.id!r}: input reference {ref!r} is not a string"
    head, *path = ref.split(".")
    if head == INPUT:
        return None
    if head not in by_id:
        return f"node {node.id!r}: input {ref!r} names a missing node {head!r}"
    if head not in ancestors:
        return (
            f"node {node.id!r}: input {ref!r} reads node {head!r}, which it does not "
            "depend on (add it to deps)"
        )
    fields = _output_fields(by_id[head].flow, path)
    if fields is not None and path and path[-1] not in fields:
        listed = ", ".join(sorted(fields))
        return (
            f"node {node.id!r}: input {ref!r} names a missing output {path[-1]!r} of "
            f"{head!r} (it has: {listed})"
        )
    return None


def _output_fields(flow: str | Flow[Any, Any], path: list[str]) -> set[str] | None:
    """The field names valid at the end of ``path`` into ``flow``'s output, when known."""
    if isinstance(flow, str) or not path:
        return None
    model: Any = None
    output_type = getattr(flow, "output_type", None)
    if hasattr(flow, "provider") and hasattr(flow, "tools"):  # an agent
        if len(path) == 1:
            return set(_AGENT_KEYS)
        if path[0] != "output":
            return None
        path, model = path[1:], output_type
    else:
        model = flow.output.annotation
    for step in path[:-1]:
        if not _is_model(model) or step not in model.model_fields:
            return None
        model = model.model_fields[step].annotation
    return set(model.model_fields) if _is_model(model) else None


def _is_model(value: Any) -> bool:
    return inspect.isclass(value) and issubclass(value, pydantic.BaseModel)


class Graph:
    """A validated DAG of :class:`Node`. Pure data: building one dispatches nothing.

    Refused with :class:`GraphValidationError` (listing every problem): duplicate or
    malformed node ids, a dependency on a missing node, a cycle, an input reference to a
    missing node, to one the node does not depend on, or to an output field that the
    upstream flow's output type does not have. ``known_flows`` (optional) also refuses
    nodes naming flows not among them.
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        *,
        id: str = "graph",
        known_flows: Iterable[str] | None = None,
    ) -> None:
        nodes = list(nodes)
        problems = _problems(nodes, known_flows)
        if not nodes:
            problems.append("a graph needs at least one node")
        if problems:
            raise GraphValidationError(f"graph {id!r}", problems)
        self.id = id
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self._by_id = {n.id: n for n in nodes}
        dependents = {d for n in nodes for d in n.deps}
        #: Nodes nothing depends on, in declared order: the graph's result.
        self.sinks: tuple[str, ...] = tuple(n.id for n in nodes if n.id not in dependents)

    def node(self, node_id: str) -> Node:
        return self._by_id[node_id]

    def __repr__(self) -> str:
        return f"<loom.Graph {self.id!r} {[n.id for n in self.nodes]}>"


def node_execution_id(run_id: str, node_id: str) -> str:
    """The deterministic execution id of ``node_id`` in the graph run ``run_id``."""
    return f"{run_id}.{node_id}"


@dataclass(frozen=True, slots=True)
class NodeRun:
    """One node's execution as the run last saw it."""

    node: str
    execution_id: str
    state: TaskState
    output: Any = None
    error: dict[str, Any] | None = None
    gate: Gate | None = None
    dispatched: bool = False


@dataclass(frozen=True, slots=True)
class GraphRun:
    """The outcome of one :func:`execute_graph` call.

    ``status``: ``completed`` (every node), ``suspended`` (some node waits at a gate: see
    ``waiting``; run again with ``decisions`` to continue), ``failed``, ``rejected`` or
    ``cancelled`` (a node ended so; nothing downstream of it was started). ``outputs`` holds
    every completed node's output in declared order; ``output`` is the sink nodes' (the one
    sink's output, or ``{sink: output}`` in declared order).
    """

    run_id: str
    status: GraphStatus
    nodes: dict[str, NodeRun]
    outputs: dict[str, Any]
    sinks: tuple[str, ...] = ()
    not_started: tuple[str, ...] = ()

    @property
    def waiting(self) -> dict[str, Gate]:
        return {n: r.gate for n, r in self.nodes.items() if r.gate is not None}

    @property
    def output(self) -> Any:
        if len(self.sinks) == 1:
            return self.outputs.get(self.sinks[0])
        return {s: self.outputs.get(s) for s in self.sinks}

    def decision(self, node: str, payload: Any) -> ResumeEvent:
        """A decision for the gate ``node`` waits on, pinned to that gate's position (a
        decision repeated after the node moved on to another gate is never applied there)."""
        gate = self.waiting.get(node)
        if gate is None:
            raise ResumeError(
                f"node {node!r} of graph run {self.run_id!r} is not waiting at a gate",
                execution_id=node_execution_id(self.run_id, node),
            )
        return ResumeEvent(gate.event_type, payload, gate.position)


class _MappingError(Exception):
    pass


def _resolve(ref: str, graph_input: Any, outputs: Mapping[str, Any]) -> Any:
    head, *path = ref.split(".")
    value = graph_input if head == INPUT else outputs[head]
    for step in path:
        if isinstance(value, Mapping) and step in value:
            value = value[step]
        else:
            raise _MappingError(f"{ref!r}: the output has no {step!r}")
    return value


def node_input(node: Node, graph_input: Any, outputs: Mapping[str, Any]) -> Any:
    """The input ``node`` gets from the graph's input and its upstream outputs."""
    if isinstance(node.inputs, str):
        return _resolve(node.inputs, graph_input, outputs)
    if isinstance(node.inputs, Mapping):
        built: dict[str, Any] = dict(node.constant or {})
        for key, ref in node.inputs.items():
            built[key] = _resolve(ref, graph_input, outputs)
        return built
    if node.constant is not None:
        return node.constant
    if not node.deps:
        return graph_input
    if len(node.deps) == 1:
        return outputs[node.deps[0]]
    return {dep: outputs[dep] for dep in node.deps}


OnNode = Callable[[NodeRun], Awaitable[None] | None]


async def execute_graph(
    dispatcher: ExecutionDispatcher,
    graph: Graph,
    input: Any = None,
    *,
    store: Store | None = None,
    run_id: str | None = None,
    decisions: Mapping[str, ResumeEvent] | None = None,
    on_node: OnNode | None = None,
) -> GraphRun:
    """Run ``graph`` through ``dispatcher``; independent nodes run in parallel.

    Each node is an :class:`ExecutionPackage` whose id is ``{run_id}.{node}``
    (:func:`node_execution_id`), so calling this again with the same ``run_id`` (after a
    crash, or to continue a suspended run) continues the run: a node that ended or waits is
    reported from its log (with ``store``) or by the worker's idempotent execute, never run
    again. A node that suspends at a gate makes the run ``suspended`` (see
    :attr:`GraphRun.waiting`); pass ``decisions`` (node -> :meth:`GraphRun.decision`) to
    resume those nodes and go on. Without ``run_id`` a new run starts.

    A superseded refusal (another holder owns a node's execution, ADR 0004) is awaited by id
    through ``store``: the node's outcome is the holder's. Without a store that cannot be
    done and :class:`GraphDispatchError` says so. ``on_node`` is called after each node
    settles.
    """
    run_id = run_id or f"{graph.id}-{uuid.uuid4().hex[:16]}"
    problem = execution_id_problem(node_execution_id(run_id, "x" * 64))
    if problem is not None:
        raise GraphValidationError(f"graph run {run_id!r}", [f"run id: {problem}"])
    return await _Executor(dispatcher, graph, input, store, run_id, decisions, on_node).run()


@dataclass
class _Executor:
    dispatcher: ExecutionDispatcher
    graph: Graph
    input: Any
    store: Store | None
    run_id: str
    decisions: Mapping[str, ResumeEvent] | None
    on_node: OnNode | None
    results: dict[str, NodeRun] = field(default_factory=dict)

    async def run(self) -> GraphRun:
        decisions = dict(self.decisions or {})
        unknown = [n for n in decisions if n not in {x.id for x in self.graph.nodes}]
        if unknown:
            raise GraphValidationError(
                f"graph run {self.run_id!r}",
                [f"a decision for a missing node {n!r}" for n in unknown],
            )
        outputs: dict[str, Any] = {}
        in_flight: dict[asyncio.Task[NodeRun], str] = {}
        stopped = False
        try:
            while True:
                if not stopped:
                    for node in self.graph.nodes:
                        if node.id in self.results or node.id in in_flight.values():
                            continue
                        if not all(
                            self.results.get(d) is not None
                            and self.results[d].state is TaskState.COMPLETED
                            for d in node.deps
                        ):
                            continue
                        try:
                            value = node_input(node, self.input, outputs)
                        except _MappingError as exc:
                            self.results[node.id] = NodeRun(
                                node.id,
                                node_execution_id(self.run_id, node.id),
                                TaskState.FAILED,
                                error={"type": "GraphMappingError", "message": str(exc)},
                            )
                            stopped = True
                            break
                        task = asyncio.ensure_future(
                            self._node(node, value, decisions.get(node.id))
                        )
                        in_flight[task] = node.id
                if not in_flight:
                    break
                done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    nid = in_flight.pop(task)
                    result = task.result()
                    self.results[nid] = result
                    if result.state is TaskState.COMPLETED:
                        outputs[nid] = result.output
                    elif result.state is not TaskState.INPUT_REQUIRED:
                        stopped = True  # nothing downstream of a failure starts
                    if self.on_node is not None:
                        maybe = self.on_node(result)
                        if inspect.isawaitable(maybe):
                            await maybe
        except BaseException:
            for task, nid in in_flight.items():
                task.cancel()
                await self.dispatcher.cancel(node_execution_id(self.run_id, nid))
            raise
        return self._report(outputs)

    def _report(self, outputs: dict[str, Any]) -> GraphRun:
        states = {r.state for r in self.results.values()}
        status: GraphStatus
        if TaskState.FAILED in states:
            status = "failed"
        elif TaskState.REJECTED in states:
            status = "rejected"
        elif TaskState.CANCELED in states:
            status = "cancelled"
        elif len(self.results) == len(self.graph.nodes) and states == {TaskState.COMPLETED}:
            status = "completed"
        else:
            status = "suspended"
        ordered = {n.id: outputs[n.id] for n in self.graph.nodes if n.id in outputs}
        nodes = {n.id: self.results[n.id] for n in self.graph.nodes if n.id in self.results}
        not_started = tuple(n.id for n in self.graph.nodes if n.id not in self.results)
        return GraphRun(self.run_id, status, nodes, ordered, self.graph.sinks, not_started)

    async def _node(self, node: Node, value: Any, decision: ResumeEvent | None) -> NodeRun:
        eid = node_execution_id(self.run_id, node.id)
        state: ExecutionState | None = None
        dispatched = False
        if self.store is not None:
            state = await fold(self.store, eid)
            if state is not None and state.status in (
                ExecutionStatus.RUNNING,
                ExecutionStatus.PENDING,
            ):
                # Driven by someone (another run of this graph, a worker still going): await
                # it by id rather than racing it with a second holder.
                state = await settled(self.store, eid)
        if state is None:
            package = ExecutionPackage(
                execution_id=eid, flow_id=node.flow_id, workflow_id=self.run_id, input=value
            )
            state = await self._dispatch(node, package)
            dispatched = True
        if (
            decision is not None
            and state.status is ExecutionStatus.SUSPENDED
            and state.waiting is not None
            and task_state(state) is TaskState.INPUT_REQUIRED
        ):
            package = ExecutionPackage(
                execution_id=eid,
                flow_id=state.flow_id,
                flow_version=state.flow_version,
                workflow_id=self.run_id,
                resume_event=decision,
                from_sequence=state.last_sequence,
                intent=Intent.RESUME,
            )
            try:
                state = await self._dispatch(node, package)
            except NotWaitingError as exc:
                # A decision for a gate the node already left (a repeated call): report.
                log.info("decision for %s not applied: %s", eid, exc)
                state = await self._reload(eid, state)
            dispatched = True
        ts = task_state(state)
        if ts is TaskState.WORKING and self.store is not None:
            # Suspended on the runtime's own wait (a sleep, its children): await it by id.
            state = await settled(self.store, eid)
            ts = task_state(state)
        return NodeRun(
            node.id,
            eid,
            ts,
            state.output if ts is TaskState.COMPLETED else None,
            state.error,
            state.waiting if ts is TaskState.INPUT_REQUIRED else None,
            dispatched,
        )

    async def _reload(self, eid: str, state: ExecutionState) -> ExecutionState:
        if self.store is None:
            return state
        return await fold(self.store, eid) or state

    async def _dispatch(self, node: Node, package: ExecutionPackage) -> ExecutionState:
        eid = package.execution_id
        try:
            result: ExecutionResult = await self.dispatcher.dispatch(package)
        except Exception as exc:
            if not is_superseded_refusal(exc, eid):
                raise
            if self.store is None:
                raise GraphDispatchError(
                    f"node {node.id!r}: another holder owns {eid!r}, and this graph has no "
                    "store to await its outcome by id",
                    execution_id=eid,
                    hint="Pass store= to execute_graph (the store the workers write to)",
                    node=node.id,
                ) from exc
            log.info("dispatch of %s superseded; awaiting the holder by id", eid)
            return await settled(self.store, eid)
        return result.folded


async def cancel_graph(
    runtime: WorkflowRuntime, graph: Graph, run_id: str, reason: str | None = None
) -> dict[str, TaskState]:
    """Cancel every node of the run that has started and not ended (in the log: a holder
    anywhere is fenced out and stops). A later :func:`execute_graph` of the run reports
    ``cancelled`` and starts nothing more. Returns each started node's state."""
    states: dict[str, TaskState] = {}
    for node in graph.nodes:
        eid = node_execution_id(run_id, node.id)
        state = await runtime.load_state(eid)
        if state is None:
            continue
        if not state.is_terminal:
            state = await runtime.cancel(eid, reason)
        states[node.id] = task_state(state)
    return states
