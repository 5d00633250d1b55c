from __future__ import annotations

import asyncio
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pydantic
import pytest

import loom
from loom.errors import ExecutionCancelledError, GateTimedOutError
from loom.model import EventType, ExecutionStatus
from loom.placement import LocalDispatcher, LocalWorkerRuntime, dispatching_timer_service
from loom.runtime import WakeOutcome
from loom.storage import InMemoryStore, SQLiteStore, TimerStore
from loom.testing import TIMER_CHECKS, SkippingClock, TimeSkippingEnvironment
from tests.conftest import Backend
from tests.support.flows import EffectLedger
from tests.support.proc import run_child


@pytest.mark.parametrize("check", sorted(TIMER_CHECKS))
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_timer_store_conformance(check: str, kind: str, tmp_path: Path) -> None:
    store: Any = InMemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "t.db")
    assert isinstance(store, TimerStore)
    try:
        await TIMER_CHECKS[check](store)
    finally:
        await store.close()


class Decision(pydantic.BaseModel):
    approved: bool


ran: list[str] = []


@loom.step(id="record")
async def record(what: str) -> str:
    ran.append(what)
    return what


@loom.flow(id="month-long", version="1")
async def month_long(ctx: loom.WorkflowContext) -> str:
    await ctx.run(record, "before")
    await ctx.sleep(timedelta(days=30))
    return await ctx.run(record, "after")


@loom.flow(id="gated", version="1", resume_schemas={"Approve": Decision})
async def gated(ctx: loom.WorkflowContext) -> str:
    try:
        decision = await ctx.suspend("Approve", timeout=timedelta(days=1))
    except GateTimedOutError:
        return "timed out"
    return "approved" if decision.approved else "rejected"


@pytest.fixture
async def env(backend: Backend) -> Any:
    ran.clear()
    e = TimeSkippingEnvironment(backend.store())
    e.runtime.register(month_long, gated)
    yield e
    await e.close()


async def test_a_30_day_sleep_completes_in_virtual_time(env: TimeSkippingEnvironment) -> None:
    started = time.perf_counter()
    t0 = env.clock.now()
    handle = await env.runtime.start(month_long, execution_id="m")
    state = await handle.settled()
    assert state.status is ExecutionStatus.SUSPENDED and ran == ["before"]
    assert await env.result(handle) == "after"
    assert env.clock.now() - t0 >= 30 * 86400
    assert time.perf_counter() - started < 5  # functional bound: no real waiting happened
    assert ran == ["before", "after"]
    types = [e.type for e in await env.runtime.store.read("m")]
    assert types.count(EventType.TIMER_SCHEDULED) == 1 and types.count(EventType.TIMER_FIRED) == 1


async def test_gate_timeout_path_and_late_approval(env: TimeSkippingEnvironment) -> None:
    handle = await env.runtime.start(gated, execution_id="g")
    await handle.wait_for_suspend()
    assert await env.advance(timedelta(hours=23)) == 0  # never early
    assert await env.advance(timedelta(hours=1)) == 1
    assert await env.runtime.handle("g").result() == "timed out"
    fired = [e for e in await env.runtime.store.read("g") if e.type is EventType.TIMER_FIRED]
    assert len(fired) == 1 and fired[0].payload["timed_out"] is True
    before = [e.checksum() for e in await env.runtime.store.read("g")]
    with pytest.raises(GateTimedOutError, match="timed out"):
        await env.runtime.resume("g", "Approve", {"approved": True})
    assert [e.checksum() for e in await env.runtime.store.read("g")] == before


async def test_gate_approval_path_beats_the_timeout(env: TimeSkippingEnvironment) -> None:
    handle = await env.runtime.start(gated, execution_id="g2")
    await handle.wait_for_suspend()
    await env.advance(timedelta(hours=12))
    done = await env.runtime.resume("g2", "Approve", {"approved": True})
    assert await done.result() == "approved"
    log = await env.runtime.store.read("g2")
    assert await env.advance(timedelta(days=2)) == 0  # the timer finds nothing waiting
    assert await env.runtime.store.read("g2") == log
    assert await env.timers.store.next_timer_due() is None


async def test_approval_at_the_deadline_is_refused_before_the_timer_fires() -> None:
    clock = SkippingClock()
    rt = loom.WorkflowRuntime(InMemoryStore(), clock=clock, timers=False)
    rt.register(gated)
    await (await rt.start(gated, execution_id="edge")).wait_for_suspend()
    clock.advance(86400)
    with pytest.raises(GateTimedOutError):
        await rt.resume("edge", "Approve", {"approved": True})
    await rt.close()


async def test_a_timer_fires_once_and_never_early() -> None:
    clock = SkippingClock()
    rt = loom.WorkflowRuntime(InMemoryStore(), clock=clock, timers=False)
    rt.register(month_long)
    await (await rt.start(month_long, execution_id="once")).settled()
    state = await rt.load_state("once")
    assert state is not None and state.waiting is not None
    pos = state.waiting.position
    outcome, _ = await rt.fire_timer("once", pos)
    assert outcome is WakeOutcome.EARLY
    clock.advance(30 * 86400)
    results = await asyncio.gather(*(rt.fire_timer("once", pos) for _ in range(5)))
    assert sorted(o.value for o, _ in results) == ["fired"] + ["stale"] * 4
    await rt.handle("once").result(timeout=10)
    types = [e.type for e in await rt.store.read("once")]
    assert types.count(EventType.TIMER_FIRED) == 1
    await rt.close()


async def test_cancel_clears_timers_and_nothing_runs_after(env: TimeSkippingEnvironment) -> None:
    handle = await env.runtime.start(month_long, execution_id="c")
    await handle.settled()
    state = await env.runtime.cancel("c", reason="no longer needed")
    assert state.status is ExecutionStatus.CANCELLED
    assert await env.timers.store.next_timer_due() is None
    assert await env.advance(timedelta(days=31)) == 0
    assert ran == ["before"]
    with pytest.raises(ExecutionCancelledError):
        await env.runtime.handle("c").result()


async def test_cancel_racing_a_running_step(backend: Backend) -> None:
    """The holder's step completes after the cancel: its record is refused by the fence."""
    release = asyncio.Event()
    entered = asyncio.Event()
    later: list[str] = []

    @loom.step(id="slow")
    async def slow() -> str:
        entered.set()
        await release.wait()
        return "slow"

    @loom.step(id="later")
    async def later_step() -> str:
        later.append("ran")
        return "later"

    @loom.flow(id="cancellable", version="1")
    async def cancellable(ctx: loom.WorkflowContext) -> str:
        await ctx.run(slow)
        return await ctx.run(later_step)

    holder = loom.WorkflowRuntime(backend.store())
    operator = loom.WorkflowRuntime(backend.store())
    for rt in (holder, operator):
        rt.register(cancellable)
    handle = await holder.start(cancellable, execution_id="race")
    await entered.wait()
    state = await operator.cancel("race", reason="operator")
    assert state.status is ExecutionStatus.CANCELLED
    release.set()
    with pytest.raises(ExecutionCancelledError):
        await handle.result(timeout=10)
    log = await operator.store.read("race")
    assert log[-1].type is EventType.EXECUTION_CANCELLED
    assert not any(e.type is EventType.STEP_COMPLETED for e in log)
    assert later == []
    await holder.close()
    await operator.close()


async def test_dispatching_timer_service_wakes_each_execution_once(backend: Backend) -> None:
    clock = SkippingClock()
    store = backend.store()
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False)
    rt.register(month_long)
    ids = [f"s{i}" for i in range(20)]
    handles = await asyncio.gather(*(rt.start(month_long, execution_id=i) for i in ids))
    await asyncio.gather(*(h.settled() for h in handles))
    service = dispatching_timer_service(store, LocalDispatcher(LocalWorkerRuntime(rt)), clock=clock)
    assert await service.run_due() == 0
    clock.advance(30 * 86400)
    assert await service.run_due() == 20
    assert sorted(t.execution_id for t in service.fired) == sorted(ids)
    for i in ids:
        assert await rt.handle(i).result(timeout=10) == "after"
        types = [e.type for e in await store.read(i)]
        assert types.count(EventType.TIMER_FIRED) == 1
    assert await service.run_due() == 0
    await rt.close()


def test_timer_survives_sigkill_and_fires_once_in_a_new_process(tmp_path: Path) -> None:
    db, ledger = tmp_path / "timers.db", tmp_path / "effects.db"
    env = {"LOOM_TEST_LEDGER": str(ledger)}
    faults = {"LOOM_FAULTS": "after_suspend_recorded=kill"}
    setter = run_child("timer", "set", db, "nap", env={**env, **faults}, timeout=60)
    assert setter.returncode == -signal.SIGKILL, setter.stderr
    firer = run_child("timer", "fire", db, "nap", env=env, timeout=60)
    assert firer.returncode == 0, firer.stderr
    assert firer.stdout.strip() == "woke"
    assert EffectLedger(ledger).counts("nap") == {"after-sleep": 1}

    async def check() -> None:
        store = SQLiteStore(db)
        types = [e.type for e in await store.read("nap")]
        await store.close()
        assert types.count(EventType.TIMER_FIRED) == 1
        assert types[-1] is EventType.EXECUTION_COMPLETED

    asyncio.run(check())
