"""What a TimerService keeps about a long run and a backlog: the timers it fired stay bounded,
and full garbage collections are made rarer only while a backlog drains (put back after)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from datetime import timedelta

import pytest

import loom
from loom.runtime import timers as timers_module
from loom.runtime.timers import BACKLOG_FULL_COLLECTION_THRESHOLD, TimerService, WakeOutcome
from loom.storage import InMemoryStore, Timer
from loom.testing import TimeSkippingEnvironment
from tests.runtime.test_timer_volume import T0, SetClock


@loom.flow(id="backlog-nap", version="1")
async def nap(ctx: loom.WorkflowContext, seconds: float) -> None:
    await ctx.sleep(timedelta(seconds=seconds))


@pytest.fixture(autouse=True)
def usual_thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


async def _schedule(store: InMemoryStore, prefix: str, n: int) -> None:
    for i in range(n):
        await store.schedule_timer(Timer(f"{prefix}{i:03d}", 0, T0, "sleep", "f"))


async def _fire(timer: Timer) -> WakeOutcome:
    await asyncio.sleep(0)
    return WakeOutcome.FIRED


async def test_fired_keeps_the_last_timers_only_and_counts_them_all() -> None:
    store = InMemoryStore()
    await _schedule(store, "k", 10)
    service = TimerService(store, _fire, clock=SetClock(T0), batch=4, keep_fired=3)
    assert await service.run_due() == 10
    assert service.fired_count == 10
    fired = service.fired
    assert len(fired) == 3
    assert {t.execution_id for t in fired} <= {f"k{i:03d}" for i in range(10)}
    fired.clear()  # a copy: the service's own record is untouched
    assert len(service.fired) == 3


async def test_time_skipping_counts_fired_timers_beyond_what_is_kept() -> None:
    env = TimeSkippingEnvironment()
    env.runtime.register(nap)
    env.timers._fired = type(env.timers._fired)(maxlen=0)  # keeps none: only the count tells
    handles = [await env.runtime.start(nap, 5.0) for _ in range(3)]
    for h in handles:
        await h.wait_for_suspend()
    assert await env.advance(10) == 3
    assert env.timers.fired == []
    await env.close()


async def test_full_collections_are_rarer_only_while_a_backlog_drains() -> None:
    store = InMemoryStore()
    seen: list[tuple[int, int, int]] = []

    async def note(timer: Timer) -> WakeOutcome:
        seen.append(gc.get_threshold())
        return await _fire(timer)

    # A claim that comes back short is no backlog: nothing changes.
    await _schedule(store, "a", 3)
    service = TimerService(store, note, clock=SetClock(T0), batch=10)
    assert await service.run_due() == 3
    assert set(seen) == {(700, 10, 10)}

    # Full claims: rarer full collections while they drain, the thresholds put back after.
    seen.clear()
    await _schedule(store, "b", 25)
    assert await service.run_due() == 25
    assert set(seen) == {(700, 10, BACKLOG_FULL_COLLECTION_THRESHOLD)}
    assert gc.get_threshold() == (700, 10, 10)


async def test_two_draining_services_put_the_thresholds_back_once_both_are_done() -> None:
    store = InMemoryStore()
    await _schedule(store, "c", 40)
    release = asyncio.Event()
    during: list[tuple[int, int, int]] = []

    async def held(timer: Timer) -> WakeOutcome:
        await release.wait()
        during.append(gc.get_threshold())
        return WakeOutcome.FIRED

    async def quick(timer: Timer) -> WakeOutcome:
        during.append(gc.get_threshold())
        return await _fire(timer)

    slow = TimerService(store, held, clock=SetClock(T0), batch=5, concurrency=1, owner="slow")
    fast = TimerService(store, quick, clock=SetClock(T0), batch=5, owner="fast")
    slow_run = asyncio.ensure_future(slow.run_due())
    await asyncio.sleep(0.05)  # the slow one holds its first claims
    assert await fast.run_due() > 0
    assert gc.get_threshold()[2] == BACKLOG_FULL_COLLECTION_THRESHOLD  # slow still drains
    release.set()
    await slow_run
    assert gc.get_threshold() == (700, 10, 10)
    assert set(during) == {(700, 10, BACKLOG_FULL_COLLECTION_THRESHOLD)}
    assert timers_module._gc_draining == 0


async def test_thresholds_someone_set_meanwhile_are_kept() -> None:
    store = InMemoryStore()
    await _schedule(store, "d", 6)

    async def retune(timer: Timer) -> WakeOutcome:
        gc.set_threshold(2000, 20, 20)  # the application's own choice, mid-drain
        return await _fire(timer)

    service = TimerService(store, retune, clock=SetClock(T0), batch=3)
    assert await service.run_due() == 6
    assert gc.get_threshold() == (2000, 20, 20)
