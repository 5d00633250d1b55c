"""SIGKILL of the process driving a parent with three children, at three moments; a second
process recovers. Every child's effect ran exactly once (the ledger), the parent completed,
and each child has exactly one EXECUTION_STARTED (no second child under any id)."""

from __future__ import annotations

import collections
import json
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import loom
from loom.storage import ExecutionQuery, SQLiteStore, Store
from loom.storage.postgres import PostgresStore
from tests.support.pg import require_pg, temp_schema
from tests.support.proc import run_child

MODES = {
    # The first child's start is durable, the parent has not recorded it, nothing ran.
    "child-start": {"LOOM_FAULTS": "after_start_before_drive=kill@2"},
    # All three children are inside their effects (none recorded); the parent waits.
    "children-running": {"LOOM_CHILD_CRASH": "children-running"},
    # The first child ended and the parent took its outcome; the other two are mid-effect.
    "one-finished": {"LOOM_CHILD_CRASH": "one-finished"},
}


def _run(args: list[str], env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_child("parent_with_children", *args, env=env_extra, drop=("LOOM_CHILD_CRASH",))


@asynccontextmanager
async def _where(kind: str, tmp: Path) -> AsyncIterator[tuple[str, str]]:
    if kind == "sqlite":
        yield str(tmp / "loom.db"), "-"
        return
    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        yield dsn, schema


def _open(kind: str, where: str, schema: str) -> Store:
    return SQLiteStore(where) if kind == "sqlite" else PostgresStore(where, schema=schema)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("mode", list(MODES))
async def test_sigkill_parent_with_three_children(kind: str, mode: str, tmp_path: Path) -> None:
    async with _where(kind, tmp_path) as (where, schema):
        args = [kind, where, schema, str(tmp_path), "par"]
        crashed = _run(["start", *args], MODES[mode])
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
        recovered = _run(["recover", *args], {})
        assert recovered.returncode == 0, recovered.stderr[-3000:]
        outcome = json.loads(recovered.stdout.strip().splitlines()[-1])
        assert outcome == {"status": "completed", "output": 30}

        ledger = collections.Counter((tmp_path / "ledger").read_text().split())
        # Every child's effect ran exactly once, and so did the parent's own steps.
        assert ledger == {"par:prep": 1, "par.1": 1, "par.2": 1, "par.3": 1, "par:total": 1}

        store = _open(kind, where, schema)
        try:
            async with loom.WorkflowRuntime(store=store, timers=False) as rt:
                children = [s async for s in rt.executions(ExecutionQuery(parent_id="par"))]
                assert sorted(c.execution_id for c in children) == ["par.1", "par.2", "par.3"]
                for child in children:
                    log = await store.read(child.execution_id)
                    starts = [e for e in log if str(e.type) == "EXECUTION_STARTED"]
                    assert len(starts) == 1
                    assert str(log[-1].type) == "EXECUTION_COMPLETED"
                parent_log = await store.read("par")
                kinds = collections.Counter(str(e.type) for e in parent_log)
                assert kinds["loom.child_started"] == 3
                assert kinds["EXECUTION_STARTED"] == 1
        finally:
            await store.close()
