"""loom.views over memory, SQLite and PostgreSQL: listings from the index, paged timelines,
state at a sequence, live follow and the change feed; runtime.executions() and
`loom executions --store URL` read the index."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.model import ExecutionStatus, ExecutionSummary
from loom.storage import ExecutionQuery, InMemoryStore, SQLiteStore, open_store
from loom.views import ExecutionViews
from tests.cli.test_cli import loom_cli
from tests.support.pg import require_pg, temp_schema


@loom.step(id="inc")
async def inc(x: int) -> int:
    return x + 1


@loom.flow(id="approval")
async def approval(ctx: loom.WorkflowContext, x: int) -> int:
    y: int = await ctx.run(inc, x)
    y = await ctx.run(inc, y)
    await ctx.suspend("approve")
    return y


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield InMemoryStore()
    elif request.param == "sqlite":
        yield SQLiteStore(tmp_path / "v.db")
    else:
        dsn = require_pg()
        async with temp_schema(dsn) as schema:
            s = await open_store(f"{dsn}?schema={schema}")
            yield s
            await s.close()


async def _next(it: AsyncIterator[Any]) -> Any:
    return await asyncio.wait_for(it.__anext__(), 30)


async def test_views_read_the_index_and_follow_live_changes(store: Any) -> None:
    rt = loom.WorkflowRuntime(store)
    rt.register(approval)
    views = ExecutionViews(store, poll=0.2)
    feed = views.feed(0)
    try:
        handle = await rt.start(approval, 1, execution_id="a")
        first: ExecutionSummary = await _next(feed)
        assert (first.execution_id, first.flow_id) == ("a", "approval")
        while first.status is not ExecutionStatus.SUSPENDED:
            first = await _next(feed)
        assert first.waiting_for == "approve"

        # runtime.executions() lists from the index, newest first.
        await rt.start(approval, 5, execution_id="b")
        summaries = [s async for s in rt.executions()]
        assert [s.execution_id for s in summaries] == ["b", "a"]
        assert await views.count(ExecutionQuery(flow_id="approval")) == 2

        timeline = await views.timeline("a", limit=2)
        assert [e.sequence for e in timeline] == [0, 1]
        rest = await views.timeline("a", after_sequence=1, limit=100)
        assert rest[0].sequence == 2 and rest[-1].type == "EXECUTION_SUSPENDED"
        early = await views.state_at("a", 2)
        assert early.last_sequence == 2 and early.status is ExecutionStatus.RUNNING
        with pytest.raises(loom.errors.ConfigurationError, match="no sequence 99"):
            await views.state_at("a", 99)
        with pytest.raises(loom.ExecutionNotFoundError):
            await views.state_at("nope")

        follow = views.follow("a", after_sequence=rest[-1].sequence)
        waiting = asyncio.ensure_future(_next(follow))
        await asyncio.sleep(0)
        await rt.resume("a", "approve", None)
        resumed = await waiting
        assert resumed.type == "EXECUTION_RESUMED"
        tail = [e.type async for e in follow]
        assert tail[-1] == "EXECUTION_COMPLETED"
        assert (await handle.result()) == 3
        done = await _next(feed)
        while done.execution_id != "a" or done.status is not ExecutionStatus.COMPLETED:
            done = await _next(feed)
        assert (await views.summary("a")).status is ExecutionStatus.COMPLETED
    finally:
        await feed.aclose()  # type: ignore[attr-defined]
        await rt.close()


@pytest.mark.postgres
def test_loom_executions_reads_postgres_with_no_sqlite_file(tmp_path: Path) -> None:
    dsn = require_pg()

    async def seed(schema: str) -> None:
        store = await open_store(f"{dsn}?schema={schema}")
        rt = loom.WorkflowRuntime(store)
        rt.register(approval)
        for i in range(3):
            handle = await rt.start(approval, i, execution_id=f"pg-{i}")
            await handle.settled()
        await rt.close()

    async def run() -> None:
        async with temp_schema(dsn) as schema:
            await seed(schema)
            url = f"{dsn}?schema={schema}"
            out = await asyncio.to_thread(
                loom_cli,
                "executions",
                "--store",
                url,
                "--status",
                "suspended",
                "--json",
                cwd=tmp_path,
            )
            assert out.returncode == 0, out.stdout + out.stderr
            listed = json.loads(out.stdout)
            assert sorted(e["execution_id"] for e in listed) == ["pg-0", "pg-1", "pg-2"]
            assert {e["waiting_for"] for e in listed} == {"approve"}
            none = await asyncio.to_thread(
                loom_cli,
                "executions",
                "--store",
                url,
                "--status",
                "failed",
                "--json",
                cwd=tmp_path,
            )
            assert json.loads(none.stdout) == []

    asyncio.run(run())
    assert list(tmp_path.iterdir()) == []  # the URL never became a SQLite file
