"""Races found in review, each pinned by a deterministic test (events, no timers)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pydantic
import pytest

import loom
from loom.errors import (
    ExecutionCancelledError,
    NonDeterminismError,
    NotWaitingError,
    RuntimeClosedError,
    StorageError,
)
from loom.model import ExecutionStatus
from loom.placement import LocalDispatcher, LocalWorkerRuntime, dispatching_timer_service
from loom.runtime import WakeOutcome
from loom.runtime._driver import SUSPEND_SNAPSHOT_MIN_EVENTS
from loom.storage import SQLiteStore, Store, Timer
from loom.testing import SkippingClock


class Decision(pydantic.BaseModel):
    ok: bool


class Shape(pydantic.BaseModel):
    rows: int


class SlowFenceRead:
    """A store view whose next current_fence() waits until another append has landed: it
    makes this caller's view of a waiting execution stale, the way a slow round trip does."""

    def __init__(self, inner: Store, execution_id: str, after: int) -> None:
        self.inner = inner
        self.execution_id = execution_id
        self.after = after
        self.armed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def current_fence(self, execution_id: str) -> int:
        if self.armed:
            self.armed = False
            await self.inner.wait_for_append(self.execution_id, self.after, timeout=30)
        return int(await self.inner.current_fence(execution_id))


def gated_flow(effects: list[str], release: asyncio.Event | None = None) -> loom.Flow[Any, str]:
    @loom.step(id="after-gate")
    async def after_gate() -> str:
        effects.append("after-gate")
        if release is not None:
            await release.wait()
        return "done"

    @loom.flow(id="gated", version="1", resume_schemas={"Go": Decision})
    async def gated(ctx: loom.WorkflowContext) -> str:
        await ctx.suspend("Go", timeout=3600)
        return await ctx.run(after_gate)

    return gated


async def test_a_losing_resume_never_fences_out_the_winner(tmp_path: Path) -> None:
    effects: list[str] = []
    release = asyncio.Event()
    store = SQLiteStore(tmp_path / "r.db")
    winner = loom.WorkflowRuntime(store)
    winner.register(gated_flow(effects, release))
    await (await winner.start("gated", execution_id="g")).wait_for_suspend()
    suspended_at = await store.last_sequence("g")
    loser = loom.WorkflowRuntime(SlowFenceRead(store, "g", suspended_at))  # type: ignore[arg-type]
    loser.register(gated_flow(effects))
    losing = asyncio.ensure_future(loser.resume("g", "Go", {"ok": False}))
    await asyncio.sleep(0)  # the loser has read the suspended state and waits on its fence
    handle = await winner.resume("g", "Go", {"ok": True})
    with pytest.raises(NotWaitingError):
        await losing
    release.set()
    assert await handle.result(timeout=10) == "done"  # not superseded by the loser
    assert effects == ["after-gate"]
    assert await store.current_fence("g") == 2  # the start's fence + the winner's take-over
    await winner.close()


def held_sleeper(flow_id: str, gate: asyncio.Event) -> loom.Flow[Any, str]:
    """A flow whose step 0 waits on ``gate`` and whose position 1 is a durable sleep: a test
    can store position 1's timer while the wait is not logged yet."""

    @loom.step(id="hold")
    async def hold() -> None:
        await gate.wait()

    @loom.flow(id=flow_id, version="1")
    async def sleeper(ctx: loom.WorkflowContext) -> str:
        await ctx.run(hold)
        await ctx.sleep(5)
        return "woke"

    return sleeper


async def test_a_timer_stored_before_its_wait_is_logged_is_not_lost() -> None:
    clock = SkippingClock()
    rt = loom.WorkflowRuntime(loom.InMemoryStore(), clock=clock, timers=False)
    gate = asyncio.Event()
    sleeper = held_sleeper("sleeper", gate)
    rt.register(sleeper)
    handle = await rt.start(sleeper, execution_id="s")
    # The timer of position 1 is stored but its wait is not in the log yet (the holder is
    # still in step 0): a wake then must not consume it.
    assert rt.timers is not None
    await rt.timers.store.schedule_timer(Timer("s", 1, clock.now(), "sleep", "sleeper"))
    assert (await rt.fire_timer("s", 1))[0] is WakeOutcome.EARLY
    await rt.timers.run_due()
    assert await rt.timers.store.next_timer_due() is not None  # handed back, not deleted
    gate.set()
    state = await handle.settled(timeout=10)
    assert state.status is ExecutionStatus.SUSPENDED
    clock.advance(10)
    await rt.timers.run_due()
    assert await rt.handle("s").result(timeout=10) == "woke"
    await rt.close()


async def test_a_stale_timer_wake_never_takes_over_a_live_execution(tmp_path: Path) -> None:
    effects: list[str] = []
    release = asyncio.Event()
    clock = SkippingClock()
    store = SQLiteStore(tmp_path / "t.db")
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False)
    rt.register(gated_flow(effects, release))
    await (await rt.start("gated", execution_id="g")).wait_for_suspend()
    live = await rt.resume("g", "Go", {"ok": True})  # approved in time; its step is running
    while effects != ["after-gate"]:
        await asyncio.sleep(0)
    clock.advance(7200)  # the gate's timeout timer comes due while the step runs
    service = dispatching_timer_service(store, LocalDispatcher(LocalWorkerRuntime(rt)), clock=clock)
    await service.run_due()
    release.set()
    assert await live.result(timeout=10) == "done"
    assert effects == ["after-gate"]
    state = await rt.load_state("g")
    assert state is not None and state.recoveries == 0
    assert service.fired == []
    await rt.close()


async def test_a_replayed_value_the_code_cannot_read_is_non_determinism() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore())

    @loom.step(id="count")
    async def count() -> int:
        return 7

    @loom.flow(id="typed", version="1")
    async def typed(ctx: loom.WorkflowContext) -> int:
        n = await ctx.run(count)
        await ctx.suspend("Go")
        return n

    rt.register(typed)
    await (await rt.start(typed, execution_id="t")).wait_for_suspend()

    @loom.step(id="count")
    async def count_v2() -> Shape:  # deployed under a running execution
        return Shape(rows=7)

    @loom.flow(id="typed", version="1")
    async def typed_v2(ctx: loom.WorkflowContext) -> int:
        shape = await ctx.run(count_v2)
        await ctx.suspend("Go")
        return shape.rows

    rt2 = loom.WorkflowRuntime(rt.store)
    rt2.register(typed_v2)
    with pytest.raises(NonDeterminismError, match="no longer matches"):
        await (await rt2.resume("t", "Go", None)).result(timeout=10)
    state = await rt2.load_state("t")
    assert state is not None and state.status is ExecutionStatus.RUNNING  # not failed
    await rt.close()


async def test_cancel_reaches_waiters_as_execution_cancelled() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore())
    entered = asyncio.Event()

    @loom.step(id="forever")
    async def forever() -> None:
        entered.set()
        await asyncio.Event().wait()

    @loom.flow(id="stuck", version="1")
    async def stuck(ctx: loom.WorkflowContext) -> None:
        await ctx.run(forever)

    rt.register(stuck)
    handle = await rt.start(stuck, execution_id="c")
    waiter = asyncio.ensure_future(handle.result(timeout=10))
    await entered.wait()
    await rt.cancel("c", reason="stop")
    with pytest.raises(ExecutionCancelledError):
        await waiter
    assert not waiter.cancelled()
    await rt.close()


async def test_close_stops_replaced_drivers_too(tmp_path: Path) -> None:
    entered = asyncio.Event()

    @loom.step(id="wedge")
    async def wedge() -> None:
        if not entered.is_set():
            entered.set()
            await asyncio.Event().wait()  # the first attempt wedges

    @loom.flow(id="wedged", version="1")
    async def wedged(ctx: loom.WorkflowContext) -> None:
        await ctx.run(wedge)

    rt = loom.WorkflowRuntime(SQLiteStore(tmp_path / "w.db"))
    rt.register(wedged)
    first = await rt.start(wedged, execution_id="w")
    await entered.wait()
    second = await rt.recover("w", holder=await rt.acquire_lease("w"))
    await second.result(timeout=10)
    with pytest.raises(loom.ExecutionSupersededError):
        await first.result(timeout=10)  # the replaced driver was stopped, not leaked
    await rt.close()
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("loom:")]


async def test_closing_the_runtime_is_a_typed_error_for_waiters() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore())

    @loom.step(id="block")
    async def block() -> None:
        await asyncio.Event().wait()

    @loom.flow(id="blocked", version="1")
    async def blocked(ctx: loom.WorkflowContext) -> None:
        await ctx.run(block)

    rt.register(blocked)
    handle = await rt.start(blocked, execution_id="b")
    waiter = asyncio.ensure_future(handle.result(timeout=10))
    await asyncio.sleep(0)
    await rt.close()
    with pytest.raises(RuntimeClosedError):
        await waiter


async def test_a_flow_that_swallows_its_fencing_runs_no_more_effects(tmp_path: Path) -> None:
    ran: list[int] = []
    entered = asyncio.Event()
    release = asyncio.Event()

    @loom.step(id="effect")
    async def effect(i: int) -> int:
        ran.append(i)
        if i == 0:
            entered.set()
            await release.wait()
        return i

    @loom.flow(id="swallower", version="1")
    async def swallower(ctx: loom.WorkflowContext) -> str:
        for i in range(3):
            try:
                await ctx.run(effect, i)
            except Exception:  # a careless flow
                pass
        return "done"

    db = tmp_path / "s.db"
    holder = loom.WorkflowRuntime(SQLiteStore(db))
    holder.register(swallower)
    handle = await holder.start(swallower, execution_id="s")
    await entered.wait()
    await SQLiteStore(db).acquire_fence("s")  # another holder takes over
    release.set()
    with pytest.raises(loom.ExecutionSupersededError):
        await handle.result(timeout=10)
    assert ran == [0]  # steps 1 and 2 never ran their effects
    await holder.close()


async def test_reads_after_close_are_typed(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "c.db")
    await store.last_sequence("x")
    await store.close()
    with pytest.raises(StorageError):
        await store.last_sequence("x")


def test_cli_refuses_hostile_json_with_a_typed_error(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from loom.cli import app

    for data in ("9" * 5000, "[" * 5000):
        out = CliRunner().invoke(
            app, ["resume", "x", "Go", "--data", data, "--db", str(tmp_path / "d.db"), "--json"]
        )
        assert out.exit_code == 1
        assert json.loads(out.stdout)["error"]["code"] == "payload"


# ---------------------------------------------------------------- second review


async def test_a_dispatched_wake_never_drops_a_timer_whose_wait_is_not_logged() -> None:
    clock = SkippingClock()
    store = loom.InMemoryStore()
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False)
    gate = asyncio.Event()
    sleeper2 = held_sleeper("sleeper2", gate)
    rt.register(sleeper2)
    handle = await rt.start(sleeper2, execution_id="d")
    await store.schedule_timer(Timer("d", 1, clock.now(), "sleep", "sleeper2"))
    service = dispatching_timer_service(store, LocalDispatcher(LocalWorkerRuntime(rt)), clock=clock)
    await service.run_due()
    assert await store.next_timer_due() is not None  # handed back, not deleted
    gate.set()
    await handle.settled(timeout=10)
    clock.advance(10)
    await service.run_due()
    assert await rt.handle("d").result(timeout=10) == "woke"
    await rt.close()


async def test_a_duplicate_resume_package_never_takes_over_the_live_holder(
    tmp_path: Path,
) -> None:
    from loom.placement import ExecutionPackage, ResumeEvent

    effects: list[str] = []
    release = asyncio.Event()
    rt = loom.WorkflowRuntime(SQLiteStore(tmp_path / "dup.db"))
    rt.register(gated_flow(effects, release))
    dispatcher = LocalDispatcher(LocalWorkerRuntime(rt))
    start = ExecutionPackage(execution_id="g", flow_id="gated")
    assert (await dispatcher.dispatch(start)).status is ExecutionStatus.SUSPENDED
    resume = ExecutionPackage(
        execution_id="g", flow_id="gated", resume_event=ResumeEvent("Go", {"ok": True})
    )
    first = asyncio.ensure_future(dispatcher.dispatch(resume))
    while effects != ["after-gate"]:
        await asyncio.sleep(0)
    duplicate = await dispatcher.dispatch(resume)  # e.g. a double-clicked approval
    assert duplicate.status is ExecutionStatus.RUNNING  # reported, nothing taken over
    release.set()
    assert (await first).status is ExecutionStatus.COMPLETED
    assert effects == ["after-gate"]
    await rt.close()


async def test_a_sleep_cannot_be_resumed_early() -> None:
    clock = SkippingClock()
    rt = loom.WorkflowRuntime(loom.InMemoryStore(), clock=clock, timers=False)

    @loom.flow(id="nap", version="1")
    async def nap(ctx: loom.WorkflowContext) -> None:
        await ctx.sleep(30 * 86400)

    rt.register(nap)
    await (await rt.start(nap, execution_id="n")).settled(timeout=10)
    with pytest.raises(NotWaitingError, match="durable sleep"):
        await rt.resume("n", "loom.timer", None)
    await rt.close()


@pytest.mark.parametrize("bad", ["a\\ud800b", "", "x" * 300, "tab\\there"])
async def test_every_entry_point_refuses_bad_ids_with_a_typed_error(
    bad: str, tmp_path: Path
) -> None:
    bad = bad.encode().decode("unicode_escape", "surrogatepass")
    rt = loom.WorkflowRuntime(SQLiteStore(tmp_path / "ids.db"))
    for call in (
        rt.load_state(bad),
        rt.recover(bad),
        rt.cancel(bad),
        rt.resume(bad, "Go", None),
        rt.fire_timer(bad, 0),
    ):
        with pytest.raises(loom.LoomError):
            await call
    await rt.close()


async def test_an_unstorable_flow_output_fails_the_execution() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore())

    @loom.flow(id="huge", version="1")
    async def huge(ctx: loom.WorkflowContext) -> str:
        return "x" * 2_000_000

    rt.register(huge)
    with pytest.raises(loom.ExecutionFailedError, match="limit"):
        await (await rt.start(huge, execution_id="h")).result(timeout=10)
    state = await rt.load_state("h")
    assert state is not None and state.status is ExecutionStatus.FAILED
    await rt.close()


class SlowSnapshots:
    """A store view whose first snapshot write waits for a signal."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def save_snapshot(self, snapshot: Any) -> None:
        if not self.entered.is_set():
            self.entered.set()
            await self.release.wait()
        await self.inner.save_snapshot(snapshot)


async def test_a_resume_while_the_suspending_driver_finishes_up_is_followed() -> None:
    store = SlowSnapshots(loom.InMemoryStore())
    rt = loom.WorkflowRuntime(store, timers=False)  # type: ignore[arg-type]

    @loom.step(id="tick")
    async def tick(i: int) -> int:
        return i

    @loom.flow(id="asks", version="1", resume_schemas={"Go": Decision})
    async def asks(ctx: loom.WorkflowContext) -> str:
        # A log long enough that its suspension writes a snapshot (a short one folds instead).
        for i in range(SUSPEND_SNAPSHOT_MIN_EVENTS):
            await ctx.run(tick, i)
        decision = await ctx.suspend("Go")
        return f"got {decision.ok}"

    rt.register(asks)
    started = await rt.start(asks, execution_id="a")
    await asyncio.wait_for(
        store.entered.wait(), 10
    )  # SUSPENDED is durable; the driver is writing its snapshot
    resumed = await rt.resume("a", "Go", {"ok": True})
    store.release.set()
    assert await resumed.result(timeout=10) == "got True"
    assert await started.result(timeout=10) == "got True"  # not a spurious supersession
    await rt.close()
