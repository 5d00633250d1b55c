"""Stopping timer serving: it returns (even right after a sleep kicked the service) and it sticks.

The rule: ``timers=True`` serves from first use until ``close()`` or an explicit
``stop_timers()``; ``timers=False`` serves only when asked.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import loom
from loom.model import ExecutionStatus
from loom.runtime._clock import SystemClock
from loom.runtime._lease import Heartbeat
from loom.runtime.timers import TimerService, WakeOutcome

# Rounds of stopping 0..TURNS-1 event-loop turns after a sleep kicked the service, so the stop
# lands at every step of the service's wake-up. Before the fix, on Python 3.11, a stop landing
# as ``asyncio.wait_for`` saw the kick was swallowed and the stop hung within the first rounds.
ROUNDS = 24
TURNS = 8
STORES = {
    "memory": lambda path: loom.InMemoryStore(),
    "sqlite": lambda path: loom.SQLiteStore(path),
}


@loom.flow(id="short-nap")
async def short_nap(ctx: loom.WorkflowContext) -> str:
    # Due within the service's poll interval, so scheduling it kicks the service.
    await ctx.sleep(0.5)
    return "woke"


@loom.flow(id="door", resume_schemas={"Open": dict})
async def door(ctx: loom.WorkflowContext) -> str:
    await ctx.suspend("Open")
    await ctx.sleep(0.5)
    return "through"


async def _turns(n: int) -> None:
    """Let the event loop run ``n`` times (positions the stop; it waits for nothing)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def _suspended_nap(rt: loom.WorkflowRuntime, execution_id: str) -> None:
    handle = await rt.start(short_nap, execution_id=execution_id)
    state = await handle.wait_for_suspend(timeout=10)
    assert state.status is ExecutionStatus.SUSPENDED


@pytest.mark.parametrize("kind", sorted(STORES))
async def test_stop_timers_returns_right_after_a_sleep_kicked_the_service(
    tmp_path: Path, kind: str
) -> None:
    async with loom.WorkflowRuntime(STORES[kind](tmp_path / "loom.db")) as rt:
        rt.register(short_nap)
        assert rt.timers is not None
        for i in range(ROUNDS):
            rt.start_timers()
            await rt.start(short_nap, execution_id=f"nap-{i}")  # its sleep kicks the service
            await _turns(i % TURNS)
            async with asyncio.timeout(10):  # a swallowed cancel hangs here
                await rt.stop_timers()
            assert not rt.timers.running, f"round {i}"


@pytest.mark.parametrize("kind", sorted(STORES))
async def test_close_returns_right_after_a_sleep_kicked_the_service(
    tmp_path: Path, kind: str
) -> None:
    for i in range(ROUNDS):
        rt = loom.WorkflowRuntime(STORES[kind](tmp_path / f"loom-{i}.db"))
        rt.register(short_nap)
        await rt.start(short_nap, execution_id="nap")
        assert rt.timers is not None and rt.timers.running  # first use started it
        await _turns(i % TURNS)
        async with asyncio.timeout(10):
            await rt.close()
        assert not rt.timers.running, f"round {i}"


async def test_an_explicit_stop_wins_over_the_automatic_start(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    rt = loom.WorkflowRuntime(loom.SQLiteStore(db))  # timers=True
    rt.register(door, short_nap)
    assert rt.timers is not None and not rt.timers.running  # nothing used it yet
    handle = await rt.start(door, execution_id="d1")
    assert rt.timers.running  # first use
    await handle.wait_for_suspend(timeout=10)
    await rt.stop_timers()
    assert not rt.timers.running

    # No later use restarts it: start, resume (whose flow then schedules a sleep), recover,
    # waiting on a handle or by id.
    await _suspended_nap(rt, "n1")
    assert not rt.timers.running
    after = await rt.resume("d1", "Open", {})
    state = await after.wait_for_suspend(timeout=10)
    assert state.waiting is not None and state.waiting.event_type == "loom.timer"
    assert not rt.timers.running
    await rt.recover("n1")
    assert not rt.timers.running
    assert (await rt.wait("n1", until="settled", timeout=5)).status is ExecutionStatus.SUSPENDED
    assert not rt.timers.running
    assert rt.timers.fired == []  # nothing served the sleeps meanwhile

    # Only an explicit start serves again, and then the sleeps wake.
    rt.start_timers()
    assert (await rt.wait("n1", timeout=20)).output == "woke"
    assert (await rt.wait("d1", timeout=20)).output == "through"
    await rt.close()


async def test_timers_false_serves_only_when_asked(tmp_path: Path) -> None:
    async with loom.WorkflowRuntime(loom.SQLiteStore(tmp_path / "loom.db"), timers=False) as rt:
        rt.register(short_nap)
        assert rt.timers is not None
        await _suspended_nap(rt, "n1")
        await rt.recover("n1")
        assert (await rt.wait("n1", until="settled", timeout=5)).status is (
            ExecutionStatus.SUSPENDED
        )
        assert not rt.timers.running
        async with rt.timers:
            assert (await rt.wait("n1", timeout=20)).output == "woke"
        assert not rt.timers.running


async def _swallow_a_cancel(waiting: asyncio.Event) -> None:
    """Set ``waiting``, wait until cancelled, and drop the cancel the way Python 3.11's
    ``asyncio.wait_for`` does when the awaited call completes as it lands (psycopg_pool's
    getconn waits so): not re-raised, and ``uncancel()`` not called, so the request stays."""
    waiting.set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        pass


class _SwallowingStore(loom.InMemoryStore):
    """Its first ``next_timer_due`` drops a cancel (see _swallow_a_cancel)."""

    def __init__(self) -> None:
        super().__init__()
        self.polling = asyncio.Event()
        self.swallowed = 0

    async def next_timer_due(self) -> float | None:
        if self.swallowed:
            await asyncio.Event().wait()  # later polls block, and a new cancel ends them
        await _swallow_a_cancel(self.polling)
        self.swallowed += 1
        return None


async def test_stop_ends_the_service_even_if_a_wait_under_it_swallowed_the_cancel() -> None:
    store = _SwallowingStore()

    async def wake(timer: loom.storage.Timer) -> WakeOutcome:
        raise AssertionError("no timer is due")

    service = TimerService(store, wake, poll_interval=0.01)
    service.start()
    async with asyncio.timeout(5):
        await store.polling.wait()
        # Before the fix the service went round again and stop() never returned.
        await service.stop()
    assert store.swallowed == 1
    assert not service.running


class _SwallowingClaims(loom.InMemoryStore):
    """Its first claim drops a cancel (see _swallow_a_cancel), then answers with its batch."""

    def __init__(self) -> None:
        super().__init__()
        self.claiming = asyncio.Event()
        self.claims = 0

    async def claim_due_timers(self, *args: Any, **kwargs: Any) -> list[loom.storage.Timer]:
        self.claims += 1
        if self.claims == 1:
            await _swallow_a_cancel(self.claiming)
        return await super().claim_due_timers(*args, **kwargs)


async def test_a_cancel_swallowed_by_a_claim_stops_the_drain_before_the_next_claim() -> None:
    store = _SwallowingClaims()
    for i in range(6):
        await store.schedule_timer(loom.storage.Timer(f"e{i}", 1, 0.0, "sleep", "f"))
    woken: list[str] = []

    async def wake(timer: loom.storage.Timer) -> WakeOutcome:
        woken.append(timer.execution_id)
        return WakeOutcome.FIRED

    service = TimerService(store, wake, batch=2)
    draining = asyncio.create_task(service.run_due())
    async with asyncio.timeout(10):
        await store.claiming.wait()
        draining.cancel()
        with pytest.raises(asyncio.CancelledError):
            await draining
    # Before the fix it claimed on, and woke every timer after the cancel.
    assert store.claims == 1
    assert len(woken) <= 2


class _SwallowingRenewals(loom.InMemoryStore):
    """Its first lease renewal drops a cancel (see _swallow_a_cancel)."""

    def __init__(self) -> None:
        super().__init__()
        self.renewing = asyncio.Event()
        self.renewals = 0

    async def renew_lease(self, execution_id: str, **kwargs: Any) -> bool:
        self.renewals += 1
        if self.renewals == 1:
            await _swallow_a_cancel(self.renewing)
        return await super().renew_lease(execution_id, **kwargs)


class _Driving:
    """Only what the heartbeat reads of a driver (the logic above the store is under test)."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.fenced_out = None
        self.deferred = None
        self.fence = 1
        self.state = SimpleNamespace(execution_id="e", status=ExecutionStatus.RUNNING)


async def test_stopping_the_lease_heartbeat_ends_it_even_if_a_renewal_swallowed_the_cancel() -> (
    None
):
    store = _SwallowingRenewals()
    heartbeat = Heartbeat(store, SystemClock(), ttl=0.03)
    await heartbeat.begin(_Driving())  # type: ignore[arg-type]
    async with asyncio.timeout(5):  # before the fix: renewed on, and stop() never returned
        await store.renewing.wait()
        await heartbeat.stop()
    assert store.renewals == 1
