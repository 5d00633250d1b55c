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

from loom.errors import FlowNotFoundError, NotWaitingError, ResumeError
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
    "alternative_execution_id",
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

FlowRef = str | Flow[Any, Any]
#: One alternative of a node: a flow (it gets the node's input), or ``(flow, input)``.
Alternative = FlowRef | tuple[FlowRef, Any]
#: Joins the alternatives' outputs (in declared order) into the node's output.
Chooser = Callable[[list[Any]], Any]


@dataclass(frozen=True, slots=True)
class Node:
    """One node: a flow or an agent (by id, or the object itself, which lets the graph check
    references into its output), the nodes it depends on, and how its input is built.

    ``inputs`` maps from upstream outputs: a reference (``"node"``, ``"node.field.sub"``,
    ``"node.0"`` into a list, ``"$input"``, ``"$input.field"``) is the whole input; a mapping
    of field -> reference builds a dict (merged over ``constant`` when that is a dict).
    Without ``inputs``: the ``constant`` if given, else the graph's input (no dependencies),
    the one dependency's output, or ``{dep: output}`` in the declared order of ``deps``.

    ``alternatives`` (instead of ``flow``): each alternative, a flow getting the node's input
    or a ``(flow, input)`` pair, runs as its own execution, all at once, with the id
    ``{node's id}.{i}`` (:func:`alternative_execution_id`): never two writers on one log.
    The node completes when every alternative did; its output is their outputs in declared
    order, or ``choose(outputs)`` (a pure function: inside a flow it runs again on replay).
    The first alternative (in declared order) that fails, is rejected or cancelled ends the
    node so; one waiting at a gate keeps the node waiting (decide it as ``"node.i"``).
    """

    id: str
    flow: FlowRef | None = None
    deps: tuple[str, ...] = ()
    inputs: str | Mapping[str, str] | None = None
    constant: Any = None
    alternatives: Sequence[Alternative] = ()
    choose: Chooser | None = None

    @property
    def flow_id(self) -> str:
        if self.flow is None:
            return ""
        return self.flow if isinstance(self.flow, str) else self.flow.id

    def branches(self, value: Any) -> list[tuple[str, FlowRef, Any]]:
        """``(key, flow, input)`` per execution this node runs: itself, or its alternatives
        (key ``"node.i"``), given the node's input ``value``."""
        if not self.alternatives:
            assert self.flow is not None  # validated by Graph
            return [(self.id, self.flow, value)]
        out: list[tuple[str, FlowRef, Any]] = []
        for i, alt in enumerate(self.alternatives):
            flow, inp = alt if isinstance(alt, tuple) else (alt, value)
            out.append((f"{self.id}.{i}", flow, inp))
        return out

    def join(self, outputs: list[Any]) -> Any:
        """The node's output from its alternatives' outputs (in declared order)."""
        return outputs if self.choose is None else self.choose(outputs)

    def references(self) -> list[str]:
        if self.inputs is None:
            return []
        if isinstance(self.inputs, str):
            return [self.inputs]
        return list(self.inputs.values())


def _flow_id(flow: Any) -> str | None:
    if isinstance(flow, str):
        return flow
    if isinstance(flow, Flow) or (hasattr(flow, "id") and hasattr(flow, "provider")):
        return str(flow.id)
    return None


def _node_shape_problems(node: Node, known: set[str] | None) -> list[str]:
    problems: list[str] = []
    flows: list[Any] = []
    if node.alternatives:
        if node.flow is not None:
            problems.append(f"node {node.id!r}: give a flow or alternatives, not both")
        if isinstance(node.alternatives, (str, Mapping)) or not isinstance(
            node.alternatives, Sequence
        ):
            return [*problems, f"node {node.id!r}: alternatives must be a list"]
        for i, alt in enumerate(node.alternatives):
            if isinstance(alt, tuple):
                if len(alt) != 2:
                    problems.append(
                        f"node {node.id!r}: alternative {i} is {alt!r}, not a flow or a "
                        "(flow, input) pair"
                    )
                    continue
                alt = alt[0]
            if _flow_id(alt) is None:
                problems.append(
                    f"node {node.id!r}: alternative {i} is {alt!r}, not a flow, an agent or "
                    "a registered flow id"
                )
            else:
                flows.append(alt)
        if node.choose is not None and not callable(node.choose):
            problems.append(f"node {node.id!r}: choose must be a function of the outputs")
    elif node.flow is None:
        problems.append(f"node {node.id!r}: give it a flow (or alternatives)")
    else:
        if node.choose is not None:
            problems.append(f"node {node.id!r}: choose joins alternatives; it has none")
        flows.append(node.flow)
    if known is not None:
        for flow in flows:
            fid = _flow_id(flow)
            if fid is not None and fid not in known:
                problems.append(f"node {node.id!r}: no flow or agent {fid!r} is registered")
    return problems


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
        problems.extend(_node_shape_problems(node, known))
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
    # Checked with a cycle too (ancestors are a reachability set, safe on a cycle), so one
    # refusal lists every problem.
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
    upstream = by_id[head]
    if upstream.alternatives:
        return None  # a list of outputs, or what its chooser returns: not known here
    if upstream.flow is None:
        return None  # refused as a node without a flow already
    fields = _output_fields(upstream.flow, path)
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
    """The deterministic execution id of ``node_id`` in the graph run ``run_id`` (for a node
    with alternatives, the prefix of its alternatives' ids)."""
    return f"{run_id}.{node_id}"


def alternative_execution_id(run_id: str, node_id: str, index: int) -> str:
    """The deterministic execution id of alternative ``index`` of ``node_id`` in the run."""
    return f"{run_id}.{node_id}.{index}"


def _execution_ids(run_id: str, node: Node) -> list[str]:
    return [node_execution_id(run_id, key) for key, _, _ in node.branches(None)]


@dataclass(frozen=True, slots=True)
class NodeRun:
    """One node's execution as the run last saw it. A node with alternatives reports each in
    ``alternatives`` (keys ``"node.i"``); its own ``execution_id`` is their ids' prefix."""

    node: str
    execution_id: str
    state: TaskState
    output: Any = None
    error: dict[str, Any] | None = None
    gate: Gate | None = None
    dispatched: bool = False
    alternatives: tuple[NodeRun, ...] = ()


def combine(node: Node, execution_id: str, runs: Sequence[NodeRun]) -> NodeRun:
    """One node's run from its alternatives' runs (in declared order)."""
    dispatched = any(r.dispatched for r in runs)
    for state in (TaskState.FAILED, TaskState.REJECTED, TaskState.CANCELED):
        for r in runs:
            if r.state is state:
                error = dict(r.error or {})
                error.setdefault("type", state.value)
                error["alternative"] = r.node
                error["execution_id"] = r.execution_id
                return NodeRun(
                    node.id, execution_id, state, None, error, None, dispatched, tuple(runs)
                )
    for r in runs:
        if r.state is not TaskState.COMPLETED:
            return NodeRun(
                node.id, execution_id, r.state, None, None, None, dispatched, tuple(runs)
            )
    try:
        output = node.join([r.output for r in runs])
    except Exception as exc:
        error = {
            "type": "GraphChooseError",
            "message": f"node {node.id!r}: choose raised {type(exc).__name__}: {exc}",
        }
        return NodeRun(
            node.id, execution_id, TaskState.FAILED, None, error, None, dispatched, tuple(runs)
        )
    return NodeRun(
        node.id, execution_id, TaskState.COMPLETED, output, None, None, dispatched, tuple(runs)
    )


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
        """Node (or alternative, ``"node.i"``) -> the gate it waits at."""
        out: dict[str, Gate] = {}
        for n, r in self.nodes.items():
            if r.gate is not None:
                out[n] = r.gate
            for alt in r.alternatives:
                if alt.gate is not None:
                    out[alt.node] = alt.gate
        return out

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
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]  # an alternatives node's outputs
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
    longest = max(len(n.alternatives) for n in graph.nodes)
    problem = execution_id_problem(
        alternative_execution_id(run_id, "x" * 64, longest)
        if longest
        else node_execution_id(run_id, "x" * 64)
    )
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
        keys = {key for x in self.graph.nodes for key, _, _ in x.branches(None)}
        unknown = [n for n in decisions if n not in keys]
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
                        task = asyncio.ensure_future(self._node(node, value, decisions))
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
                for eid in _execution_ids(self.run_id, self.graph.node(nid)):
                    await self.dispatcher.cancel(eid)
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

    async def _node(self, node: Node, value: Any, decisions: Mapping[str, ResumeEvent]) -> NodeRun:
        branches = node.branches(value)
        if not node.alternatives:
            return await self._branch(node, node.id, node.flow_id, value, decisions.get(node.id))
        runs = await asyncio.gather(
            *(
                self._branch(node, key, _flow_id(flow) or "", inp, decisions.get(key))
                for key, flow, inp in branches
            )
        )
        return combine(node, node_execution_id(self.run_id, node.id), runs)

    async def _branch(
        self, node: Node, key: str, flow_id: str, value: Any, decision: ResumeEvent | None
    ) -> NodeRun:
        eid = node_execution_id(self.run_id, key)
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
                execution_id=eid, flow_id=flow_id, workflow_id=self.run_id, input=value
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
            key,
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
        except FlowNotFoundError as exc:
            raise FlowNotFoundError(
                f"graph run {self.run_id!r}, node {node.id!r} (execution {eid!r}): {exc.message}",
                execution_id=eid,
                hint=f"Register flow {package.flow_id!r} with the dispatcher's workers, or "
                "build the Graph with known_flows= to refuse it before anything is dispatched",
                node=node.id,
                flow_id=package.flow_id,
            ) from exc
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
    ``cancelled`` and starts nothing more. Returns each started node's state (an
    alternative's as ``"node.i"``)."""
    states: dict[str, TaskState] = {}
    for node in graph.nodes:
        for key, _, _ in node.branches(None):
            eid = node_execution_id(run_id, key)
            state = await runtime.load_state(eid)
            if state is None:
                continue
            if not state.is_terminal:
                state = await runtime.cancel(eid, reason)
            states[key] = task_state(state)
    return states
