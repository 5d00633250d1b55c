"""The console over HTTP: pages, JSON API, SSE, security and refusals that change nothing."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

import loom
from loom.console import ConsoleConfig, ConsolePage, create_app
from loom.errors import ConfigurationError
from loom.testing import replay_flow
from tests.support import console_flows as cf
from tests.support.poll import until

BASE = "http://127.0.0.1"


class Console:
    def __init__(self, app: Any, runtime: loom.WorkflowRuntime, db: Path) -> None:
        self.app = app
        self.runtime = runtime
        self.db = db

    def client(self, **kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url=BASE, **kw)

    async def events_of(self, eid: str) -> list[str]:
        return [str(e.type) for e in await self.runtime.store.read(eid)]


@pytest.fixture
async def console(db_path: Path) -> AsyncIterator[Console]:
    await cf.populate(str(db_path))
    runtime = loom.WorkflowRuntime(loom.SQLiteStore(db_path))
    runtime.register(*cf.FLOWS)
    try:
        yield Console(create_app(runtime.store, runtime=runtime), runtime, db_path)
    finally:
        await runtime.close()


async def _csrf(client: httpx.AsyncClient) -> str:
    page = await client.get("/executions")
    match = re.search(r'name="csrf-token" content="(\w+)"', page.text)
    assert match
    return match.group(1)


async def test_pages_render_and_escape_the_log(console: Console) -> None:
    async with console.client() as c:
        listing = await c.get("/executions")
        assert listing.status_code == 200 and "review-1" in listing.text
        only = await c.get("/executions", params={"status": "cancelled"})
        assert "review-gone" in only.text and "review-1" not in only.text
        found = await c.get("/executions", params={"q": "done"})
        assert "review-done" in found.text and "review-0" not in found.text
        page = await c.get("/executions/review-0")
        assert page.status_code == 200
        assert "<script>document" not in page.text  # the step output, escaped
        assert "&lt;script&gt;document.title" in page.text
        assert 'name="approved_by"' in page.text  # the form from the gate's schema
        gates = await c.get("/gates")
        assert gates.text.count("data-gate-form") == 3


async def test_keyset_pagination(console: Console) -> None:
    async with console.client() as c:
        pages: list[list[str]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 2}
            if cursor is not None:
                params["after"] = cursor
            body = (await c.get("/api/executions", params=params)).json()
            pages.append([r["execution_id"] for r in body["items"]])
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert [len(p) for p in pages] == [2, 2, 1]
        seen = [eid for p in pages for eid in p]
        assert sorted(seen) == ["review-0", "review-1", "review-2", "review-done", "review-gone"]
        # The index lists newest first.
        assert seen[0] == "review-gone" and seen[-1] == "review-0"
        html = await c.get("/executions", params={"limit": 2})
        link = re.search(r'rel="next" href="([^"]+)"', html.text)
        assert link is not None
        nxt = await c.get(link.group(1).replace("&amp;", "&"))
        assert "review-2" in nxt.text and "review-gone" not in nxt.text


class _NoIndex:
    """A store without the index capability (a third party's): the console scans ids."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name in ("list_executions", "get_summary"):
            raise AttributeError(name)
        return getattr(self._store, name)


async def test_a_store_without_an_index_is_scanned(db_path: Path) -> None:
    await cf.populate(str(db_path))
    runtime = loom.WorkflowRuntime(_NoIndex(loom.SQLiteStore(db_path)))  # type: ignore[arg-type]
    runtime.register(*cf.FLOWS)
    app = create_app(runtime.store, runtime=runtime)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
            first = (await c.get("/api/executions", params={"limit": 3})).json()
            assert [r["execution_id"] for r in first["items"]] == [
                "review-0",
                "review-1",
                "review-2",
            ]
            rest = (await c.get("/api/executions", params={"after": first["next_cursor"]})).json()
            assert [r["execution_id"] for r in rest["items"]] == ["review-done", "review-gone"]
            only = (await c.get("/api/executions", params={"status": "cancelled"})).json()
            assert [r["execution_id"] for r in only["items"]] == ["review-gone"]
            gates = (await c.get("/api/gates")).json()["items"]
            assert len(gates) == 3
            assert (await c.get("/executions/review-0")).status_code == 200
    finally:
        await runtime.close()


async def test_state_at_any_sequence_and_bad_sequences(console: Console) -> None:
    async with console.client() as c:
        at2 = (await c.get("/api/executions/review-0/state", params={"at": 2})).json()
        assert at2["state"]["last_sequence"] == 2 and at2["state"]["ui"] == {"phase": "scored"}
        assert at2["event"]["type"] == "UI_PATCHED"
        for bad in ("abc", "-1", "99"):
            r = await c.get("/api/executions/review-0/state", params={"at": bad})
            assert r.status_code == 400, bad
            assert r.json()["error"]["execution_id"] == "review-0"
            page = await c.get("/executions/review-0", params={"at": bad})
            assert page.status_code == 400 and "data-error" in page.text
        missing = await c.get("/executions/ghost")
        assert missing.status_code == 404 and "ghost" in missing.text
        api_missing = await c.get("/api/executions/ghost")
        assert api_missing.json()["error"]["code"] == "execution_not_found"


async def test_export_is_the_log_and_replays(console: Console) -> None:
    async with console.client() as c:
        data = (await c.get("/api/executions/review-done/export")).json()
    envelopes = [loom.Envelope.from_dict(d) for d in data]
    state = await replay_flow(cf.review, envelopes)
    assert state.status.value == "completed"


async def test_forged_posts_change_nothing(console: Console) -> None:
    routes = [r for r in console.app.routes if "POST" in (getattr(r, "methods", None) or ())]
    assert len(routes) >= 6
    async with console.client() as c:
        token = await _csrf(c)
        for route in routes:
            path = route.path.replace("{execution_id:str}", "review-1")
            no_token = await c.post(path, data={"event_type": "Approval", "approved_by": "x"})
            assert no_token.status_code == 403, path
            wrong = await c.post(path, data={"csrf_token": "0" * 64, "reason": "x"})
            assert wrong.status_code == 403, path
            # A token without the cookie it belongs to (another browser's) is refused too.
            async with console.client() as other:
                stolen = await other.post(path, data={"csrf_token": token, "reason": "x"})
                assert stolen.status_code == 403, path
    assert (await console.events_of("review-1"))[-1] == "EXECUTION_SUSPENDED"


async def test_gate_decisions_refused_then_accepted(console: Console) -> None:
    async with console.client() as c:
        token = await _csrf(c)
        form = {"csrf_token": token, "event_type": "Approval", "note": "", "action": "approve"}
        refused = await c.post("/executions/review-1/decide", data={**form, "approved_by": ""})
        assert refused.status_code == 422 and "ResumeValidationError" in refused.text
        assert (await console.events_of("review-1"))[-1] == "EXECUTION_SUSPENDED"
        api = await c.post(
            "/api/executions/review-1/resume",
            json={"event_type": "Approval", "payload": {"approved": "perhaps"}},
            headers={"x-csrf-token": token},
        )
        assert api.status_code == 422 and api.json()["error"]["type"] == "ResumeValidationError"
        ok = await c.post("/executions/review-1/decide", data={**form, "approved_by": "ann"})
        assert ok.status_code == 303
        state = await console.runtime.handle("review-1").wait_for_completion(timeout=30)
        assert state.output == {
            "published": True,
            "result": "published post 1",
            "score": 6,
            "by": "ann",
        }
        again = await c.post("/executions/review-1/decide", data={**form, "approved_by": "bob"})
        assert again.status_code == 409 and "NotWaitingError" in again.text
        cancel = await c.post(
            "/api/executions/review-2/cancel",
            json={"reason": "no"},
            headers={"x-csrf-token": token},
        )
        assert cancel.json()["execution"]["status"] == "cancelled"


async def test_token_and_binding(db_path: Path) -> None:
    await cf.populate(str(db_path), count=1)
    with pytest.raises(ConfigurationError, match="LOOM_CONSOLE_TOKEN"):
        ConsoleConfig(host="0.0.0.0").check_binding()
    ConsoleConfig(host="127.0.0.1").check_binding()
    secret = "s3cret-token-of-some-length"
    runtime = loom.WorkflowRuntime(loom.SQLiteStore(db_path))
    runtime.register(*cf.FLOWS)
    app = create_app(
        runtime.store, runtime=runtime, config=ConsoleConfig(host="0.0.0.0", token=secret)
    )
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
            assert (await c.get("/executions")).status_code == 401
            assert (await c.get("/api/executions")).json()["error"]["code"] == "unauthorized"
            wrong = await c.get("/api/executions", headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401
            ok = await c.get("/api/executions", headers={"authorization": f"Bearer {secret}"})
            assert ok.status_code == 200
            # A script with the bearer token needs no CSRF token (browsers never send it).
            r = await c.post(
                "/api/executions/review-0/cancel",
                json={},
                headers={"authorization": f"Bearer {secret}"},
            )
            assert r.json()["execution"]["status"] == "cancelled"
            # A browser trades ?token= for a cookie once.
            login = await c.get("/executions", params={"token": secret})
            assert login.status_code == 303 and login.headers["location"] == "/executions"
            assert (await c.get("/executions")).status_code == 200
    finally:
        await runtime.close()


async def test_rebinding_guard(console: Console) -> None:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console.app), base_url="http://evil.example"
    ) as c:
        assert (await c.get("/executions")).status_code == 400


async def test_a_layer_adds_a_page(db_path: Path) -> None:
    from starlette.responses import HTMLResponse

    async def board(request: Any) -> HTMLResponse:
        return HTMLResponse("branch board")

    await cf.populate(str(db_path), count=1)
    runtime = loom.WorkflowRuntime(loom.SQLiteStore(db_path))
    app = create_app(
        runtime.store, runtime=runtime, pages=[ConsolePage("/branches", "Branches", board)]
    )
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
            assert 'href="/branches"' in (await c.get("/executions")).text
            assert (await c.get("/branches")).text == "branch board"
    finally:
        await runtime.close()


async def test_live_events_resume_with_last_event_id(console: Console) -> None:
    """Over a real server: the stream replays after Last-Event-ID, then follows live."""
    server = uvicorn.Server(
        uvicorn.Config(console.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    try:
        # uvicorn has no started event: poll its flag.
        await until(lambda: server.started, "uvicorn to start", timeout=30, every=0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}/api/executions/review-0/events"
        async with httpx.AsyncClient(timeout=30) as c:
            seen: list[dict[str, Any]] = []
            async with c.stream("GET", url, headers={"last-event-id": "3"}) as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        seen.append(json.loads(line[6:]))
                        if seen[-1]["envelope"]["sequence"] == 5:
                            await console.runtime.resume(
                                "review-0", "Approval", {"approved": False, "approved_by": "zed"}
                            )
                        if seen[-1]["status"] == "completed":
                            break
        sequences = [m["envelope"]["sequence"] for m in seen]
        assert sequences[0] == 4 and sequences == list(range(4, sequences[-1] + 1))
        assert seen[-1]["envelope"]["type"] == "EXECUTION_COMPLETED"
    finally:
        server.should_exit = True
        await task


async def test_over_postgres_behind_a_tenant_view() -> None:
    from loom.storage import PostgresStore, TenantScopedEventStore
    from tests.support.pg import require_pg, temp_schema

    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        store = await PostgresStore.open(dsn, schema=schema)
        try:
            for tenant, title in (("acme", "mine"), ("other", "theirs")):
                view = TenantScopedEventStore(store, tenant)
                async with loom.WorkflowRuntime(view) as rt:
                    rt.register(*cf.FLOWS)
                    handle = await rt.start(cf.review, cf.Draft(title=title), execution_id="r1")
                    await handle.wait_for_suspend()
            runtime = loom.WorkflowRuntime(TenantScopedEventStore(store, "acme"))
            runtime.register(*cf.FLOWS)
            app = create_app(runtime.store, runtime=runtime)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=BASE
            ) as c:
                items = (await c.get("/api/executions")).json()["items"]
                assert [i["execution_id"] for i in items] == ["r1"]
                page = await c.get("/executions/r1")
                assert "mine" in page.text and "theirs" not in page.text
                token = await _csrf(c)
                r = await c.post(
                    "/api/executions/r1/resume",
                    json={
                        "event_type": "Approval",
                        "payload": {"approved": True, "approved_by": "pg"},
                    },
                    headers={"x-csrf-token": token},
                )
                assert r.status_code == 200, r.text
            state = await runtime.handle("r1").wait_for_completion(timeout=30)
            assert state.output["by"] == "pg"
            await runtime.close()
        finally:
            await store.close()
