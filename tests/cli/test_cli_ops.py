"""Operating executions with the real ``loom`` command: listing, gates, cancel, recover after
a divergence, start --attach, the small things (dates, --at, --data, --version)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import as_json, json_error, ok, one_line_error, write_flows
from tests.support.cli import loom as loom_cli

APP = "flows:flows"


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    return write_flows(tmp_path)


def _start(cwd: Path, eid: str, flow: str = "guard", *extra: str, nap: float = 3600) -> None:
    args = ["start", flow, "--app", APP, "--id", eid, *extra]
    if flow == "guard":
        args += ["--input", json.dumps({"table": "orders", "nap": nap})]
    ok(loom_cli(*args, cwd=cwd))


def test_executions_full_ids_filters_and_limit(cwd: Path) -> None:
    long_id = "order-" + "x" * 110
    _start(cwd, long_id)
    _start(cwd, "n1", "note")
    _start(cwd, "n2", "note")
    ok(loom_cli("resume", "n2", "Noted", "--app", APP, cwd=cwd))
    listed = ok(loom_cli("executions", cwd=cwd)).stdout  # piped: never truncated
    assert long_id in listed
    ids = [e["execution_id"] for e in as_json(ok(loom_cli("executions", "--json", cwd=cwd)))]
    assert ids == ["n2", "n1", long_id]  # newest first, from the index

    def listing(*args: str) -> list[str]:
        out = ok(loom_cli("executions", "--json", *args, cwd=cwd))
        return [e["execution_id"] for e in as_json(out)]

    assert listing("--status", "completed") == ["n2"]
    assert listing("--status", "suspended", "--flow", "note") == ["n1"]
    assert listing("-s", "suspended", "-s", "completed", "--flow", "note") == ["n2", "n1"]
    assert listing("--limit", "1") == [ids[0]]
    line = one_line_error(loom_cli("executions", "--status", "sleeping", cwd=cwd))
    assert "--status takes" in line


def test_a_resume_whose_replay_diverges_says_the_decision_was_recorded(cwd: Path) -> None:
    _start(cwd, "m1", nap=0)
    ok(loom_cli("recover", "m1", "--app", APP, cwd=cwd))  # the sleep is over: now the gate
    changed = {"FLOWS_INSPECT_ID": "inspect-v2"}  # the code changed under the execution
    out = loom_cli(
        "resume", "m1", "ApprovalGranted", "-d", '{"approved": true}', "--app", APP,
        cwd=cwd, env=changed,
    )  # fmt: skip
    line = one_line_error(out)
    assert "diverged" in line and "The decision was recorded" in line
    assert f"loom recover m1 --app {APP}" in line
    state = as_json(ok(loom_cli("show", "m1", "--json", cwd=cwd)))["state"]
    assert state["status"] == "running"  # recorded, nothing driving it
    done = as_json(ok(loom_cli("recover", "m1", "--app", APP, "--json", cwd=cwd)))
    assert done["status"] == "completed" and done["output"].startswith("applied")


def test_start_attach_and_the_existing_id_error(cwd: Path) -> None:
    _start(cwd, "n1", "note")
    line = one_line_error(loom_cli("start", "note", "--app", APP, "--id", "n1", cwd=cwd))
    assert "already exists" in line and "--attach" in line and "load_state" not in line
    attached = as_json(
        ok(loom_cli("start", "note", "--app", APP, "--id", "n1", "--attach", "--json", cwd=cwd))
    )
    assert attached["status"] == "suspended" and attached["last_sequence"] == 1
    line = one_line_error(
        loom_cli(
            "start",
            "guard",
            "--app",
            APP,
            "--id",
            "n1",
            "--attach",
            "-i",
            '{"table": "t"}',
            cwd=cwd,
        )
    )
    assert "runs flow 'note'" in line


def test_bad_flow_input_is_one_line_and_starts_nothing(cwd: Path) -> None:
    line = one_line_error(
        loom_cli("start", "guard", "--app", APP, "--id", "b1", "-i", '{"nap": "x"}', cwd=cwd)
    )
    assert "table: Field required" in line and "nap: Input should be a valid number" in line
    assert "'b1'" not in line and "Nothing was started" in line
    line = one_line_error(loom_cli("start", "nope", "--app", APP, cwd=cwd))
    assert "no flow 'nope'" in line


def test_dates_wakes_at_and_times_out_at(cwd: Path) -> None:
    _start(cwd, "m1", nap=0)
    text = ok(loom_cli("show", "m1", cwd=cwd)).stdout
    assert "sleep wakes at 20" in text and "sleeping; wakes at 20" in text
    assert "waiting for loom.timer" not in text
    ok(loom_cli("recover", "m1", "--app", APP, cwd=cwd))
    text = ok(loom_cli("show", "m1", cwd=cwd)).stdout
    assert "waiting for ApprovalGranted, times out at 20" in text  # a date, not 21:40:00
    rows = as_json(ok(loom_cli("show", "m1", "--json", cwd=cwd)))["timeline"]
    assert rows[0]["recorded_at_iso"].startswith("20") and rows[0]["recorded_at_iso"][-1] == "Z"


def test_at_is_validated(cwd: Path) -> None:
    _start(cwd, "n1", "note")
    out = loom_cli("show", "n1", "--at", "-1", cwd=cwd)
    assert out.returncode == 2 and "greater than or equal to 0" in out.stderr
    line = one_line_error(loom_cli("show", "n1", "--at", "999999", cwd=cwd))
    assert "past the end" in line and "0 to 1" in line
    assert (
        as_json(ok(loom_cli("show", "n1", "--at", "0", "--json", cwd=cwd)))["state"][
            "last_sequence"
        ]
        == 0
    )


def test_data_from_a_file_stdin_or_defaults(cwd: Path) -> None:
    for eid in ("n1", "n2", "n3"):
        _start(cwd, eid, "note")
    (cwd / "decision.json").write_text('{"text": "from a file"}')
    got = as_json(ok(loom_cli("resume", "n1", "Noted", "-d", "@decision.json", "--app", APP,
                              "--json", cwd=cwd)))  # fmt: skip
    assert got["output"] == "from a file"
    got = as_json(ok(loom_cli("resume", "n2", "Noted", "-d", "-", "--app", APP, "--json",
                              cwd=cwd, stdin='{"text": "from stdin"}')))  # fmt: skip
    assert got["output"] == "from stdin"
    got = as_json(ok(loom_cli("resume", "n3", "Noted", "--app", APP, "--json", cwd=cwd)))
    assert got["output"] == "noted"  # no --data: every field takes its default
    line = one_line_error(loom_cli("resume", "n3", "Noted", "-d", "@nope.json", cwd=cwd))
    assert "cannot read --data @nope.json" in line


def test_cancel_shows_the_reason_and_refuses_finished_executions(cwd: Path) -> None:
    _start(cwd, "n1", "note")
    _start(cwd, "n2", "note")
    out = ok(loom_cli("cancel", "n1", "--reason", "duplicate order", cwd=cwd)).stdout
    assert "cancel reason: duplicate order" in out
    assert "cancel reason: duplicate order" in ok(loom_cli("show", "n1", cwd=cwd)).stdout
    again = ok(loom_cli("cancel", "n1", cwd=cwd))
    assert "already cancelled (reason: duplicate order); nothing changed" in again.stdout
    ok(loom_cli("resume", "n2", "Noted", "--app", APP, cwd=cwd))
    line = one_line_error(loom_cli("cancel", "n2", cwd=cwd))
    assert "is completed; there is nothing to cancel" in line


def test_a_tampered_log_gets_one_verdict(cwd: Path) -> None:
    _start(cwd, "n1", "note")
    _start(cwd, "n2", "note")
    with sqlite3.connect(cwd / "loom.db") as conn:
        conn.execute(
            "UPDATE loom_events SET payload = replace(payload, '\"note\"', '\"NOTE\"') "
            "WHERE execution_id = 'n1' AND sequence = 0"
        )
    conn.close()
    verdicts = set()
    for args in (["show", "n1"], ["cancel", "n1"], ["resume", "n1", "Noted", "--app", APP]):
        verdicts.add(one_line_error(loom_cli(*args, cwd=cwd)))
    listing = loom_cli("executions", cwd=cwd)
    assert listing.returncode == 1 and "n2" in listing.stdout and "corrupt" in listing.stdout
    verdicts.add(listing.stderr.strip())
    assert len(verdicts) == 1 and "failed its checksum" in verdicts.pop()
    err = json_error(loom_cli("show", "n1", "--json", cwd=cwd))
    assert err["code"] == "corrupt_event"


def test_version_help_and_python_m_loom(cwd: Path) -> None:
    version = ok(loom_cli("--version", cwd=cwd)).stdout
    assert version.startswith("loom 0.")
    helped = ok(loom_cli("resume", "-h", cwd=cwd)).stdout
    assert "--data JSON|@FILE|-" in helped and "<bool>" not in helped
    assert "--db PATH" in helped and "--db <str>" not in helped
    listed = ok(loom_cli("-h", cwd=cwd)).stdout
    for command in ("start", "executions", "show", "resume", "cancel", "recover", "serve"):
        assert f"  {command} " in listed
    out = subprocess.run(
        [sys.executable, "-m", "loom", "--version"], capture_output=True, text=True, cwd=cwd
    )
    assert out.returncode == 0 and out.stdout == version
