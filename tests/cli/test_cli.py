"""The ``loom`` command, run for real in a subprocess from a folder holding ``flows.py``."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

import loom
from tests.support.cli import (
    as_json,
    json_error,
    ok,
    one_line_error,
    sha256,
    write_flows,
)
from tests.support.cli import (
    loom as loom_cli,
)
from tests.support.poll import until

APP = "flows:guard"


def _start(cwd: Path, eid: str, *extra: str, nap: float = 0.0) -> dict[str, object]:
    job = json.dumps({"table": "orders", "nap": nap})
    return as_json(  # type: ignore[no-any-return]
        ok(
            loom_cli(
                "start",
                "guard",
                "--input",
                job,
                "--app",
                APP,
                "--id",
                eid,
                "--json",
                *extra,
                cwd=cwd,
            )
        )
    )


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    return write_flows(tmp_path)


# ---------------------------------------------------------------- blocker 1: sleeps wake


def test_start_then_recover_wakes_an_overdue_sleep_then_the_gate_is_approved(cwd: Path) -> None:
    state = _start(cwd, "m1")
    assert state["status"] == "suspended"
    assert state["waiting"]["event_type"] == "loom.timer"  # type: ignore[index]
    shown = ok(loom_cli("show", "m1", cwd=cwd)).stdout
    assert "sleeping; wakes at 20" in shown and "TIMER_SCHEDULED" in shown
    woken = as_json(ok(loom_cli("recover", "m1", "--app", APP, "--json", cwd=cwd)))
    assert woken["status"] == "suspended"
    assert woken["waiting"]["event_type"] == "ApprovalGranted"
    done = as_json(
        ok(
            loom_cli(
                "resume",
                "m1",
                "ApprovalGranted",
                "--data",
                '{"approved": true}',
                "--app",
                APP,
                "--json",
                cwd=cwd,
            )
        )
    )
    assert done["status"] == "completed" and done["output"] == "applied ALTER TABLE orders ..."


def test_recover_of_a_sleep_not_yet_due_changes_nothing(cwd: Path) -> None:
    _start(cwd, "m1", nap=3600)
    db = cwd / "loom.db"
    before = sha256(db)
    out = ok(loom_cli("recover", "m1", "--app", APP, cwd=cwd))
    assert "nothing to recover: it sleeps until 20" in out.stdout
    assert sha256(db) == before


def test_an_open_runtime_fires_an_overdue_timer_without_being_used(tmp_path: Path) -> None:
    @loom.flow(id="napper")
    async def napper(ctx: loom.WorkflowContext) -> str:
        await ctx.sleep(0)
        return "woke"

    db = tmp_path / "loom.db"

    async def go() -> None:
        async with loom.WorkflowRuntime(loom.SQLiteStore(db), timers=False) as rt:
            await (await rt.start(napper, execution_id="n1")).wait_for_suspend(timeout=10)
        runtime = loom.WorkflowRuntime(loom.SQLiteStore(db))
        runtime.register(napper)
        async with runtime:  # opened; nothing started, resumed or awaited through it

            async def ended() -> loom.ExecutionState | None:
                state = await runtime.load_state("n1")
                return state if state is not None and state.is_terminal else None

            state = await until(ended, "n1 woken by the runtime's timers", timeout=20)
            assert state.output == "woke"

    asyncio.run(go())


# ---------------------------------------------------------------- blocker 2: stores


def test_a_server_url_given_to_db_is_refused_and_creates_nothing(cwd: Path) -> None:
    out = loom_cli("executions", "--db", "postgresql://u:secret@127.0.0.1/x", cwd=cwd)
    line = one_line_error(out)
    assert "--store" in line and "secret" not in line
    assert list(cwd.iterdir()) == [cwd / "flows.py"]


def test_store_url_operates_postgres(cwd: Path) -> None:
    from tests.support.pg import require_pg, temp_schema

    dsn = require_pg()

    async def with_schema() -> None:
        async with temp_schema(dsn) as schema:
            url = f"{dsn}?schema={schema}"
            job = json.dumps({"table": "pg"})
            ok(
                loom_cli(
                    "start", "guard", "-i", job, "--app", APP, "--id", "p1", "--store", url, cwd=cwd
                )
            )
            listed = as_json(ok(loom_cli("executions", "--store", url, "--json", cwd=cwd)))
            assert [(e["execution_id"], e["flow_id"]) for e in listed] == [("p1", "guard")]
            ok(loom_cli("recover", "p1", "--app", APP, "--store", url, cwd=cwd))
            done = as_json(
                ok(
                    loom_cli(
                        "resume",
                        "p1",
                        "ApprovalGranted",
                        "-d",
                        '{"approved": false}',
                        "--app",
                        APP,
                        "--store",
                        url,
                        "--json",
                        cwd=cwd,
                    )
                )
            )
            assert done["status"] == "completed" and done["output"] == "rejected"

    asyncio.run(with_schema())
    assert not (cwd / "loom.db").exists()


def test_app_runtime_brings_its_own_store(cwd: Path) -> None:
    job = json.dumps({"table": "t"})
    ok(loom_cli("start", "guard", "-i", job, "--app", "flows:make_runtime", "--id", "r1", cwd=cwd))
    assert (cwd / "app-store" / "app.db").exists() and not (cwd / "loom.db").exists()
    shown = as_json(ok(loom_cli("show", "r1", "--db", "app-store/app.db", "--json", cwd=cwd)))
    assert shown["state"]["flow_id"] == "guard"


# ---------------------------------------------------------------- 3: --app


def test_app_is_imported_from_the_current_directory_and_required(cwd: Path) -> None:
    _start(cwd, "m1")  # no PYTHONPATH: the console script imports flows.py from cwd
    line = one_line_error(loom_cli("recover", "m1", cwd=cwd))
    assert "--app" in line and "recover" in line
    line = one_line_error(loom_cli("resume", "m1", "loom.timer", cwd=cwd))
    assert "durable sleep" in line
    line = one_line_error(loom_cli("start", "guard", cwd=cwd))
    assert "needs --app" in line


# ---------------------------------------------------------------- 4: reads never write


def test_read_and_refused_commands_leave_the_database_byte_identical(cwd: Path) -> None:
    _start(cwd, "m1", nap=3600)
    _start(cwd, "m2")
    ok(loom_cli("cancel", "m2", "--reason", "not needed", cwd=cwd))
    db = cwd / "loom.db"
    files = sorted(p.name for p in cwd.iterdir())
    before = sha256(db)
    runs = [
        ok(loom_cli("executions", cwd=cwd)),
        ok(loom_cli("executions", "--json", "--status", "suspended", cwd=cwd)),
        ok(loom_cli("show", "m1", cwd=cwd)),
        ok(loom_cli("show", "m1", "--at", "1", "--json", cwd=cwd)),
        ok(loom_cli("recover", "m1", "--app", APP, cwd=cwd)),  # not due: nothing to do
        ok(loom_cli("cancel", "m2", cwd=cwd)),  # already cancelled: a notice
        loom_cli("show", "ghost", cwd=cwd),
        loom_cli("show", "m1", "--at", "999999", cwd=cwd),
        loom_cli("cancel", "ghost", cwd=cwd),
        loom_cli("resume", "m1", "ApprovalGranted", "--app", APP, cwd=cwd),  # sleeping
        loom_cli("resume", "m1", "Nope", "--data", "{bad", "--app", APP, cwd=cwd),
        loom_cli("recover", "ghost", "--app", APP, cwd=cwd),
        loom_cli("start", "guard", "--id", "m1", "-i", '{"table": "x"}', "--app", APP, cwd=cwd),
        loom_cli("start", "guard", "-i", '{"table": 5}', "--app", APP, cwd=cwd),
    ]
    assert [r.returncode for r in runs] == [0] * 6 + [1] * 8
    assert sha256(db) == before
    assert (
        sorted(p.name for p in cwd.iterdir() if not p.name.startswith("loom.db-"))
        == [f for f in files if not f.startswith("loom.db-")]
        or sorted(p.name for p in cwd.iterdir()) == files
    )


def test_missing_foreign_and_empty_files_are_refused_untouched(cwd: Path) -> None:
    line = one_line_error(loom_cli("executions", "--db", "missing/dir/x.db", cwd=cwd))
    assert "no Loom database at missing/dir/x.db" in line
    assert not (cwd / "missing").exists()
    foreign = cwd / "app.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers VALUES (1, 'ada')")
    conn.close()
    before = sha256(foreign)
    for cmd in (["executions"], ["show", "x"], ["cancel", "x"]):
        line = one_line_error(loom_cli(*cmd, "--db", "app.db", cwd=cwd))
        assert "not a Loom database" in line
    assert sha256(foreign) == before
    with sqlite3.connect(foreign) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert names == {"customers"}
    empty = cwd / "empty.db"
    empty.touch()
    one_line_error(loom_cli("executions", "--db", "empty.db", cwd=cwd))
    assert empty.stat().st_size == 0


# ---------------------------------------------------------------- 5: no tracebacks


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("def broken(:\n", "syntax error at"),
        ("raise RuntimeError('no config')\n", "raised RuntimeError: no config"),
        (
            "import asyncio\nasync def main():\n    pass\nasyncio.run(main())\n",
            "asyncio.run",
        ),
    ],
)
def test_a_broken_app_module_is_one_line(cwd: Path, module: str, expected: str) -> None:
    (cwd / "bad.py").write_text(module)
    line = one_line_error(loom_cli("start", "guard", "--app", "bad:guard", cwd=cwd))
    assert "--app 'bad:guard'" in line and expected in line
    err = json_error(loom_cli("start", "guard", "--app", "bad:guard", "--json", cwd=cwd))
    assert err["code"] == "configuration"


def test_not_sqlite_and_directory_are_one_line_even_with_json(cwd: Path) -> None:
    (cwd / "notes.txt").write_text("hello, not a database\n" * 10)
    line = one_line_error(loom_cli("executions", "--db", "notes.txt", cwd=cwd))
    assert "not a SQLite database" in line
    err = json_error(loom_cli("show", "x", "--db", "notes.txt", "--json", cwd=cwd))
    assert err["code"] == "storage" and "not a SQLite database" in err["message"]
    line = one_line_error(loom_cli("executions", "--db", ".", cwd=cwd))
    assert "is a directory" in line


def test_worker_serve_never_calls_a_builtin(cwd: Path) -> None:
    pytest.importorskip("uvicorn")
    args = ("worker", "serve", "--app", "os:system", "--token-env", "TOK", "--port", "0")
    out = loom_cli(*args, cwd=cwd, env={"TOK": "0123456789abcdef0123"})
    line = one_line_error(out)
    assert "not a WorkflowRuntime" in line
    err = json_error(loom_cli(*args, "--json", cwd=cwd, env={"TOK": "0123456789abcdef0123"}))
    assert err["code"] == "configuration"


# ---------------------------------------------------------------- the demo


def test_demo_leaves_the_current_directory_alone_and_pipes_unwrapped(tmp_path: Path) -> None:
    out = ok(loom_cli("demo", cwd=tmp_path))
    assert list(tmp_path.iterdir()) == []  # no .loom-demo/ here: a temporary directory
    text = out.stdout
    assert "worker died (exit -9, SIGKILL)" in text
    assert "EXECUTION_RECOVERED" in text and "refused:" in text
    assert "effects: {'inspect': 1, 'assess-risk': 2, 'apply': 1}" in text
    assert max(len(line) for line in text.splitlines()) > 100  # piped: not wrapped at 80
    db = text.split("loom show mig-orders --db ")[1].split()[0]
    data = as_json(ok(loom_cli("show", "mig-orders", "--db", db, "--json", cwd=tmp_path)))
    assert data["state"]["status"] == "completed"
    types = [row["type"] for row in data["timeline"]]
    assert types.count("EXECUTION_STARTED") == 1 and types[-1] == "EXECUTION_COMPLETED"
    at3 = as_json(loom_cli("show", "mig-orders", "--db", db, "--at", "3", "--json", cwd=tmp_path))
    assert at3["state"]["last_sequence"] == 3 and at3["state"]["status"] == "running"
    summary = as_json(
        ok(loom_cli("demo", "--json", "--db", str(tmp_path / "d" / "x.db"), cwd=tmp_path))
    )
    assert summary["effects"] == {"inspect": 1, "assess-risk": 2, "apply": 1}
    assert summary["refused"] and summary["result"]
