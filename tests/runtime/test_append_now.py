"""A new step's record is committed in ctx.run's own frame when the store can (AppendsNow),
with every outcome ``append`` has: it waits for another process's write lock, a subclass that
overrides ``append`` still sees every write, and a holder fenced out meanwhile is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import loom
import loom._aio
from loom.errors import LoomError, StaleFenceError
from loom.model import EventType
from loom.storage import AppendsNow
from tests.support.poll import until
from tests.support.sqlite_lock import write_lock_held


@loom.step(id="inc")
async def inc(x: int) -> int:
    return x + 1


@loom.flow(id="count")
async def count(ctx: loom.WorkflowContext, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.run(inc, x)
    return x


class _Spy:
    """Counts what a store's append_now answered, by kind."""

    def __init__(self, store: Any) -> None:
        self.answers: list[str] = []
        real = store.append_now

        def append_now(env: Any) -> Any:
            out = real(env)
            self.answers.append(str(out) if isinstance(out, bool) else "awaitable")
            return out

        store.append_now = append_now


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_new_steps_are_committed_in_the_callers_frame(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The loop's turns come by the clock (one per SHARE_LOOP_EVERY of writes): on a loaded
    # machine 50 steps can take long enough for many, so the turn is pushed out of this run
    # and the count below does not depend on the machine's speed.
    monkeypatch.setattr(loom._aio, "SHARE_LOOP_EVERY", 3600.0)
    store = loom.SQLiteStore(tmp_path / "a.db") if kind == "sqlite" else loom.InMemoryStore()
    assert isinstance(store, AppendsNow)
    spy = _Spy(store)
    rt = loom.WorkflowRuntime(store)
    rt.register(count)
    handle = await rt.start(count, 50, execution_id="e1")
    assert await handle.result(timeout=10) == 50
    # Every step went straight through but the first, where the loop was due its one turn.
    assert spy.answers.count("True") >= 49, spy.answers
    assert spy.answers.count("awaitable") == 0, spy.answers
    events = await store.read("e1")
    steps = [e for e in events if e.type is EventType.STEP_COMPLETED]
    assert [e.payload["output"] for e in steps] == list(range(1, 51))
    assert [e.sequence for e in events] == list(range(len(events)))
    await rt.close()


class _CountingStore(loom.SQLiteStore):
    """Overrides append only: it must see every write, the fast path included."""

    appends = 0

    async def append(self, envelopes: Any) -> None:
        self.appends += 1
        await super().append(envelopes)


async def test_a_subclass_that_overrides_append_sees_every_write(tmp_path: Path) -> None:
    store = _CountingStore(tmp_path / "c.db")
    rt = loom.WorkflowRuntime(store)
    rt.register(count)
    handle = await rt.start(count, 5, execution_id="e2")
    assert await handle.result(timeout=10) == 5
    events = await store.read("e2")
    # Every record after the start went through append (the start and its take-over do not).
    appended = [e for e in events if e.type is EventType.STEP_COMPLETED]
    assert len(appended) == 5 and store.appends >= 5 + 1  # 5 steps + the completion
    await rt.close()


effects: list[int] = []
#: Made anew by each test (an asyncio.Event belongs to the loop that first waits on it).
gate = asyncio.Event()


@loom.step(id="slow-effect")
async def slow_effect(i: int) -> int:
    effects.append(i)
    if i == 1:
        await gate.wait()
    return i


@loom.flow(id="two-effects")
async def two_effects(ctx: loom.WorkflowContext) -> str:
    await ctx.run(slow_effect, 1)
    await ctx.run(slow_effect, 2)
    return "ran on"


@loom.flow(id="swallows")
async def swallows(ctx: loom.WorkflowContext) -> str:
    try:
        await ctx.run(slow_effect, 1)
    except StaleFenceError:
        pass  # a broad flow swallows the refusal: its next effect must still not run
    await ctx.run(slow_effect, 2)
    return "ran on"


async def test_a_step_waits_for_another_process_lock_then_commits(tmp_path: Path) -> None:
    global gate
    effects.clear()
    gate = asyncio.Event()
    db = tmp_path / "busy.db"
    store = loom.SQLiteStore(db)
    spy = _Spy(store)
    rt = loom.WorkflowRuntime(store)
    handle = await rt.start(two_effects, execution_id="e3")
    await until(lambda: effects == [1], "the first effect to start")
    async with write_lock_held(db):
        _never_due(store)
        gate.set()  # the first step returns: its record finds the lock held
        await until(lambda: "awaitable" in spy.answers, "the record to wait for the lock")
        assert effects == [1]  # the next effect waits for the record to be durable
    assert await handle.result(timeout=20) == "ran on"
    assert effects == [1, 2]
    events = await store.read("e3")
    assert [e.sequence for e in events] == list(range(len(events)))
    outputs = [e.payload["output"] for e in events if e.type is EventType.STEP_COMPLETED]
    assert outputs == [1, 2]
    await rt.close()


def _never_due(store: Any) -> None:
    """Keep the store's loop share from being due, so that every record tries append_now."""
    store._loop_share._next = float("inf")


async def test_a_fenced_out_holder_runs_no_further_effect(tmp_path: Path) -> None:
    global gate
    effects.clear()
    gate = asyncio.Event()
    db = tmp_path / "fence.db"
    store = loom.SQLiteStore(db)
    spy = _Spy(store)
    rt = loom.WorkflowRuntime(store)
    handle = await rt.start(swallows, execution_id="e4")
    await until(lambda: effects == [1], "the first effect to start")
    other = loom.SQLiteStore(db)  # another process recovering the execution
    await other.acquire_fence("e4")
    _never_due(store)
    gate.set()
    with pytest.raises(LoomError):
        await handle.result(timeout=10)
    assert effects == [1]  # the second effect never ran
    assert spy.answers == []  # the refusal was raised by append_now, not answered
    steps = [e for e in await other.read("e4") if e.type is EventType.STEP_COMPLETED]
    assert steps == []  # nothing of the stale holder's step was written
    await other.close()
    await rt.close()
