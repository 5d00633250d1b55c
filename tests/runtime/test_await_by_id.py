"""runtime.wait / runtime.subscribe: the outcome of an execution driven by another process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import ConfigurationError, ExecutionNotFoundError
from loom.model import ExecutionStatus
from loom.storage import SQLiteStore
from loom.storage.postgres import PostgresStore
from tests.support.pg import require_pg, temp_schema
from tests.support.proc import Child


async def _waits_for_other_process(
    store: Any, kind: str, where: str, schema: str, go: Path
) -> None:
    async with loom.WorkflowRuntime(store=store, timers=False) as rt:
        waiter = asyncio.create_task(rt.wait("remote-1", missing_ok=True, timeout=60))
        # The driving process (tests/children/await_driver.py) starts "remote-1" and blocks
        # until the go file exists.
        driver = Child("await_driver", kind, where, schema, go)
        try:
            seen = []

            async def follow() -> None:
                async for env in rt.subscribe("remote-1", missing_ok=True):
                    seen.append(str(env.type))

            follower = asyncio.create_task(follow())
            # The other process is driving it and blocks until told: the waiter must not
            # return before it ends.
            await rt.store.wait_for_append("remote-1", -1, timeout=30)
            running = await rt.load_state("remote-1")
            assert running is not None and running.status is ExecutionStatus.RUNNING
            assert not waiter.done()
            go.write_text("go")
            state = await waiter
            await asyncio.wait_for(follower, 30)
        finally:
            code, _, err = driver.finish(timeout=60)
        assert code == 0, err
        assert state.status is ExecutionStatus.COMPLETED
        assert state.output == {"n": 7, "said": "went"}
        assert seen[0] == "EXECUTION_STARTED" and seen[-1] == "EXECUTION_COMPLETED"
        assert "STEP_COMPLETED" in seen


async def test_wait_and_subscribe_across_processes_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    await _waits_for_other_process(SQLiteStore(db), "sqlite", str(db), "-", tmp_path / "go")


async def test_wait_and_subscribe_across_processes_postgres(tmp_path: Path) -> None:
    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        store = PostgresStore(dsn, schema=schema)
        await _waits_for_other_process(store, "pg", dsn, schema, tmp_path / "go")


@loom.flow(id="gated", version="1")
async def gated(ctx: loom.WorkflowContext) -> str:
    decision = await ctx.suspend("Go")
    return str(decision)


async def test_wait_until_settled_timeout_and_bad_input(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        await rt.start(gated, execution_id="g-1")
        settled = await rt.wait("g-1", until="settled", timeout=10)
        assert settled.status is ExecutionStatus.SUSPENDED
        with pytest.raises(TimeoutError, match="g-1"):
            await rt.wait("g-1", timeout=0.05)
        with pytest.raises(ExecutionNotFoundError) as missing:
            await rt.wait("nope", timeout=1)
        assert missing.value.execution_id == "nope"
        with pytest.raises(ConfigurationError, match="until"):
            await rt.wait("g-1", until="later")  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError):
            await rt.wait("", timeout=1)
        ender = asyncio.create_task(rt.wait("g-1", timeout=10))
        await rt.resume("g-1", "Go", "yes")
        done = await ender
        assert done.status is ExecutionStatus.COMPLETED and done.output == "yes"
        # A failed execution is an outcome, not an exception of wait().
        assert (await rt.wait("g-1")).status is ExecutionStatus.COMPLETED
