"""Graph validation (refused before anything is dispatched), parallel nodes and joins, and the
bus's lifecycle: several gates, idempotent decisions, cancel, the update stream, typed errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

import loom
from loom.errors import ResumeValidationError
from loom.orchestration import (
    Graph,
    GraphValidationError,
    InProcessA2ABus,
    Node,
    TaskNotFoundError,
    TaskState,
    TaskTerminalError,
    UnknownAgentError,
    cancel_graph,
    execute_graph,
)
from loom.placement import ExecutionPackage, ExecutionResult, LocalDispatcher, LocalWorkerRuntime
from loom.storage import SQLiteStore


class Out(pydantic.BaseModel):
    value: int
    note: str = ""


started: list[str] = []


@loom.flow(id="num", version="1")
async def num(ctx: loom.WorkflowContext, n: Any) -> Out:
    started.append(ctx.execution_id)
    if isinstance(n, dict):  # a join: {dep: its output}
        return Out(value=sum(v["value"] for v in n.values()), note=",".join(n))
    return Out(value=int(n))


@loom.flow(id="add", version="1")
async def add(ctx: loom.WorkflowContext, parts: dict[str, Any]) -> Out:
    return Out(value=sum(int(v) for v in parts.values()), note=",".join(parts))


class Vote(pydantic.BaseModel):
    ok: bool


@loom.flow(id="two-gates", version="1", resume_schemas={"Approve": Vote})
async def two_gates(ctx: loom.WorkflowContext, what: str) -> dict[str, Any]:
    first = await ctx.suspend("Approve")
    second = await ctx.suspend("Approve")
    return {"what": what, "votes": [first.ok, second.ok]}


class Recording(LocalDispatcher):
    def __init__(self, runtime: loom.WorkflowRuntime) -> None:
        super().__init__(LocalWorkerRuntime(runtime))
        self.packages: list[ExecutionPackage] = []

    async def dispatch(self, package: ExecutionPackage) -> ExecutionResult:
        self.packages.append(package)
        return await super().dispatch(package)


@pytest.fixture(params=["sqlite", "postgres"])
async def runtime(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[loom.WorkflowRuntime]:
    if request.param == "sqlite":
        rt = loom.WorkflowRuntime(SQLiteStore(tmp_path / "g.db"))
        rt.register(num, add, two_gates)
        yield rt
        await rt.close()
        return
    from loom.storage.postgres import PostgresStore
    from tests.support.pg import require_pg, temp_schema

    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        rt = loom.WorkflowRuntime(PostgresStore(dsn, schema=schema))
        rt.register(num, add, two_gates)
        yield rt
        await rt.close()


def test_cycle_missing_node_and_bad_mapping_are_refused_together() -> None:
    with pytest.raises(GraphValidationError) as caught:
        Graph(
            [
                Node("a", num, deps=("c",)),
                Node("b", num, deps=("a", "ghost")),
                Node("c", num, deps=("b",)),
                Node("d", num, deps=("a",), inputs={"x": "a.nope", "y": "b.value"}),
                Node("d", num),
            ]
        )
    problems = caught.value.problems
    assert any("cycle" in p and "a" in p for p in problems), problems
    assert any("missing node 'ghost'" in p for p in problems), problems
    assert any("two nodes are named 'd'" in p for p in problems), problems


def test_mapping_to_a_missing_output_or_a_non_dependency_is_refused() -> None:
    with pytest.raises(GraphValidationError) as caught:
        Graph(
            [
                Node("a", num),
                Node("b", num),
                Node("c", add, deps=("a",), inputs={"x": "a.nope", "y": "b.value", "z": "q"}),
            ]
        )
    problems = caught.value.problems
    assert any("missing output 'nope'" in p and "value" in p for p in problems), problems
    assert any("does not depend on" in p and "'b'" in p for p in problems), problems
    assert any("missing node 'q'" in p for p in problems), problems
    with pytest.raises(GraphValidationError, match="no flow or agent 'nada'"):
        Graph([Node("a", "nada")], known_flows=["num"])


async def test_parallel_nodes_join_in_declared_order(runtime: loom.WorkflowRuntime) -> None:
    dispatcher = Recording(runtime)
    graph = Graph(
        [
            Node("left", num, constant=2),
            Node("right", num, constant=40),
            Node(
                "sum", add, deps=("right", "left"), inputs={"l": "left.value", "r": "right.value"}
            ),
            Node("whole", num, deps=("right", "left")),
        ],
        id="join",
    )
    run = await execute_graph(dispatcher, graph, None, store=runtime.store, run_id="j1")
    assert run.status == "completed"
    assert run.outputs["sum"] == {"value": 42, "note": "l,r"}
    assert list(run.outputs) == ["left", "right", "sum", "whole"]
    # The default input of a join is {dep: output} in the declared order of deps.
    whole_input = next(p.input for p in dispatcher.packages if p.execution_id == "j1.whole")
    assert list(whole_input) == ["right", "left"]
    assert {p.execution_id for p in dispatcher.packages[:2]} == {"j1.left", "j1.right"}
    assert run.output == {"sum": run.outputs["sum"], "whole": run.outputs["whole"]}


async def test_bus_through_two_gates_idempotent_on_message_id(
    runtime: loom.WorkflowRuntime,
) -> None:
    bus = InProcessA2ABus(runtime)
    card = bus.register(two_gates)
    assert card.name == "two-gates" and card.skills[0].id == "two-gates"
    task = await bus.send("two-gates", "deploy", task_id="t2")
    assert task.state is TaskState.INPUT_REQUIRED and task.gate is not None
    first_gate = task.gate.position
    with pytest.raises(ResumeValidationError):  # a malformed decision is refused, not dropped
        await bus.send("two-gates", {"ok": "maybe"}, task_id="t2")
    assert (await bus.get("t2")).last_sequence == task.last_sequence
    task = await bus.send("two-gates", {"ok": True}, task_id="t2", message_id="m1")
    assert task.state is TaskState.INPUT_REQUIRED and task.gate is not None
    assert task.gate.position != first_gate
    # A retried message m1 must not answer the second gate.
    again = await bus.send("two-gates", {"ok": True}, task_id="t2", message_id="m1")
    assert again.state is TaskState.INPUT_REQUIRED and again.last_sequence == task.last_sequence
    done = await bus.send("two-gates", {"ok": False}, task_id="t2", message_id="m2")
    assert done.state is TaskState.COMPLETED
    assert done.output == {"what": "deploy", "votes": [True, False]}
    with pytest.raises(TaskTerminalError) as caught:
        await bus.send("two-gates", {"ok": True}, task_id="t2")
    assert caught.value.execution_id == "t2" and caught.value.state == "completed"


async def test_bus_start_is_idempotent_on_message_id(runtime: loom.WorkflowRuntime) -> None:
    bus = InProcessA2ABus(runtime)
    bus.register(two_gates)
    a = await bus.send("two-gates", "x", message_id="same")
    b = await bus.send("two-gates", "x", message_id="same")
    assert a.id == b.id and a.state is b.state is TaskState.INPUT_REQUIRED
    assert len(bus.dispatched) == 1


async def test_bus_cancel_stream_and_errors(runtime: loom.WorkflowRuntime) -> None:
    bus = InProcessA2ABus(runtime)
    bus.register(two_gates)
    with pytest.raises(UnknownAgentError):
        await bus.send("nobody", "x")
    with pytest.raises(TaskNotFoundError):
        await bus.get("missing")
    submitted = await bus.send("two-gates", "x", task_id="t3", wait=False)
    assert submitted.state is TaskState.SUBMITTED
    seen: list[TaskState] = []
    async for update in bus.updates("t3", until_settled=True):
        seen.append(update.state)
    assert seen[-1] is TaskState.INPUT_REQUIRED
    cancelled = await bus.cancel("t3", "no longer needed")
    assert cancelled.state is TaskState.CANCELED
    assert [u.state async for u in bus.updates("t3")] == [TaskState.CANCELED]
    with pytest.raises(TaskTerminalError):
        await bus.send("two-gates", {"ok": True}, task_id="t3")


@loom.flow(id="parent", version="1")
async def parent(ctx: loom.WorkflowContext, what: str) -> Any:
    return await ctx.call(two_gates, what, execution_id="child-of-t5")


async def test_a_parent_waiting_on_its_child_is_working_not_input_required(
    runtime: loom.WorkflowRuntime,
) -> None:
    runtime.register(parent)
    bus = InProcessA2ABus(runtime)
    bus.register(parent)
    bus.register(two_gates)
    await bus.send("parent", "x", task_id="t5", wait=False)
    child = await bus.wait("child-of-t5", timeout=30, missing_ok=True)
    assert child.state is TaskState.INPUT_REQUIRED  # the child asks for input...
    task = await bus.get("t5")
    assert task.state is TaskState.WORKING and task.gate is None  # ...its parent just waits
    await bus.send("two-gates", {"ok": True}, task_id="child-of-t5")
    await bus.send("two-gates", {"ok": True}, task_id="child-of-t5")
    done = await bus.wait("t5", timeout=30)
    assert done.state is TaskState.COMPLETED and done.output["votes"] == [True, True]


gates: dict[str, asyncio.Event] = {}  # made per test: an Event belongs to one loop


@loom.step(id="held")
async def held_step() -> str:
    gates["held"].set()
    await gates["go"].wait()
    return "never"


@loom.flow(id="holding", version="1")
async def holding(ctx: loom.WorkflowContext) -> str:
    return await ctx.run(held_step)


async def test_cancel_while_a_node_runs(runtime: loom.WorkflowRuntime) -> None:
    gates.update(held=asyncio.Event(), go=asyncio.Event())
    runtime.register(holding)
    graph = Graph(
        [Node("a", num, constant=1), Node("b", holding, deps=("a",)), Node("c", num, deps=("b",))]
    )
    run = asyncio.ensure_future(
        execute_graph(Recording(runtime), graph, None, store=runtime.store, run_id="cx")
    )
    await gates["held"].wait()  # node b is inside its step
    states = await cancel_graph(runtime, graph, "cx", "stop")
    assert states == {"a": TaskState.COMPLETED, "b": TaskState.CANCELED}
    result = await asyncio.wait_for(run, 30)
    assert result.status == "cancelled" and result.not_started == ("c",)
    assert await runtime.load_state("cx.c") is None
