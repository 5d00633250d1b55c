"""The orchestration scenario, the same through LocalDispatcher(LocalWorkerRuntime) and
through the HTTP worker runtime (two worker processes over one SQLite store):

a 3-agent graph (research -> review -> writer) whose middle agent stops at an approval gate,
approved; the same rejected by the operator; cancelled mid-graph; a plan naming an unknown
agent refused with nothing dispatched; and the bus's task lifecycle through two gates.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.agents import APPROVAL_EVENT
from loom.orchestration import (
    Graph,
    InProcessA2ABus,
    Node,
    Plan,
    PlanValidationError,
    TaskState,
    TaskTerminalError,
    cancel_graph,
    dispatch_plan,
    execute_graph,
)
from loom.placement import ExecutionDispatcher, LocalDispatcher, LocalWorkerRuntime
from loom.storage import SQLiteStore
from tests.support import orchestration as scenario
from tests.support.orchestration import APPROVE, REJECT
from tests.support.orchestration_workers import Workers


@dataclass
class Placement:
    kind: str
    runtime: loom.WorkflowRuntime
    dispatcher: ExecutionDispatcher
    ledger: Path
    worker_pids: set[int]

    def effects(self, prefix: str = "") -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for eid, what, pid in scenario.effects(self.ledger):
            if eid.startswith(prefix):
                counts[(eid, what)] = counts.get((eid, what), 0) + 1
                if self.kind == "http":
                    assert pid in self.worker_pids, f"{what} of {eid} ran outside the workers"
                else:
                    assert pid == os.getpid()
        return counts

    def pids_used(self, prefix: str = "") -> set[int]:
        """The processes that ran the effects of executions under ``prefix``."""
        return {pid for eid, _, pid in scenario.effects(self.ledger) if eid.startswith(prefix)}

    def bus(self) -> InProcessA2ABus:
        bus = InProcessA2ABus(self.runtime, self.dispatcher)
        for agent in scenario.AGENTS:
            bus.register(agent)
        return bus


@pytest.fixture(params=["local", "http"])
async def placement(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Placement]:
    db, ledger = tmp_path / "loom.db", tmp_path / "effects.db"
    monkeypatch.setenv("LOOM_TEST_LEDGER", str(ledger))
    runtime = loom.WorkflowRuntime(SQLiteStore(db), timers=False)
    runtime.register(*scenario.AGENTS)
    workers = None
    try:
        if request.param == "local":
            dispatcher: ExecutionDispatcher = LocalDispatcher(LocalWorkerRuntime(runtime))
            pids: set[int] = set()
        else:
            workers = Workers(tmp_path, db, ledger)
            await workers.start(2)
            dispatcher = workers.dispatcher()
            pids = workers.pids()
        yield Placement(request.param, runtime, dispatcher, ledger, pids)
    finally:
        if workers is not None:
            await workers.close()
        await runtime.close()


GRAPH = Graph(
    [
        Node("research", scenario.research),
        Node("review", scenario.review, deps=("research",), inputs="research.text"),
        Node("writer", scenario.writer, deps=("review",), inputs="review.text"),
    ],
    id="article",
)


async def _suspended_at_review(p: Placement, run_id: str) -> Any:
    run = await execute_graph(
        p.dispatcher, GRAPH, "durable agents", store=p.runtime.store, run_id=run_id
    )
    assert run.status == "suspended"
    assert list(run.waiting) == ["review"]
    assert run.waiting["review"].event_type == APPROVAL_EVENT
    assert run.not_started == ("writer",)
    assert run.outputs["research"]["text"] == "three facts"
    assert await p.runtime.load_state(f"{run_id}.writer") is None  # never dispatched
    return run


async def test_graph_gate_approved(placement: Placement) -> None:
    p = placement
    run = await _suspended_at_review(p, "g-ok")
    done = await execute_graph(
        p.dispatcher,
        GRAPH,
        "durable agents",
        store=p.runtime.store,
        run_id="g-ok",
        decisions={"review": run.decision("review", APPROVE)},
    )
    assert done.status == "completed", done
    assert list(done.outputs) == ["research", "review", "writer"]  # joined in declared order
    assert done.output["text"] == "the final article"
    assert done.outputs["review"]["text"] == "reviewed and published"
    # Re-running a finished run continues it: nothing runs again.
    again = await execute_graph(p.dispatcher, GRAPH, "x", store=p.runtime.store, run_id="g-ok")
    assert again.status == "completed" and not any(n.dispatched for n in again.nodes.values())
    assert p.effects("g-ok.") == {
        ("g-ok.research", "model:research"): 1,
        ("g-ok.review", "model:review"): 2,
        ("g-ok.review", "publish"): 1,
        ("g-ok.writer", "model:writer"): 1,
    }
    if p.kind == "http":
        # Round-robin placement: the run's dispatches were spread over both worker processes.
        assert len(p.worker_pids) == 2
        assert p.pids_used("g-ok.") == p.worker_pids


async def test_graph_gate_rejected_by_the_operator(placement: Placement) -> None:
    p = placement
    run = await _suspended_at_review(p, "g-no")
    done = await execute_graph(
        p.dispatcher,
        GRAPH,
        "durable agents",
        store=p.runtime.store,
        run_id="g-no",
        decisions={"review": run.decision("review", REJECT)},
    )
    assert done.status == "rejected", done
    assert done.nodes["review"].state is TaskState.REJECTED
    assert done.not_started == ("writer",)
    assert await p.runtime.load_state("g-no.writer") is None
    effects = p.effects("g-no.")
    assert ("g-no.review", "publish") not in effects
    assert effects[("g-no.review", "decline")] == 1


async def test_graph_cancelled_mid_graph(placement: Placement) -> None:
    p = placement
    await _suspended_at_review(p, "g-cx")
    states = await cancel_graph(p.runtime, GRAPH, "g-cx", "operator cancelled")
    assert states == {"research": TaskState.COMPLETED, "review": TaskState.CANCELED}
    after = await execute_graph(p.dispatcher, GRAPH, "x", store=p.runtime.store, run_id="g-cx")
    assert after.status == "cancelled"
    assert after.not_started == ("writer",)
    assert await p.runtime.load_state("g-cx.writer") is None
    assert ("g-cx.review", "publish") not in p.effects("g-cx.")


async def test_plan_with_an_unknown_agent_dispatches_nothing(placement: Placement) -> None:
    p = placement
    bus = p.bus()
    plan = Plan.model_validate(
        {
            "goal": "an article",
            "steps": [
                {"id": "a", "agent": "research", "input": "topic"},
                {"id": "b", "agent": "fact-checker", "depends_on": ["a"]},
                {"id": "c", "agent": "writer", "skill": "poetry", "depends_on": ["b", "zz"]},
            ],
        }
    )
    with pytest.raises(PlanValidationError) as caught:
        await dispatch_plan(plan, bus)
    problems = caught.value.problems
    assert any("unknown agent 'fact-checker'" in x for x in problems), problems
    assert any("no skill 'poetry'" in x for x in problems), problems
    assert any("missing node 'zz'" in x for x in problems), problems
    assert bus.dispatched == []
    assert [s async for s in p.runtime.executions()] == []
    assert p.effects() == {}


async def test_plan_runs_like_a_graph(placement: Placement) -> None:
    p = placement
    bus = p.bus()
    seen: list[tuple[str, str]] = []
    plan = Plan(
        goal="facts then an article",
        steps=[
            {"id": "facts", "agent": "research", "input": "topic"},  # type: ignore[list-item]
            {"id": "article", "agent": "writer", "inputs": "facts.text", "depends_on": ["facts"]},  # type: ignore[list-item]
        ],
    )
    run = await dispatch_plan(
        plan, bus, run_id="plan-1", on_step=lambda step, r: seen.append((step.id, r.state.value))
    )
    assert run.status == "completed"
    assert run.output["text"] == "the final article"
    assert seen == [("facts", "completed"), ("article", "completed")]
    record = await p.runtime.load_state("plan-1")  # the plan was recorded before it ran
    assert record is not None and record.input["steps"][0]["agent"] == "research"


async def test_bus_task_through_the_gate(placement: Placement) -> None:
    p = placement
    bus = p.bus()
    task = await bus.send("review", "a draft", task_id="t-1", context_id="ctx-9")
    assert task.state is TaskState.INPUT_REQUIRED
    assert task.gate is not None and task.gate.event_type == APPROVAL_EVENT
    assert task.context_id == "ctx-9"
    assert (await bus.get("t-1")).state is TaskState.INPUT_REQUIRED
    done = await bus.send("review", APPROVE, task_id="t-1", message_id="m-approve")
    assert done.state is TaskState.COMPLETED
    assert done.output["text"] == "reviewed and published"
    with pytest.raises(TaskTerminalError):
        await bus.send("review", APPROVE, task_id="t-1")
    assert p.effects("t-1") == {("t-1", "model:review"): 2, ("t-1", "publish"): 1}
