"""``ctx.execute_graph``: a graph run durably inside a flow, each node a child execution.

Deterministic under replay: nodes are started in declared order as soon as their dependencies
completed, and awaited in declared order (positions never depend on timing), so the parent's
log is the same on every replay and a recovered parent finds each node's child by id. Nodes
whose dependencies are met run at the same time; only the start of a downstream node waits
for the node it is awaited behind. A node with alternatives is a fan-out: each alternative is
its own child (id ``"<run>.<node>.<i>"``), all started at once and taken in declared order
the way ``ctx.fan_out`` takes its branches.
"""

from __future__ import annotations

from typing import Any

from loom.errors import ChildFailedError, FlowNotFoundError
from loom.orchestration._graph import Graph, GraphRun, Node, NodeRun, combine, node_input
from loom.orchestration._tasks import TaskState
from loom.runtime import WorkflowContext, _children
from loom.runtime._children import ChildHandle

__all__ = ["run_graph_in_flow"]

_REJECTED = "TaskRejectedError"


def _failed_state(exc: ChildFailedError) -> TaskState:
    if exc.status == "cancelled":
        return TaskState.CANCELED
    if (exc.error or {}).get("type") == _REJECTED:
        return TaskState.REJECTED
    return TaskState.FAILED


async def run_graph_in_flow(ctx: WorkflowContext, graph: Any, input: Any) -> GraphRun:
    """See :meth:`loom.WorkflowContext.execute_graph`."""
    if not isinstance(graph, Graph):
        raise TypeError(f"ctx.execute_graph() takes a loom.orchestration.Graph, not {graph!r}")
    run_id = f"{ctx.execution_id}.{ctx._position}"
    started: dict[str, list[ChildHandle]] = {}
    results: dict[str, NodeRun] = {}
    outputs: dict[str, Any] = {}
    stopped = False
    while True:
        if not stopped:
            for node in graph.nodes:
                if node.id in started or node.id in results:
                    continue
                if not all(
                    d in results and results[d].state is TaskState.COMPLETED for d in node.deps
                ):
                    continue
                try:
                    value = node_input(node, input, outputs)
                except Exception as exc:  # a reference the upstream output lacks
                    results[node.id] = NodeRun(
                        node.id,
                        f"{run_id}.{node.id}",
                        TaskState.FAILED,
                        error={"type": "GraphMappingError", "message": str(exc)},
                    )
                    stopped = True
                    break
                started[node.id] = [
                    _start(ctx, run_id, node.id, key, flow, inp)
                    for key, flow, inp in node.branches(value)
                ]
        waiting = [n.id for n in graph.nodes if n.id in started and n.id not in results]
        if not waiting:
            break
        nid = waiting[0]  # declared order: the same on every replay
        node = graph.node(nid)
        if node.alternatives:
            results[nid] = await _alternatives(ctx, node, f"{run_id}.{nid}", started[nid])
            if results[nid].state is TaskState.COMPLETED:
                outputs[nid] = results[nid].output
            else:
                stopped = True
            continue
        handle = started[nid][0]
        try:
            output = await handle
        except ChildFailedError as exc:
            results[nid] = NodeRun(
                nid, handle.execution_id, _failed_state(exc), error=exc.error, dispatched=True
            )
            stopped = True
            continue
        results[nid] = NodeRun(
            nid, handle.execution_id, TaskState.COMPLETED, output, dispatched=True
        )
        outputs[nid] = output
    states = {r.state for r in results.values()}
    status = "completed"
    for state, name in (
        (TaskState.FAILED, "failed"),
        (TaskState.REJECTED, "rejected"),
        (TaskState.CANCELED, "cancelled"),
    ):
        if state in states:
            status = name
            break
    ordered = {n.id: outputs[n.id] for n in graph.nodes if n.id in outputs}
    nodes = {n.id: results[n.id] for n in graph.nodes if n.id in results}
    not_started = tuple(n.id for n in graph.nodes if n.id not in results)
    return GraphRun(run_id, status, nodes, ordered, graph.sinks, not_started)


def _start(
    ctx: WorkflowContext, run_id: str, node: str, key: str, flow: Any, inp: Any
) -> ChildHandle:
    child_id = f"{run_id}.{key}"
    try:
        return _children.start_child(ctx, flow, inp, child_id, raw=True)
    except FlowNotFoundError as exc:
        raise FlowNotFoundError(
            f"execution {ctx.execution_id!r}, graph run {run_id!r}, node {node!r} (execution "
            f"{child_id!r}): no flow {flow!r} is registered",
            execution_id=ctx.execution_id,
            hint=f"Register flow {flow!r} on this runtime (runtime.register(flow)), or put the "
            "@loom.flow object itself in the Node",
            node=node,
            node_execution_id=child_id,
            flow_id=flow,
        ) from exc


async def _alternatives(
    ctx: WorkflowContext, node: Node, execution_id: str, handles: list[ChildHandle]
) -> NodeRun:
    got = await _children.await_all(ctx, handles, return_exceptions=True)
    runs: list[NodeRun] = []
    for (key, _, _), handle, value in zip(node.branches(None), handles, got, strict=True):
        if isinstance(value, ChildFailedError):
            state = _failed_state(value)
            runs.append(
                NodeRun(key, handle.execution_id, state, error=value.error, dispatched=True)
            )
        else:
            runs.append(
                NodeRun(key, handle.execution_id, TaskState.COMPLETED, value, dispatched=True)
            )
    return combine(node, execution_id, runs)


_children.register_graph_runner(run_graph_in_flow)
