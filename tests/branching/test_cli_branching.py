"""`loom fork`, `loom branches`, `loom promote`, `loom learn report`: the real command."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import GateSupersededError
from loom.storage import SQLiteStore
from tests.branching.flows import guarded
from tests.support.cli import as_json, json_error, ok, one_line_error
from tests.support.cli import loom as loom_cmd


async def _parent(db: Path) -> int:
    rt = loom.WorkflowRuntime(SQLiteStore(db), timers=False)
    rt.register(guarded)
    state = await (await rt.start(guarded, 1, execution_id="p1")).wait_for_suspend(timeout=30)
    await rt.store.put_ref("main", "p1", state.last_sequence)  # type: ignore[attr-defined]
    await rt.close()
    return state.last_sequence


async def test_fork_branches_promote_from_the_command_line(tmp_path: Path) -> None:
    db = tmp_path / "b.db"
    gate = await _parent(db)
    made = as_json(
        ok(
            loom_cmd(
                "fork",
                "p1",
                "--at",
                str(gate),
                "--branch",
                "sim/a",
                "--db",
                str(db),
                "--json",
                cwd=tmp_path,
            )
        )
    )
    assert made["parent_id"] == "p1" and made["at_sequence"] == gate
    assert made["status"] == "suspended" and made["waiting"]["event_type"] == "Approve"
    assert made["ref"]["name"] == "sim/a" and made["ref"]["forked_from"] == "p1"
    human = ok(
        loom_cmd("fork", "p1", "--branch", "sim/b", "--id", "bb", "--db", str(db), cwd=tmp_path)
    )
    assert "forked p1 at sequence" in human.stdout and "into bb as ref 'sim/b'" in human.stdout

    refs = as_json(
        ok(loom_cmd("branches", "--prefix", "sim/", "--db", str(db), "--json", cwd=tmp_path))
    )["refs"]
    assert [r["name"] for r in refs] == ["sim/a", "sim/b"]
    table = ok(loom_cmd("branches", "--db", str(db), cwd=tmp_path)).stdout
    assert "main" in table and "p1@" in table

    moved = as_json(
        ok(
            loom_cmd(
                "promote",
                "sim/b",
                "main",
                "--by",
                "ann",
                "--reason",
                "why not",
                "--db",
                str(db),
                "--json",
                cwd=tmp_path,
            )
        )
    )
    assert (moved["execution_id"], moved["updated_by"], moved["promoted_from"]) == (
        "bb",
        "ann",
        "sim/b",
    )
    err = json_error(
        loom_cmd("promote", "sim/a", "main", "--by", "bob", "--db", str(db), "--json", cwd=tmp_path)
    )
    assert err["type"] == "PromotionConflictError"
    rt = loom.WorkflowRuntime(SQLiteStore(db), timers=False)
    rt.register(guarded)
    with pytest.raises(GateSupersededError):
        await rt.resume("p1", "Approve", {"plan": "late"})
    await rt.close()


async def test_refusals_are_one_line_and_change_nothing(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    gate = await _parent(db)
    line = one_line_error(
        loom_cmd("fork", "p1", "--at", str(gate + 5), "--db", str(db), cwd=tmp_path)
    )
    assert "cannot fork execution 'p1' at sequence" in line
    assert "ghost" in one_line_error(loom_cmd("fork", "ghost", "--db", str(db), cwd=tmp_path))
    assert "--by" in one_line_error(
        loom_cmd("promote", "sim/x", "main", "--db", str(db), cwd=tmp_path)
    )
    assert "not a valid ref name" in one_line_error(
        loom_cmd("fork", "p1", "--branch", "../x", "--db", str(db), cwd=tmp_path)
    )
    store = SQLiteStore(db)
    assert [i async for i in store.iterate_execution_ids()] == ["p1"]
    assert [r.name for r in await store.list_refs()] == ["main"]
    await store.close()


class Fixed:
    id = "fixed"
    version = "1"

    def select(self, context: Any, actions: Sequence[Any]) -> tuple[Any, float]:
        return actions[context["n"] % 2], 0.5


@loom.flow(id="chooser", version="1")
async def chooser(ctx: loom.WorkflowContext, n: int) -> str:
    action = await ctx.decide_with_policy("pick", Fixed(), {"n": n}, ["x", "y"])
    if n < 3:
        await ctx.record_outcome("reward", 1.0 if action == "x" else 0.0)
    return str(action)


POLICY = """
class AlwaysX:
    id = "always-x"
    version = "1"

    def select(self, context, actions):
        return "x", 1.0
"""


async def test_learn_report_prints_coverage_and_gaps(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    rt = loom.WorkflowRuntime(SQLiteStore(db), timers=False)
    rt.register(chooser)
    for n in range(4):
        await (await rt.start(chooser, n, execution_id=f"c{n}")).result(timeout=30)
    await rt.close()
    report = as_json(ok(loom_cmd("learn", "report", "--db", str(db), "--json", cwd=tmp_path)))
    cov = report["coverage"]
    assert (cov["executions"], cov["decisions"], cov["with_propensity"], cov["scored"]) == (
        4,
        4,
        4,
        3,
    )
    assert cov["arms"] == [
        {"action": "'x'", "n": 2, "mean_reward": 1.0},
        {"action": "'y'", "n": 1, "mean_reward": 0.0},
    ]
    assert any("no outcome yet" in g for g in cov["gaps"])
    (tmp_path / "policies.py").write_text(POLICY)
    text = ok(
        loom_cmd("learn", "report", "--policy", "policies:AlwaysX", "--db", str(db), cwd=tmp_path)
    ).stdout
    assert "4 executions, 4 decisions" in text and "always-x" in text
    evaluated = as_json(
        ok(
            loom_cmd(
                "learn",
                "report",
                "--policy",
                "policies:AlwaysX",
                "--db",
                str(db),
                "--json",
                cwd=tmp_path,
            )
        )
    )
    assert evaluated["policy"]["policy_id"] == "always-x"
    assert evaluated["policy"]["value"] == pytest.approx(1.0)
