"""The HTTP worker tests' rig: a runtime with counted effects behind an ASGI worker app,
and a client for it (tests/placement/http/)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pydantic

import loom
from loom.placement import ExecutionPackage
from loom.placement.http import BearerTokenAuth, RemoteWorkerRuntime, create_worker_app
from loom.storage import SQLiteStore, Store

SECRET = "s3cret-token-for-the-worker-tests"
BASE = "http://worker.test"


class Decision(pydantic.BaseModel):
    approved: bool


class Effects(dict[str, int]):
    """Effect counts by step id, with a way to wait (event-driven) until one is reached."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Condition()

    async def bump(self, name: str) -> None:
        async with self.changed:
            self[name] = self.get(name, 0) + 1
            self.changed.notify_all()

    async def reach(self, name: str, count: int, timeout: float = 10.0) -> None:
        async with self.changed:
            await asyncio.wait_for(
                self.changed.wait_for(lambda: self.get(name, 0) >= count), timeout
            )


@dataclass
class Rig:
    """A runtime with counted effects behind an ASGI worker app, and a client for it."""

    runtime: loom.WorkflowRuntime
    app: Any
    client: httpx.AsyncClient
    effects: Effects
    gate: asyncio.Event
    later_gate: asyncio.Event
    errors: list[tuple[ExecutionPackage | None, BaseException]] = field(default_factory=list)
    superseded: list[tuple[ExecutionPackage, BaseException]] = field(default_factory=list)

    @property
    def store(self) -> Store:
        return self.runtime.store

    def remote(self, **kw: Any) -> RemoteWorkerRuntime:
        kw.setdefault("token", SECRET)
        return RemoteWorkerRuntime(BASE, client=self.client, **kw)

    async def post(self, body: Any, *, token: str | None = SECRET, **kw: Any) -> httpx.Response:
        headers = kw.pop("headers", {})
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        if not isinstance(body, (bytes, str)) and body is not None and "content" not in kw:
            kw["content"] = json.dumps(body)
            headers.setdefault("content-type", "application/json")
        elif body is not None:
            kw["content"] = body
        return await self.client.post("/execute", headers=headers, **kw)

    async def assert_nothing_stored(self, execution_id: str = "e-1") -> None:
        ids = [eid async for eid in self.store.iterate_execution_ids()]
        assert ids == [], f"a refused request wrote events: {ids}"
        # Not even a fence: refused before the attempt's allocate() took one.
        assert await self.store.current_fence(execution_id) == 0


def rig_flows(
    effects: Effects, gate: asyncio.Event, later_gate: asyncio.Event | None = None
) -> list[loom.Flow[Any, Any]]:
    """The flows of these tests. ``gated-step`` waits for ``gate`` (its second and later runs
    for ``later_gate`` when given, so a test can release two racing attempts one by one)."""

    def counted(name: str) -> loom.Step[[int], int]:
        @loom.step(id=name)
        async def effect(n: int) -> int:
            await effects.bump(name)
            if name == "gated-step":
                later = later_gate is not None and effects[name] > 1
                await (later_gate if later and later_gate is not None else gate).wait()
            return n + 1

        return effect

    one, two, three, slow = counted("one"), counted("two"), counted("three"), counted("gated-step")

    @loom.flow(id="three", version="1")
    async def three_steps(ctx: loom.WorkflowContext, n: int) -> int:
        return await ctx.run(three, await ctx.run(two, await ctx.run(one, n)))

    @loom.flow(id="slow", version="1")
    async def slow_flow(ctx: loom.WorkflowContext, n: int) -> int:
        return await ctx.run(two, await ctx.run(slow, await ctx.run(one, n)))

    @loom.flow(id="fails", version="1")
    async def fails(ctx: loom.WorkflowContext, n: int) -> int:
        await ctx.run(one, n)
        raise RuntimeError("flow-level failure")

    @loom.flow(id="approve", version="1", resume_schemas={"Go": Decision})
    async def approve(ctx: loom.WorkflowContext, n: int) -> int:
        n = await ctx.run(one, n)
        decision = await ctx.suspend("Go")
        return await ctx.run(two, n) if decision.approved else -1

    return [three_steps, slow_flow, fails, approve]


def pkg(eid: str = "e-1", flow: str = "three", n: Any = 1, **kw: Any) -> ExecutionPackage:
    return ExecutionPackage(execution_id=eid, flow_id=flow, input=n, **kw)


@asynccontextmanager
async def open_rig(tmp_path: Path) -> AsyncIterator[Rig]:
    """A Rig over a SQLite file in ``tmp_path``: bearer auth with SECRET, 4 KiB bodies."""
    effects = Effects()
    gate, later_gate = asyncio.Event(), asyncio.Event()
    runtime = loom.WorkflowRuntime(SQLiteStore(tmp_path / "worker.db"))
    runtime.register(*rig_flows(effects, gate, later_gate))
    errors: list[tuple[ExecutionPackage | None, BaseException]] = []
    superseded: list[tuple[ExecutionPackage, BaseException]] = []
    app = create_worker_app(
        runtime,
        auth=BearerTokenAuth(SECRET),
        max_body_bytes=4096,
        on_error=lambda p, e: errors.append((p, e)),
        on_superseded=lambda p, e: superseded.append((p, e)),
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)
    try:
        yield Rig(runtime, app, client, effects, gate, later_gate, errors, superseded)
    finally:
        gate.set()
        later_gate.set()
        await client.aclose()
        await runtime.close()
