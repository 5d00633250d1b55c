"""Trajectories of forked executions: a decision belongs to the execution that first recorded
it, so the prefix a fork copies is never counted once per branch, while what a branch decides
after its fork point is the branch's. Simulation branches are left out by default."""

from __future__ import annotations

from pathlib import Path

import loom
from loom.cli._branches import coverage
from loom.learning import OUTCOME_EVENT, evaluate_policy, trajectories, trajectories_from_envelopes
from loom.storage import ExecutionQuery, SQLiteStore
from tests.learning.flows_forked import Fixed, decide_gate_decide
from tests.support.cli import as_json, ok
from tests.support.cli import loom as loom_cmd


async def _parent(rt: loom.WorkflowRuntime) -> int:
    handle = await rt.start(decide_gate_decide, 7, execution_id="p")
    state = await handle.wait_for_suspend(timeout=30)
    return state.last_sequence


async def test_a_prefix_decision_forked_three_times_is_one_trajectory(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "t.db")
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(decide_gate_decide)
    gate = await _parent(rt)
    for name in ("x", "y", "z"):
        await rt.fork("p", gate, execution_id=f"b-{name}")

    trajs = await trajectories(store)
    assert [(t.execution_id, t.decision_id, t.reward) for t in trajs] == [("p", "first", 1.0)]
    cov = coverage(trajs)
    assert (cov["executions"], cov["decisions"], cov["scored"]) == (1, 1, 1)
    report = evaluate_policy(trajs, Fixed("a", 1.0), n_bootstrap=0)
    assert report.evaluated == 1 and report.ess == 1.0

    # After the fork, each branch's own decision is its own; the prefix stays the parent's.
    for name, score in (("x", 0.0), ("y", 0.5)):
        handle = await rt.resume(f"b-{name}", "Choose", {"arm": "c", "score": score})
        assert await handle.result(timeout=30) == "c"
    got = {(t.execution_id, t.decision_id): t for t in await trajectories(store)}
    assert sorted(got) == [("b-x", "second"), ("b-y", "second"), ("p", "first")]
    assert got[("b-x", "second")].reward == 0.0 and got[("b-y", "second")].reward == 0.5
    assert got[("b-y", "second")].propensity == 0.25
    assert got[("p", "first")].reward == 1.0
    await rt.close()
    await store.close()


async def test_outcomes_after_the_fact_join_the_decision_that_owns_them(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "o.db")
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(decide_gate_decide)
    gate = await _parent(rt)
    await rt.fork("p", gate, execution_id="b1")
    handle = await rt.resume("b1", "Choose", {"arm": "b", "score": 0.0})
    await handle.result(timeout=30)
    grand_gate = await store.last_sequence("b1")
    # A branch of the branch, forked after its second decision (its end is refused: fork
    # just before): its copied prefix holds both earlier decisions.
    await rt.fork("b1", grand_gate - 1, execution_id="b1-g")

    # Scored from outside: the parent's decision through the branch that inherited it (the
    # parent's own score comes first), the branch's own decision through the grandchild.
    assert await rt.record_outcome("b1", "first", 0.25, key="revenue") is True
    assert await rt.record_outcome("p", "first", 9.0, key="revenue") is True
    assert await rt.record_outcome("b1-g", "second", 4.0, key="margin") is True

    got = {(t.execution_id, t.decision_id): t for t in await trajectories(store)}
    assert sorted(got) == [("b1", "second"), ("p", "first")]
    # "click" (the flow's own) sorts before the after-the-fact keys, so it is the reward.
    assert got[("p", "first")].reward == 1.0
    assert got[("b1", "second")].reward == 0.0
    # Without the flow's own scores, the after-the-fact ones show where they joined.
    logs = [e for eid in ("p", "b1", "b1-g") for e in await store.read(eid)]
    records = await store.list_executions(ExecutionQuery(flow_id="loom.outcome"))
    for s in records.items:
        logs.extend(await store.read(s.execution_id))
    after_the_fact = [e for e in logs if e.type != OUTCOME_EVENT]
    joined = trajectories_from_envelopes(after_the_fact)
    assert {(t.execution_id, t.decision_id): t.reward for t in joined} == {
        ("p", "first"): 9.0,  # the parent's own score beats the branch's 0.25
        ("b1", "second"): 4.0,  # scored through the grandchild that inherited it
    }
    await rt.close()
    await store.close()


async def test_simulation_branches_are_left_out_unless_asked(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(decide_gate_decide)
    gate = await _parent(rt)
    await rt.fork("p", gate, execution_id="sim-1", simulation=True)
    handle = await rt.resume("sim-1", "Choose", {"arm": "c", "score": 1.0})
    await handle.result(timeout=30)
    # A simulated score for the real decision must not score it either.
    assert await rt.record_outcome("sim-1", "first", 5.0, key="a-first") is True

    real = await trajectories(store)
    assert [(t.execution_id, t.decision_id, t.reward) for t in real] == [("p", "first", 1.0)]
    every = {
        (t.execution_id, t.decision_id): t
        for t in await trajectories(store, include_simulations=True)
    }
    assert sorted(every) == [("p", "first"), ("sim-1", "second")]
    assert every[("p", "first")].reward == 5.0  # key "a-first" sorts first
    await rt.close()
    await store.close()


async def test_learn_report_counts_a_forked_decision_once(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    store = SQLiteStore(db)
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(decide_gate_decide)
    gate = await _parent(rt)
    for name in ("x", "y", "z"):
        await rt.fork("p", gate, execution_id=f"b-{name}")
    await rt.close()
    await store.close()
    report = as_json(ok(loom_cmd("learn", "report", "--db", str(db), "--json", cwd=tmp_path)))
    cov = report["coverage"]
    assert (cov["executions"], cov["decisions"], cov["scored"]) == (1, 1, 1), cov
