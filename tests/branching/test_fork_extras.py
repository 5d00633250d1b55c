"""A fork shares the parent's blobs (nothing copied) and inherits its deadline."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import ForkError
from loom.llm import ScriptedProvider
from loom.runtime._cancel import DEADLINE_POSITION
from loom.storage import SQLiteStore
from tests.branching.flows import guarded


async def test_a_branch_reads_the_parents_blobs_and_copies_none(tmp_path: Path) -> None:
    provider = ScriptedProvider(["first answer, long enough to be a stored message " * 20])
    helper = loom.agent(id="helper", provider=provider, model="m", instructions="Help.")

    @loom.flow(id="chat", version="1")
    async def chat(ctx: loom.WorkflowContext, text: str) -> dict[str, Any]:
        answer = await ctx.agent(helper, text)
        go = await ctx.suspend("Go")
        return {"answer": answer.output, "go": go}

    db = tmp_path / "blobs.db"
    rt = loom.WorkflowRuntime(SQLiteStore(db), timers=False)
    rt.register(chat)
    parent = await (await rt.start(chat, "hello", execution_id="c1")).wait_for_suspend(timeout=30)

    def blob_rows() -> int:
        with sqlite3.connect(db) as conn:
            return int(conn.execute("SELECT count(*) FROM loom_blobs").fetchone()[0])

    stored = blob_rows()
    assert stored > 0 and provider.calls == 1
    branch = await rt.fork("c1", parent.last_sequence, execution_id="c1-b")
    assert blob_rows() == stored  # shared, not copied
    result = await (await rt.resume("c1-b", "Go", {"ok": 1})).result(timeout=30)
    assert result["answer"].startswith("first answer") and result["go"] == {"ok": 1}
    assert provider.calls == 1  # the conversation was read back from the parent's blobs
    assert blob_rows() == stored and branch.state.forked_from is not None
    await rt.close()


async def test_a_branch_keeps_the_parents_deadline(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "d.db")
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(guarded)
    handle = await rt.start(guarded, 1, execution_id="dl", deadline=timedelta(hours=2))
    state = await handle.wait_for_suspend(timeout=30)
    deadline = state.metadata["loom.deadline"]
    await rt.fork("dl", state.last_sequence, execution_id="dl-b")
    due = await store.claim_due_timers(deadline + 1, owner="t", lease=10, prefix="dl-b")
    assert {(t.position, t.kind, t.fire_at) for t in due} >= {
        (DEADLINE_POSITION, "deadline", deadline)
    }
    await rt.close()


@loom.flow(id="kid", version="1")
async def kid(ctx: loom.WorkflowContext, n: int) -> int:
    await ctx.suspend("KidGo")
    return n


@loom.flow(id="boss", version="1")
async def boss(ctx: loom.WorkflowContext, n: int) -> int:
    return int(await ctx.call(kid, n)) + 1


async def test_a_fork_where_the_parent_waits_on_its_child_is_refused(tmp_path: Path) -> None:
    rt = loom.WorkflowRuntime(SQLiteStore(tmp_path / "k.db"), timers=False)
    rt.register(kid, boss)
    handle = await rt.start(boss, 1, execution_id="boss-1")
    state = await handle.wait_for_suspend(timeout=30)
    assert state.waiting is not None and state.waiting.event_type.startswith("loom.child:")
    with pytest.raises(ForkError, match="waits on its child execution"):
        await rt.fork("boss-1")
    assert await rt.store.children("boss-1") == []  # type: ignore[attr-defined]
    await rt.close()
