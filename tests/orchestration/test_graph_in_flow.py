"""ctx.execute_graph: a graph run durably inside a flow, each node a child execution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import loom
from loom.model import ExecutionStatus
from loom.orchestration import Graph, Node
from loom.storage import ExecutionQuery, SQLiteStore

RUNS: dict[str, int] = {}


@loom.step(id="g-effect")
async def g_effect(tag: str, value: Any) -> Any:
    RUNS[tag] = RUNS.get(tag, 0) + 1
    return value


@loom.flow(id="g-source", version="1")
async def g_source(ctx: loom.WorkflowContext, n: int) -> dict[str, int]:
    return await ctx.run(g_effect, ctx.execution_id, {"n": n})


@loom.flow(id="g-plus", version="1")
async def g_plus(ctx: loom.WorkflowContext, inp: dict[str, int]) -> int:
    return await ctx.run(g_effect, ctx.execution_id, inp["n"] + 1)


@loom.flow(id="g-approve", version="1")
async def g_approve(ctx: loom.WorkflowContext, inp: dict[str, int]) -> int:
    decision = await ctx.suspend("Approve")
    return inp["n"] * int(decision["factor"])


@loom.flow(id="g-join", version="1")
async def g_join(ctx: loom.WorkflowContext, inp: dict[str, int]) -> list[int]:
    return [inp["plus"], inp["approve"]]


GRAPH = Graph(
    [
        Node("source", g_source),
        Node("plus", g_plus, deps=("source",)),
        Node("approve", g_approve, deps=("source",)),
        Node("join", g_join, deps=("plus", "approve")),
    ],
    id="demo",
)


@loom.flow(id="graph-parent", version="1")
async def graph_parent(ctx: loom.WorkflowContext, n: int) -> dict[str, Any]:
    run = await ctx.execute_graph(GRAPH, n)
    return {"status": run.status, "output": run.output, "nodes": list(run.nodes)}


async def test_graph_in_flow_waits_at_a_node_gate_and_continues(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(graph_parent, g_source, g_plus, g_approve, g_join)
        await rt.start(graph_parent, 4, execution_id="gp")
        # The parent waits durably while the middle node waits at its gate.
        approve = await rt.wait("gp.0.approve", until="settled", timeout=30, missing_ok=True)
        assert approve.status is ExecutionStatus.SUSPENDED
        parent = await rt.wait("gp", until="settled", timeout=30)
        assert parent.status is ExecutionStatus.SUSPENDED
        assert await rt.load_state("gp.0.join") is None  # downstream of the gate: not started
        await rt.resume("gp.0.approve", "Approve", {"factor": 3})
        done = await rt.wait("gp", timeout=30)
        assert done.status is ExecutionStatus.COMPLETED, done.error
        assert done.output == {
            "status": "completed",
            "output": [5, 12],
            "nodes": ["source", "plus", "approve", "join"],
        }
        kids = [s.execution_id async for s in rt.executions(ExecutionQuery(parent_id="gp"))]
        assert sorted(kids) == ["gp.0.approve", "gp.0.join", "gp.0.plus", "gp.0.source"]
        assert RUNS["gp.0.source"] == 1 and RUNS["gp.0.plus"] == 1


@loom.flow(id="g-boom", version="1")
async def g_boom(ctx: loom.WorkflowContext, inp: Any) -> int:
    raise RuntimeError("boom")


FAILING = Graph(
    [
        Node("source", g_source),
        Node("boom", g_boom, deps=("source",)),
        Node("after", g_plus, deps=("boom",)),
    ],
    id="failing",
)


@loom.flow(id="graph-failing-parent", version="1")
async def graph_failing_parent(ctx: loom.WorkflowContext) -> dict[str, Any]:
    run = await ctx.execute_graph(FAILING, 1)
    return {
        "status": run.status,
        "not_started": list(run.not_started),
        "error": run.nodes["boom"].error,
    }


async def test_graph_in_flow_stops_downstream_of_a_failure(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(g_source, g_boom, g_plus)
        await rt.start(graph_failing_parent, execution_id="gf")
        done = await rt.wait("gf", timeout=30)
        assert done.output["status"] == "failed"
        assert done.output["not_started"] == ["after"]
        assert done.output["error"]["type"] == "RuntimeError"
        assert await rt.load_state("gf.0.after") is None
