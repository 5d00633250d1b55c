"""Errors name the execution (and node) they concern and the next step; graph validation lists
every problem even when it found a cycle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

import loom
from loom.errors import FlowNotFoundError
from loom.model import ExecutionStatus
from loom.orchestration import (
    Graph,
    GraphValidationError,
    InProcessA2ABus,
    Node,
    TaskNotFoundError,
    execute_graph,
)
from loom.placement import LocalDispatcher, LocalWorkerRuntime
from loom.storage import SQLiteStore


class Out(pydantic.BaseModel):
    value: int


@loom.flow(id="err-num", version="1")
async def err_num(ctx: loom.WorkflowContext, n: Any) -> Out:
    return Out(value=1)


@loom.flow(id="err-caller", version="1")
async def err_caller(ctx: loom.WorkflowContext, n: int) -> Any:
    return await ctx.call("err-unregistered", n)


@loom.flow(id="err-grapher", version="1")
async def err_grapher(ctx: loom.WorkflowContext, n: int) -> Any:
    graph = Graph([Node("ok", err_num), Node("lost", "err-unregistered", deps=("ok",))])
    return (await ctx.execute_graph(graph, n)).status


async def test_ctx_call_of_an_unknown_flow_names_the_parent_and_the_next_step(
    db_path: Path,
) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(err_caller)
        await rt.start(err_caller, 1, execution_id="caller-1")
        state = await rt.wait("caller-1", timeout=30)
        assert state.status is ExecutionStatus.FAILED
        error = state.error or {}
        assert error["type"] == "FlowNotFoundError"
        assert error["execution_id"] == "caller-1"
        assert "'caller-1'" in error["message"] and "'err-unregistered'" in error["message"]
        assert "runtime.register" in error["hint"] and "ctx.call" in error["hint"]


async def test_graph_dispatch_of_an_unknown_flow_names_the_node_execution(
    db_path: Path,
) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(err_num)
        graph = Graph([Node("ok", err_num), Node("lost", "err-unregistered", deps=("ok",))])
        dispatcher = LocalDispatcher(LocalWorkerRuntime(rt))
        with pytest.raises(FlowNotFoundError) as caught:
            await execute_graph(dispatcher, graph, 1, store=rt.store, run_id="gr-1")
        exc = caught.value
        assert exc.execution_id == "gr-1.lost"
        assert exc.details["node"] == "lost"
        assert "graph run 'gr-1'" in exc.message and "node 'lost'" in exc.message
        assert exc.hint is not None and "known_flows=" in exc.hint
        assert await rt.load_state("gr-1.lost") is None  # nothing was created for it


async def test_in_flow_graph_of_an_unknown_flow_names_parent_node_and_its_id(
    db_path: Path,
) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(err_grapher, err_num)
        await rt.start(err_grapher, 1, execution_id="gp-1")
        state = await rt.wait("gp-1", timeout=30)
        assert state.status is ExecutionStatus.FAILED
        error = state.error or {}
        assert error["type"] == "FlowNotFoundError" and error["execution_id"] == "gp-1"
        assert "node 'lost'" in error["message"] and "'gp-1.0.lost'" in error["message"]
        assert error["details"]["node_execution_id"] == "gp-1.0.lost"
        assert "runtime.register" in error["hint"]


async def test_task_not_found_says_what_to_do(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        bus = InProcessA2ABus(rt)
        for call in (bus.get("t-x"), bus.wait("t-x"), bus.cancel("t-x")):
            with pytest.raises(TaskNotFoundError) as caught:
                await call
            assert caught.value.execution_id == "t-x"
            assert caught.value.hint is not None and "missing_ok=True" in caught.value.hint


def test_a_cycle_does_not_hide_the_reference_problems() -> None:
    with pytest.raises(GraphValidationError) as caught:
        Graph(
            [
                Node("a", err_num, deps=("c",)),
                Node("b", err_num, deps=("a",)),
                Node("c", err_num, deps=("b",)),
                Node("d", err_num, deps=("a",), inputs={"x": "a.nope", "y": "e.value"}),
                Node("e", err_num, inputs="ghost.value"),
            ]
        )
    problems = caught.value.problems
    assert any(p.startswith("a cycle:") for p in problems), problems
    assert any("missing output 'nope' of 'a'" in p for p in problems), problems
    assert any("reads node 'e', which it does not depend on" in p for p in problems), problems
    assert any("names a missing node 'ghost'" in p for p in problems), problems
