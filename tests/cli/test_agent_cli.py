"""`loom approve` / `loom reject` against an agent waiting on an approval, as a user runs them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import loom
from loom.model import ExecutionStatus
from tests.support.agent_app import SUPPORT
from tests.support.proc import run_child


def loom_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_child("loom.cli", *args, drop=("LOOM_TEST_LEDGER",))


async def _start(db: Path, eid: str) -> None:
    async with loom.WorkflowRuntime(loom.SQLiteStore(db), timers=False) as rt:
        rt.register(SUPPORT)
        handle = await rt.start(SUPPORT, "Check A and B, refund o-7.", execution_id=eid)
        state = await handle.wait_for_suspend(timeout=60)
        assert state.waiting is not None and state.waiting.event_type == "agents.approval"


async def _state(db: Path, eid: str) -> loom.ExecutionState:
    async with loom.WorkflowRuntime(loom.SQLiteStore(db), timers=False) as rt:
        state = await rt.load_state(eid)
        assert state is not None
        return state


async def test_approve_from_the_cli_runs_the_tool_and_finishes(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    await _start(db, "cli-1")
    app = ["--db", str(db), "--app", "tests.support.agent_app:AGENTS"]
    refused = loom_cli("approve", "cli-1", "--by", "mallory", *app, "--json")
    assert refused.returncode == 1
    assert json.loads(refused.stdout)["error"]["details"]["reason"] == "not_allowed"
    done = loom_cli("approve", "cli-1", "--by", "alice", *app, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["tool"] == "refund" and summary["args"] == {"order": "o-7", "amount": 20}
    assert summary["status"] == "completed" and summary["waiting_for"] is None
    state = await _state(db, "cli-1")
    assert state.status is ExecutionStatus.COMPLETED
    assert state.output["output"] == "Both in stock; o-7 refunded."


async def test_reject_from_the_cli_with_a_reason(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    await _start(db, "cli-2")
    app = ["--db", str(db), "--app", "tests.support.agent_app:AGENTS"]
    done = loom_cli("reject", "cli-2", "--by", "bob", "--reason", "not eligible", *app)
    assert done.returncode == 0, done.stderr
    assert "rejected by bob" in done.stdout and "completed" in done.stdout
    again = loom_cli("approve", "cli-2", "--by", "alice", *app)
    assert again.returncode == 1 and "waits on no approval" in again.stdout
    state = await _state(db, "cli-2")
    resumed = [op.output for op in state.ops.values() if op.name == "agents.approval"]
    assert resumed[0]["payload"]["reason"] == "not eligible"


async def test_show_tells_an_agents_turns_votes_and_tools_in_words(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    await _start(db, "cli-3")
    app = ["--db", str(db), "--app", "tests.support.agent_app:AGENTS"]
    assert loom_cli("approve", "cli-3", "--by", "alice", *app).returncode == 0
    shown = run_child("loom.cli", "show", "cli-3", "--db", str(db), env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    for line in (
        'support turn 1: calls inventory(sku="A"), inventory(sku="B") [tool_use]',
        "tool inventory (attempt 1) -> result in message ",
        'approval asked for refund(order="o-7", amount=20) from any 1 of alice, bob',
        "approve by alice",
        'support turn 3: says "Both in stock; o-7 refunded." [end_turn]',
        "support completed after 3 turn(s)",
    ):
        assert line in out, (line, out)
    assert '"fp"' not in out  # no raw payload JSON left for the agents' own events
