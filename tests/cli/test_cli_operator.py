"""`loom logs`, `loom export`, `loom approve` and `loom reject`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

import loom
from loom.cli import app
from loom.testing import replay_flow
from tests.support import upgrade_flows as uf
from tests.support.proc import run_child

runner = CliRunner()
APP = "tests.support.upgrade_flows:FLOWS_V1"


def _suspended(db: Path, *ids: str) -> None:
    async def make() -> None:
        async with loom.WorkflowRuntime(loom.SQLiteStore(db)) as rt:
            rt.register(uf.orders_v1)
            for eid in ids:
                handle = await rt.start(uf.orders_v1, uf.Order(kind="b"), execution_id=eid)
                await handle.wait_for_suspend()

    asyncio.run(make())


def test_logs_and_export_replay(db_path: Path, tmp_path: Path) -> None:
    _suspended(db_path, "e1", "e2")
    text = runner.invoke(app, ["logs", "e1", "--db", str(db_path)])
    assert text.exit_code == 0 and "EXECUTION_SUSPENDED" in text.stdout
    rows = json.loads(runner.invoke(app, ["logs", "e1", "--db", str(db_path), "--json"]).stdout)
    assert rows[0]["type"] == "EXECUTION_STARTED"
    assert rows[-1]["type"] == "EXECUTION_SUSPENDED"
    after = json.loads(
        runner.invoke(app, ["logs", "e1", "--db", str(db_path), "--after", "1", "--json"]).stdout
    )
    assert [r["sequence"] for r in after] == [r["sequence"] for r in rows if r["sequence"] > 1]
    missing = runner.invoke(app, ["logs", "ghost", "--db", str(db_path)])
    assert missing.exit_code == 1 and "ghost" in missing.output

    out = tmp_path / "e1.json"
    res = runner.invoke(app, ["export", "e1", "--db", str(db_path), "--out", str(out)])
    assert res.exit_code == 0, res.stdout
    envelopes = [loom.Envelope.from_dict(d) for d in json.loads(out.read_text())]
    state = asyncio.run(replay_flow(uf.orders_v1, envelopes))  # the export replays
    assert state.status.value == "suspended" and state.execution_id == "e1"
    every = json.loads(runner.invoke(app, ["export", "--all", "--db", str(db_path)]).stdout)
    assert {d["execution_id"] for d in every} == {"e1", "e2"}
    nothing = runner.invoke(app, ["export", "--db", str(db_path)])
    assert nothing.exit_code == 1


def test_approve_and_reject_a_plain_gate_with_identity(db_path: Path) -> None:
    _suspended(db_path, "a1", "r1", "x1")
    db = str(db_path)
    ok = runner.invoke(app, ["approve", "a1", "--by", "dba", "--db", db, "--app", APP, "--json"])
    assert ok.exit_code == 0, ok.stdout
    summary = json.loads(ok.stdout)
    assert summary["gate"] == "Approval" and summary["status"] == "completed"
    assert summary["state"]["output"] == {"approved": True}
    rows = json.loads(runner.invoke(app, ["logs", "a1", "--db", db, "--json"]).stdout)
    resumed = next(r for r in rows if r["type"] == "EXECUTION_RESUMED")
    assert resumed["payload"]["payload"] == {"approved": True, "approved_by": "dba"}

    no = runner.invoke(app, ["reject", "r1", "--by", "sec", "--db", db, "--app", APP, "--json"])
    assert json.loads(no.stdout)["state"]["output"] == {"approved": False}

    # Refusals: one line, exit 1, nothing recorded.
    again = runner.invoke(app, ["approve", "a1", "--by", "dba", "--db", db, "--app", APP])
    assert again.exit_code == 1 and "waits on no approval" in again.output
    reason = runner.invoke(
        app, ["reject", "x1", "--by", "a", "--reason", "r", "--db", db, "--app", APP]
    )
    assert reason.exit_code == 1 and "records no reason" in reason.output
    bad = runner.invoke(
        app, ["approve", "x1", "--by", "a", "--data", "[1", "--db", db, "--app", APP]
    )
    assert bad.exit_code == 1 and "--data is not JSON" in bad.output
    not_object = runner.invoke(
        app, ["approve", "x1", "--by", "a", "--data", "[1]", "--db", db, "--app", APP, "--json"]
    )
    assert json.loads(not_object.stdout)["error"]["code"] == "configuration"
    shown = json.loads(runner.invoke(app, ["show", "x1", "--db", db, "--json"]).stdout)
    assert shown["state"]["status"] == "suspended"


def test_console_refuses_a_public_address_without_a_token(db_path: Path) -> None:
    out = run_child(
        "loom.cli", "console", "--db", db_path, "--host", "0.0.0.0",
        drop=("LOOM_CONSOLE_TOKEN",), timeout=60,
    )  # fmt: skip
    assert out.returncode == 1
    assert "LOOM_CONSOLE_TOKEN" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
