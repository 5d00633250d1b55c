"""Running the real ``loom`` command in a subprocess, and a flows module for it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

LOOM = str(Path(sys.executable).with_name("loom"))

#: A flows module as a user writes it: no PYTHONPATH, imported from the current directory.
FLOWS = """
import os
from datetime import timedelta

import pydantic

import loom


class Decision(pydantic.BaseModel):
    approved: bool
    approved_by: str = "nobody"


class Job(pydantic.BaseModel):
    table: str
    nap: float = 0.0


@loom.step(id=os.environ.get("FLOWS_INSPECT_ID", "inspect"))
async def inspect(table: str) -> int:
    if os.environ.get("FLOWS_KILL_IN_STEP") == "1":
        os.kill(os.getpid(), 9)
    return 12_500_000


@loom.step(id="apply")
async def apply(ddl: str) -> str:
    return f"applied {ddl}"


@loom.flow(id="guard", version="1", resume_schemas={"ApprovalGranted": Decision})
async def guard(ctx: loom.WorkflowContext, job: Job) -> str:
    rows = await inspect(job.table)  # a direct call inside a flow is the durable call
    ctx.ui.set("rows", rows)
    await ctx.sleep(timedelta(seconds=job.nap))
    decision = await ctx.suspend("ApprovalGranted", timeout=timedelta(hours=24))
    if not decision.approved:
        return "rejected"
    return await ctx.run(apply, f"ALTER TABLE {job.table} ...")


class Note(pydantic.BaseModel):
    text: str = "noted"


@loom.flow(id="note", resume_schemas={"Noted": Note})
async def note(ctx: loom.WorkflowContext) -> str:
    got = await ctx.suspend("Noted")
    return got.text


flows = [guard, note]


def make_runtime() -> loom.WorkflowRuntime:
    runtime = loom.WorkflowRuntime(loom.SQLiteStore("app-store/app.db"))
    runtime.register(guard)
    return runtime
"""


def loom(
    *args: str,
    cwd: Path,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``loom ARGS`` as a user runs it: the installed console script, from ``cwd``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LOOM_", "PYTHONPATH"))}
    base.pop("COLUMNS", None)
    return subprocess.run(
        [LOOM, *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base, **(env or {})},
    )


def ok(out: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def as_json(out: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(out.stdout)


def one_line_error(out: subprocess.CompletedProcess[str], *, code: int = 1) -> str:
    """The command failed with ``code`` and said so in one line on stderr, no traceback."""
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def json_error(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "Traceback" not in out.stdout + out.stderr
    err: dict[str, Any] = json.loads(out.stdout)["error"]
    return err


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_flows(folder: Path, text: str = FLOWS) -> Path:
    (folder / "flows.py").write_text(text)
    return folder
