"""Long-running commands for real: ``loom serve`` recovers a SIGKILLed start and wakes its
sleep; ``loom worker serve`` logs its URL, its flows and each request."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import LOOM, as_json, ok, write_flows
from tests.support.cli import loom as loom_cli
from tests.support.poll import until_sync
from tests.support.proc import Child


def _wait_file(path: Path, proc: Child, timeout: float = 60) -> str:
    def written() -> bool:
        assert proc.alive(), proc.finish()
        return path.exists()

    until_sync(written, f"{path} to appear", timeout=timeout)
    return path.read_text()


def test_serve_recovers_a_killed_start_and_wakes_its_sleep(tmp_path: Path) -> None:
    cwd = write_flows(tmp_path)
    job = json.dumps({"table": "orders", "nap": 0})
    killed = loom_cli(
        "start", "guard", "--app", "flows:guard", "--id", "k1", "-i", job,
        cwd=cwd, env={"FLOWS_KILL_IN_STEP": "1"},
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    state = as_json(ok(loom_cli("show", "k1", "--json", cwd=cwd)))["state"]
    assert state["status"] == "running"  # nothing drives it now
    node = Child([LOOM, "serve", "--app", "flows:flows", "--ready-file", "ready.json"], cwd=cwd)
    try:
        summary = json.loads(_wait_file(cwd / "ready.json", node))
        assert summary["recovered"] == ["k1"] and summary["flows"] == ["guard", "note"]

        def at_the_gate() -> dict[str, Any] | None:
            state = as_json(ok(loom_cli("show", "k1", "--json", cwd=cwd)))["state"]
            waiting = (state.get("waiting") or {}).get("event_type")
            return state if waiting == "ApprovalGranted" else None

        # Recovered, slept, woken by the node's timers: now at the gate.
        state = until_sync(at_the_gate, "k1 at its gate", timeout=60, every=0.2)
    finally:
        node.signal(signal.SIGINT)
        code, _, log = node.finish(timeout=30)
    assert code == 0, log
    assert "recovered execution k1 (flow guard)" in log
    assert "execution k1: sleep woke" in log and "stopping" in log
    assert state["recoveries"] == 1


def test_worker_serve_logs_its_url_flows_and_requests(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    cwd = write_flows(tmp_path)
    worker = Child(
        [LOOM, "worker", "serve", "--app", "flows:make_runtime", "--port", "0",
         "--port-file", "port", "--token-env", "TOK"],
        cwd=cwd, env={"TOK": "0123456789abcdef0123"},
    )  # fmt: skip
    try:
        port = int(_wait_file(cwd / "port", worker))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
            assert answer.status == 200
    finally:
        worker.signal(signal.SIGTERM)
        _, access, log = worker.finish(timeout=30)
    assert f"worker serving flows guard on http://127.0.0.1:{port}" in log
    assert "GET /healthz" in access + log  # uvicorn's access log: stdout
