"""Decisions across a SIGKILL, and outcomes recorded after the fact (runtime.record_outcome)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.learning import OUTCOME_EVENT, DecisionError, trajectories
from loom.storage import SQLiteStore
from tests.support.proc import run_child


def _child(db: Path, work: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return run_child("decision", db, work, mode)


async def test_sigkill_after_a_decision_serves_the_same_action_and_scores_it_once(
    tmp_path: Path,
) -> None:
    db = tmp_path / "d.db"
    first = _child(db, tmp_path, "start")
    assert first.returncode == -signal.SIGKILL, first.stderr
    store = SQLiteStore(db)
    log = await store.read("d1")
    decisions = [e for e in log if e.type == "learning.decision_recorded"]
    assert len(decisions) == 1 and decisions[0].payload["action"] == "b"
    assert decisions[0].payload["propensity"] == 0.8
    assert (tmp_path / "select.log").read_text().count("select") == 1
    await store.close()

    second = _child(db, tmp_path, "recover")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout.splitlines()[-1]) == {"action": "b", "served": "served b"}
    # The policy was not consulted again: the recorded action was served.
    assert (tmp_path / "select.log").read_text().count("select") == 1

    rt = loom.WorkflowRuntime(SQLiteStore(db), timers=False)
    # The flow scored "click" itself: the same pair from outside records nothing.
    assert await rt.record_outcome("d1", "offer", 0.0, key="click") is False
    assert await rt.record_outcome("d1", "offer", 12.5, key="revenue") is True
    assert await rt.record_outcome("d1", "offer", 99.0, key="revenue") is False
    outcomes = [e for e in await rt.store.read("d1") if e.type == OUTCOME_EVENT]
    assert [(e.payload["key"], e.payload["score"]) for e in outcomes] == [("click", 1.0)]
    (t,) = await trajectories(rt.store)
    assert (t.execution_id, t.decision_id, t.action, t.reward) == ("d1", "offer", "b", 1.0)
    await rt.close()


class Fixed:
    id = "fixed"
    version = "1"

    def select(self, context: Any, actions: Sequence[Any]) -> tuple[Any, float]:
        return actions[0], 0.5


@loom.flow(id="unscored", version="1")
async def unscored(ctx: loom.WorkflowContext, n: int) -> str:
    return str(await ctx.decide_with_policy("pick", Fixed(), {"n": n}, ["x", "y"]))


async def test_an_ended_execution_is_scored_after_the_fact_once(tmp_path: Path) -> None:
    rt = loom.WorkflowRuntime(SQLiteStore(tmp_path / "o.db"), timers=False)
    rt.register(unscored)
    for i in range(3):
        await (await rt.start(unscored, i, execution_id=f"u{i}")).result(timeout=30)
    (t,) = [t for t in await trajectories(rt.store) if t.execution_id == "u0"]
    assert t.reward is None
    assert await rt.record_outcome("u0", "pick", 0.75, key="reward") is True
    assert await rt.record_outcome("u0", "pick", 0.1, key="reward") is False
    assert await rt.record_outcome("u1", "pick", 0.25) is True
    rewards = {t.execution_id: t.reward for t in await trajectories(rt.store)}
    assert rewards == {"u0": 0.75, "u1": 0.25, "u2": None}
    # A query that lists only the flow still finds the scores recorded after the fact.
    scoped = await trajectories(rt.store, loom.storage.ExecutionQuery(flow_id="unscored"))
    assert {t.execution_id: t.reward for t in scoped} == rewards
    state = await rt.load_state("u0")
    assert state is not None and state.status.value == "completed"  # the log is untouched
    with pytest.raises(DecisionError, match="no decision 'nope'"):
        await rt.record_outcome("u0", "nope", 1.0)
    with pytest.raises(DecisionError, match="finite"):
        await rt.record_outcome("u0", "pick", float("nan"))
    with pytest.raises(loom.ExecutionNotFoundError):
        await rt.record_outcome("ghost", "pick", 1.0)
    await rt.close()
