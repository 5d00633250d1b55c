"""A graph node with alternatives: each alternative its own execution under the node's id
(never two writers on one log), joined in declared order or by a chooser; through a
dispatcher and inside a flow (ctx.execute_graph, on the fan-out machinery)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.model import EventType, ExecutionStatus
from loom.orchestration import (
    Graph,
    GraphValidationError,
    Node,
    TaskState,
    alternative_execution_id,
    execute_graph,
)
from loom.placement import ExecutionPackage, ExecutionResult, LocalDispatcher, LocalWorkerRuntime
from loom.storage import ExecutionQuery, SQLiteStore

EFFECTS: Counter[str] = Counter()


@loom.step(id="alt-effect")
async def alt_effect(tag: str) -> None:
    EFFECTS[tag] += 1


@loom.flow(id="alt-source", version="1")
async def alt_source(ctx: loom.WorkflowContext, n: int) -> dict[str, int]:
    return {"n": n}


@loom.flow(id="alt-double", version="1")
async def alt_double(ctx: loom.WorkflowContext, inp: dict[str, int]) -> dict[str, Any]:
    await ctx.run(alt_effect, ctx.execution_id)
    return {"by": "double", "score": inp["n"] * 2}


@loom.flow(id="alt-square", version="1")
async def alt_square(ctx: loom.WorkflowContext, inp: dict[str, int]) -> dict[str, Any]:
    await ctx.run(alt_effect, ctx.execution_id)
    return {"by": "square", "score": inp["n"] ** 2}


@loom.flow(id="alt-gated", version="1")
async def alt_gated(ctx: loom.WorkflowContext, inp: dict[str, int]) -> dict[str, Any]:
    decision = await ctx.suspend("Pick")
    return {"by": "gated", "score": int(decision)}


@loom.flow(id="alt-boom", version="1")
async def alt_boom(ctx: loom.WorkflowContext, inp: Any) -> dict[str, Any]:
    raise loom.TerminalError("no draft today")


@loom.flow(id="alt-report", version="1")
async def alt_report(ctx: loom.WorkflowContext, inp: dict[str, Any]) -> str:
    return f"{inp['best']['by']}={inp['best']['score']} first={inp['first']}"


def best(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    return max(outputs, key=lambda o: o["score"])


FLOWS = (alt_source, alt_double, alt_square, alt_gated, alt_boom, alt_report)


def graph(*alternatives: Any, choose: Any = best, id: str = "alts") -> Graph:
    return Graph(
        [
            Node("source", alt_source),
            Node("draft", alternatives=list(alternatives), deps=("source",), choose=choose),
            Node(
                "report",
                alt_report,
                deps=("draft",),
                inputs={"best": "draft", "first": "source.n"},
            ),
        ],
        id=id,
    )


class Recording(LocalDispatcher):
    def __init__(self, runtime: loom.WorkflowRuntime) -> None:
        super().__init__(LocalWorkerRuntime(runtime))
        self.ids: list[str] = []

    async def dispatch(self, package: ExecutionPackage) -> ExecutionResult:
        self.ids.append(package.execution_id)
        return await super().dispatch(package)


async def _starts(rt: loom.WorkflowRuntime, eid: str) -> int:
    return sum(1 for e in await rt.store.read(eid) if e.type == EventType.EXECUTION_STARTED)


async def test_alternatives_run_as_their_own_executions_and_join(db_path: Path) -> None:
    EFFECTS.clear()
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(*FLOWS)
        dispatcher = Recording(rt)
        g = graph(alt_double, alt_square, (alt_double, {"n": 10}))
        run = await execute_graph(dispatcher, g, 3, store=rt.store, run_id="r1")
        assert run.status == "completed", run.nodes
        alt_ids = [alternative_execution_id("r1", "draft", i) for i in range(3)]
        assert alt_ids == ["r1.draft.0", "r1.draft.1", "r1.draft.2"]
        assert sorted(dispatcher.ids) == sorted(["r1.source", *alt_ids, "r1.report"])
        draft = run.nodes["draft"]
        assert [a.node for a in draft.alternatives] == ["draft.0", "draft.1", "draft.2"]
        assert [a.output["score"] for a in draft.alternatives] == [6, 9, 20]
        assert run.outputs["draft"] == {"by": "double", "score": 20}  # the chooser's pick
        assert run.output == "double=20 first=3"
        for eid in alt_ids:  # each its own log, started once
            assert await _starts(rt, eid) == 1
            assert EFFECTS[eid] == 1
        assert await rt.load_state("r1.draft") is None  # the node itself is no execution
        # Run again: nothing is dispatched, nothing re-runs.
        again = await execute_graph(dispatcher, g, 3, store=rt.store, run_id="r1")
        assert again.status == "completed" and again.output == run.output
        assert len(dispatcher.ids) == 5 and all(EFFECTS[e] == 1 for e in alt_ids)


async def test_without_a_chooser_the_outputs_come_in_declared_order(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(*FLOWS)
        g = Graph(
            [
                Node("source", alt_source),
                Node("draft", alternatives=[alt_square, alt_double], deps=("source",)),
                Node("second", alt_source, deps=("draft",), inputs="draft.1.score"),
            ]
        )
        run = await execute_graph(Recording(rt), g, 5, store=rt.store, run_id="r2")
        assert run.status == "completed"
        assert run.outputs["draft"] == [
            {"by": "square", "score": 25},
            {"by": "double", "score": 10},
        ]
        assert run.outputs["second"] == {"n": 10}


async def test_an_alternative_at_a_gate_suspends_the_node_until_decided(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(*FLOWS)
        dispatcher = Recording(rt)
        g = graph(alt_double, alt_gated)
        run = await execute_graph(dispatcher, g, 4, store=rt.store, run_id="r3")
        assert run.status == "suspended"
        assert list(run.waiting) == ["draft.1"] and run.waiting["draft.1"].event_type == "Pick"
        assert run.nodes["draft"].state is TaskState.INPUT_REQUIRED
        assert run.not_started == ("report",)
        decision = run.decision("draft.1", 99)
        done = await execute_graph(
            dispatcher, g, 4, store=rt.store, run_id="r3", decisions={"draft.1": decision}
        )
        assert done.status == "completed", done.nodes
        assert done.output == "gated=99 first=4"
        assert dispatcher.ids.count("r3.draft.0") == 1  # the finished one was not re-run


async def test_a_failed_alternative_fails_the_node_and_names_it(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(*FLOWS)
        run = await execute_graph(
            Recording(rt), graph(alt_double, alt_boom), 1, store=rt.store, run_id="r4"
        )
        assert run.status == "failed"
        error = run.nodes["draft"].error or {}
        assert error["alternative"] == "draft.1" and error["execution_id"] == "r4.draft.1"
        assert "no draft today" in str(error.get("message"))
        assert run.not_started == ("report",)


def test_bad_alternatives_are_refused_before_anything_runs() -> None:
    with pytest.raises(GraphValidationError) as caught:
        Graph(
            [
                Node("a", alt_source, alternatives=[alt_double]),
                Node("b"),
                Node("c", alternatives=[alt_double, 42, (alt_square,)]),
                Node("d", alternatives=[alt_double], choose="max"),  # type: ignore[arg-type]
                Node("e", alt_source, choose=best),
                Node("f", alternatives=[alt_double, "nowhere"]),
            ],
            known_flows=[f.id for f in FLOWS],
        )
    problems = caught.value.problems
    expected = [
        "node 'a': give a flow or alternatives, not both",
        "node 'b': give it a flow (or alternatives)",
        "node 'c': alternative 1 is 42",
        "node 'c': alternative 2 is",
        "node 'd': choose must be a function",
        "node 'e': choose joins alternatives",
        "node 'f': no flow or agent 'nowhere' is registered",
    ]
    for want in expected:
        assert any(p.startswith(want) for p in problems), (want, problems)


@loom.flow(id="alt-parent", version="1")
async def alt_parent(ctx: loom.WorkflowContext, n: int) -> dict[str, Any]:
    run = await ctx.execute_graph(graph(alt_double, alt_square, alt_gated), n)
    draft = run.nodes["draft"]
    return {
        "status": run.status,
        "output": run.output,
        "alternatives": [(a.node, a.execution_id) for a in draft.alternatives],
    }


async def test_alternatives_inside_a_flow_are_children_under_the_node(db_path: Path) -> None:
    EFFECTS.clear()
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(alt_parent, *FLOWS)
        await rt.start(alt_parent, 6, execution_id="ap")
        gated = await rt.wait("ap.0.draft.2", until="settled", timeout=30, missing_ok=True)
        assert gated.status is ExecutionStatus.SUSPENDED
        parent = await rt.wait("ap", until="settled", timeout=30)
        assert parent.status is ExecutionStatus.SUSPENDED
        assert await rt.load_state("ap.0.report") is None
        await rt.resume("ap.0.draft.2", "Pick", 7)
        done = await rt.wait("ap", timeout=30)
        assert done.status is ExecutionStatus.COMPLETED, done.error
        assert done.output == {
            "status": "completed",
            "output": "square=36 first=6",
            "alternatives": [
                ["draft.0", "ap.0.draft.0"],
                ["draft.1", "ap.0.draft.1"],
                ["draft.2", "ap.0.draft.2"],
            ],
        }
        kids = sorted([s.execution_id async for s in rt.executions(ExecutionQuery(parent_id="ap"))])
        assert kids == [
            "ap.0.draft.0",
            "ap.0.draft.1",
            "ap.0.draft.2",
            "ap.0.report",
            "ap.0.source",
        ]
        for eid in ("ap.0.draft.0", "ap.0.draft.1"):
            assert EFFECTS[eid] == 1 and await _starts(rt, eid) == 1
