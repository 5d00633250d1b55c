"""The README's walk-through, followed literally: its flows module, its commands, in order."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.cli import LOOM, as_json, ok
from tests.support.cli import loom as loom_cli
from tests.support.poll import until_sync
from tests.support.proc import Child

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def _walkthrough() -> tuple[str, str, list[list[str]]]:
    python = {b.splitlines()[0]: b for b in _blocks("python")}
    section = README.read_text().split("## Walk-through", 1)[1]
    commands_block = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0]
    commands = [shlex.split(line) for line in commands_block.splitlines() if line.strip()]
    return python["# flows.py"], python["# main.py"], commands


def _wait_for(cwd: Path, execution_id: str, event: str, timeout: float) -> dict[str, object]:
    def waiting() -> dict[str, object] | None:
        state = as_json(ok(loom_cli("show", execution_id, "--json", cwd=cwd)))["state"]
        at = (state.get("waiting") or {}).get("event_type")
        return state if at == event else None  # type: ignore[no-any-return]

    return until_sync(waiting, f"{execution_id} waiting for {event}", timeout=timeout, every=0.2)


def test_the_readme_walkthrough_from_start_to_a_woken_sleep_and_an_approved_gate(
    tmp_path: Path,
) -> None:
    flows, main, commands = _walkthrough()
    (tmp_path / "flows.py").write_text(flows)
    (tmp_path / "main.py").write_text(main)
    assert [c[:2] for c in commands] == [
        ["loom", "start"],
        ["loom", "serve"],
        ["loom", "show"],
        ["loom", "resume"],
        ["loom", "executions"],
    ]
    start, serve, show, resume, listing = commands

    started = ok(loom_cli(*start[1:], cwd=tmp_path)).stdout
    assert "sleeping; wakes at 20" in started
    node = Child([LOOM, *serve[1:]], cwd=tmp_path)
    try:
        state = _wait_for(tmp_path, "mig-42", "ApprovalGranted", 60)
        assert state["status"] == "suspended"
        shown = ok(loom_cli(*show[1:], cwd=tmp_path)).stdout
        assert "TIMER_FIRED" in shown and "waiting for ApprovalGranted, times out at 20" in shown
        done = ok(loom_cli(*resume[1:], cwd=tmp_path)).stdout
        assert "status completed" in done and "applied ALTER TABLE orders" in done
        assert "mig-42" in ok(loom_cli(*listing[1:], cwd=tmp_path)).stdout
    finally:
        node.signal(signal.SIGTERM)
        code, _, log = node.finish(timeout=30)
    assert code == 0, log
    assert "serving flows migration-guard" in log and "execution mig-42: sleep woke" in log

    # The Python half: main.py imports the same flows module and starts once, attach-safe.
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
    listed = as_json(ok(loom_cli("executions", "--json", cwd=tmp_path)))
    assert {e["execution_id"]: e["status"] for e in listed} == {
        "mig-42": "completed",
        "mig-43": "suspended",
    }
    assert json.loads(json.dumps(listed))  # the JSON listing is plain JSON
