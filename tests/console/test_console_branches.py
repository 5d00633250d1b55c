"""The branch board over HTTP: fork from an execution's page, promote, refusals change nothing."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import loom
from loom.console import branch_pages, create_app
from loom.errors import GateSupersededError
from tests.branching.flows import guarded

BASE = "http://127.0.0.1"


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[tuple[Any, loom.WorkflowRuntime]]:
    runtime = loom.WorkflowRuntime(loom.SQLiteStore(tmp_path / "c.db"), timers=False)
    runtime.register(guarded)
    state = await (await runtime.start(guarded, 1, execution_id="p1")).wait_for_suspend(timeout=30)
    await runtime.store.put_ref("main", "p1", state.last_sequence)  # type: ignore[attr-defined]
    try:
        yield create_app(runtime.store, runtime=runtime, pages=branch_pages()), runtime
    finally:
        await runtime.close()


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)


async def _csrf(c: httpx.AsyncClient) -> str:
    page = await c.get("/branches")
    match = re.search(r'name="csrf-token" content="(\w+)"', page.text)
    assert match
    return match.group(1)


async def test_fork_and_promote_from_the_board(app: tuple[Any, loom.WorkflowRuntime]) -> None:
    asgi, runtime = app
    async with _client(asgi) as c:
        page = await c.get("/executions/p1")
        assert 'href="/branches?fork=p1&amp;at=' in page.text  # the Fork… button
        board = await c.get("/branches", params={"fork": "p1", "at": "3"})
        assert board.status_code == 200 and 'value="p1"' in board.text and "main" in board.text
        token = await _csrf(c)
        forked = await c.post(
            "/branches/fork",
            data={"csrf_token": token, "execution_id": "p1", "at": "", "branch": "sim/a"},
        )
        assert forked.status_code == 303
        branch_id = forked.headers["location"].rsplit("/", 1)[1]
        branch = await runtime.load_state(branch_id)
        assert branch is not None and branch.forked_from is not None
        assert branch.forked_from["parent_id"] == "p1"
        board = await c.get("/branches")
        assert "sim/a" in board.text and branch_id in board.text
        promoted = await c.post(
            "/branches/promote",
            data={"csrf_token": token, "from_ref": "sim/a", "to_ref": "main", "by": "ann"},
        )
        assert promoted.status_code == 303
        main = await runtime.store.get_ref("main")  # type: ignore[attr-defined]
        assert main is not None and main.execution_id == branch_id
        assert "from sim/a by ann" in (await c.get("/branches")).text
    with pytest.raises(GateSupersededError):
        await runtime.resume("p1", "Approve", {"plan": "x"})


async def test_refusals_render_the_error_and_change_nothing(
    app: tuple[Any, loom.WorkflowRuntime],
) -> None:
    asgi, runtime = app
    async with _client(asgi) as c:
        token = await _csrf(c)
        past = await c.post(
            "/branches/fork", data={"csrf_token": token, "execution_id": "p1", "at": "99"}
        )
        assert past.status_code == 409 and "cannot fork execution" in past.text
        bad = await c.post(
            "/branches/fork",
            data={"csrf_token": token, "execution_id": "p1", "branch": "../etc"},
        )
        assert bad.status_code == 400
        no_csrf = await c.post("/branches/fork", data={"execution_id": "p1"})
        assert no_csrf.status_code == 403
        ghost = await c.post(
            "/branches/promote",
            data={"csrf_token": token, "from_ref": "ghost", "to_ref": "main", "by": "x"},
        )
        assert ghost.status_code == 404
    assert [i async for i in runtime.store.iterate_execution_ids()] == ["p1"]
