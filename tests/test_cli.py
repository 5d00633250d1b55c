from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from loom.cli import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def loom_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loom.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)},
    )


def test_demo_end_to_end(tmp_path: Path) -> None:
    out = loom_cli("demo", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "worker died (exit -9, SIGKILL)" in text
    assert "EXECUTION_RECOVERED" in text and "refused:" in text
    assert "effects: {'inspect': 1, 'assess-risk': 2, 'apply': 1}" in text
    db = tmp_path / ".loom-demo" / "loom.db"
    shown = loom_cli("show", "mig-orders", "--db", str(db), "--json", cwd=tmp_path)
    data = json.loads(shown.stdout)
    assert data["state"]["status"] == "completed"
    types = [row["type"] for row in data["timeline"]]
    assert types.count("EXECUTION_STARTED") == 1 and types[-1] == "EXECUTION_COMPLETED"
    at3 = json.loads(
        loom_cli("show", "mig-orders", "--db", str(db), "--at", "3", "--json", cwd=tmp_path).stdout
    )
    assert at3["state"]["last_sequence"] == 3 and at3["state"]["status"] == "running"
    listed = json.loads(loom_cli("executions", "--db", str(db), "--json", cwd=tmp_path).stdout)
    assert [(e["execution_id"], e["status"]) for e in listed] == [("mig-orders", "completed")]


def _suspended_demo_execution(tmp_path: Path) -> Path:
    """A demo execution waiting at its gate, made through the library (no crash)."""
    import asyncio

    import loom
    from loom.cli._demo import MigrationInput, migration_guard

    db = tmp_path / "cli.db"
    os.environ["LOOM_DEMO_LEDGER"] = str(tmp_path / "ledger.db")

    async def make() -> None:
        async with loom.WorkflowRuntime(loom.SQLiteStore(db)) as rt:
            rt.register(migration_guard)
            inp = MigrationInput(table="users", ddl="ALTER TABLE users ADD x int")
            await (await rt.start(migration_guard, inp, execution_id="m1")).wait_for_suspend()

    asyncio.run(make())
    return db


def test_resume_and_its_errors(tmp_path: Path) -> None:
    db = str(_suspended_demo_execution(tmp_path))
    bad_json = runner.invoke(
        app, ["resume", "m1", "ApprovalGranted", "--data", "{nope", "--db", db, "--json"]
    )
    assert bad_json.exit_code == 1
    assert json.loads(bad_json.stdout)["error"]["code"] == "payload"
    wrong = runner.invoke(
        app,
        [
            "resume",
            "m1",
            "ApprovalGranted",
            "--data",
            '{"approved": "maybe"}',
            "--db",
            db,
            "--json",
        ],
    )
    assert wrong.exit_code == 1
    err = json.loads(wrong.stdout)["error"]
    assert err["type"] == "ResumeValidationError" and err["execution_id"] == "m1"
    unknown = runner.invoke(app, ["resume", "ghost", "ApprovalGranted", "--db", db])
    assert unknown.exit_code == 1 and "ghost" in unknown.stdout
    ok = runner.invoke(
        app,
        [
            "resume",
            "m1",
            "ApprovalGranted",
            "--data",
            '{"approved": true, "approved_by": "cli"}',
            "--db",
            db,
            "--json",
        ],
    )
    assert ok.exit_code == 0, ok.stdout
    assert json.loads(ok.stdout)["status"] == "completed"


def test_cancel_and_show_unknown(tmp_path: Path) -> None:
    db = str(_suspended_demo_execution(tmp_path))
    res = runner.invoke(app, ["cancel", "m1", "--reason", "tested", "--db", db, "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["status"] == "cancelled"
    missing = runner.invoke(app, ["show", "nope", "--db", db, "--json"])
    assert missing.exit_code == 1
    assert json.loads(missing.stdout)["error"]["type"] == "ExecutionNotFoundError"
    bad_app = runner.invoke(app, ["recover", "m1", "--db", db, "--app", "no_such_module:x"])
    assert bad_app.exit_code == 1 and "cannot load --app" in bad_app.stdout
