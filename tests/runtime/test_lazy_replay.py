"""Recovery from a snapshot whose op records load lazily (#13.3): replay answers from the
snapshot's columns, so it must return what the log recorded, re-run nothing, and refuse a
changed flow exactly as from a log folded record by record."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

import loom
from loom.errors import NonDeterminismError, StepFailedError
from loom.model import ExecutionStatus, OpStatus, replay
from loom.model._state import LazyOps
from tests.conftest import DURABLE, Backend

calls: Counter[str] = Counter()


class Gates:
    """The last step's start and release (made on each test's loop): unreleased, the first
    runtime "dies" while it runs."""

    hanging: asyncio.Event
    release: asyncio.Event


@loom.step(id="plain")
async def plain(i: int) -> dict[str, int]:
    calls["plain"] += 1
    return {"i": i}


@loom.step(id="flaky", retry=loom.RetryPolicy(max_attempts=3, initial_backoff=0.001))
async def flaky(i: int) -> int:
    calls[f"flaky-{i}"] += 1
    if calls[f"flaky-{i}"] == 1:
        raise RuntimeError("first attempt fails")
    return i * 10


@loom.step(id="doomed")
async def doomed() -> None:
    calls["doomed"] += 1
    raise ValueError("always")


@loom.step(id="last")
async def last() -> str:
    Gates.hanging.set()
    await Gates.release.wait()
    return "done"


async def _body(ctx: loom.WorkflowContext, n: int, rename_at: int | None) -> Any:
    total = 0
    for i in range(n):
        if rename_at == -1 and i == n - 2:
            return total  # the code changed: it returns before positions the log holds
        if i == rename_at:
            await ctx.run(flaky, i)  # the code changed: another step at a logged position
        out = await ctx.run(plain, i)
        total += out["i"]
        if i % 5 == 0:
            total += await ctx.run(flaky, i)
        if i == 3:
            try:
                await ctx.run(doomed)
            except StepFailedError:
                total += 1
        if i == 7:
            total += await ctx.decide("pick", lambda: 42)
        if i == 8:
            ctx.ui.set("k", i)
        if i == 9:  # two steps at once: positions may be logged out of order
            a, b = await asyncio.gather(ctx.run(plain, 100), ctx.run(plain, 101))
            total += a["i"] + b["i"]
        if i == 10:
            total += (await ctx.suspend("Go"))["v"]
    return [total, await ctx.run(last)]


@loom.flow(id="lazy-mix", version="1")
async def mix(ctx: loom.WorkflowContext, n: int) -> Any:
    return await _body(ctx, n, None)


def _changed(rename_at: int) -> loom.Flow[Any, Any]:
    @loom.flow(id="lazy-mix", version="1")
    async def changed(ctx: loom.WorkflowContext, n: int) -> Any:
        return await _body(ctx, n, rename_at)

    return changed


async def _crashed(backend: Backend, eid: str) -> None:
    """Run ``eid`` until its last step is running, then stop the runtime (the process dies
    there: everything before it is in the log, under a chain of snapshot segments)."""
    Gates.release, Gates.hanging = asyncio.Event(), asyncio.Event()
    rt = loom.WorkflowRuntime(backend.store(), snapshot_every=3, timers=False)
    rt.register(mix)
    handle = await rt.start(mix, 14, execution_id=eid)
    await handle.wait_for_suspend()
    await rt.resume(eid, "Go", {"v": 5})
    await asyncio.wait_for(Gates.hanging.wait(), 10)
    await rt.close()


@pytest.mark.parametrize("backend", DURABLE, indirect=True)
async def test_a_lazily_loaded_state_recovers_with_nothing_rerun(backend: Backend) -> None:
    calls.clear()
    await _crashed(backend, "lazy-ok")
    before = dict(calls)
    rt = loom.WorkflowRuntime(backend.store(), snapshot_every=3, timers=False)
    rt.register(mix)
    loaded = await rt.load_state("lazy-ok")
    assert loaded is not None and type(loaded.ops) is LazyOps
    folded = replay(await rt.store.read("lazy-ok"), execution_id="lazy-ok")
    assert type(folded.ops) is dict
    assert list(loaded.ops) == list(folded.ops)
    assert all(loaded.ops[p] == op for p, op in folded.ops.items())
    assert loaded == folded
    statuses = {op.status for op in folded.ops.values()}
    assert {OpStatus.COMPLETED, OpStatus.FAILED, OpStatus.RESOLVED} <= statuses
    Gates.release.set()
    handle = await rt.recover("lazy-ok")
    total = sum(range(14)) + sum(i * 10 for i in range(0, 14, 5)) + 1 + 42 + 201 + 5
    assert await handle.result() == [total, "done"]
    assert calls == before  # every logged step replayed from the snapshot, none run again
    final = await rt.load_state("lazy-ok")
    assert final == replay(await rt.store.read("lazy-ok"), execution_id="lazy-ok")
    assert final is not None and final.status is ExecutionStatus.COMPLETED
    await rt.close()


@pytest.mark.parametrize("backend", DURABLE, indirect=True)
async def test_a_changed_flow_is_refused_at_the_position_it_diverged(backend: Backend) -> None:
    calls.clear()
    await _crashed(backend, "lazy-nd")
    for rename_at, position, recorded, requested in (
        (2, 3, "step:plain", "step:flaky"),  # inside the snapshot's columns
        (-1, None, None, "return"),
    ):
        rt = loom.WorkflowRuntime(backend.store(), snapshot_every=3, timers=False)
        rt.register(_changed(rename_at))
        before = dict(calls)
        handle = await rt.recover("lazy-nd")
        with pytest.raises(NonDeterminismError) as info:
            await handle.result()
        details = info.value.details
        if position is not None:
            assert details["position"] == position and details["recorded"] == recorded
        assert details["requested"] == requested
        assert calls == before  # refused before running anything
        state = await rt.load_state("lazy-nd")
        assert state is not None and state.status is ExecutionStatus.RUNNING
        await rt.close()
