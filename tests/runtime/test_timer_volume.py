"""Timers at volume: batched claims and grouped settling keep "never early, each once".

Hundreds of executions sleep until the same instants; TimerServices claim them in batches,
wake them with bounded concurrency and delete the fired rows in grouped writes. On SQLite and
PostgreSQL (and memory) through the root ``backend`` fixture. Correctness only: the speed is
measured by ``bench/timers.py``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

import loom
from loom.model import EventType, ExecutionStatus
from loom.runtime.timers import TimerService, WakeOutcome
from loom.storage import ExecutionQuery, LoadsMany, Store, Timer, TimerStore
from tests.conftest import Backend
from tests.support.poll import until

T0 = 1_000_000.0  # the instant most timers are due at (the tests' own clock)


class SetClock:
    """A clock the test moves by hand: nothing is due until the test says so."""

    def __init__(self, now: float) -> None:
        self.t = now

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)


@loom.flow(id="volume-nap", version="1")
async def nap(ctx: loom.WorkflowContext, when: float) -> float:
    await ctx.sleep_until(when)
    return when


def _timer_store(store: Store) -> TimerStore:
    assert isinstance(store, TimerStore)
    return store


async def _asleep(rt: loom.WorkflowRuntime, plan: dict[str, float]) -> None:
    ids = list(plan)
    for chunk in range(0, len(ids), 100):
        handles = await asyncio.gather(
            *(rt.start(nap, plan[i], execution_id=i) for i in ids[chunk : chunk + 100])
        )
        await asyncio.gather(*(h.settled() for h in handles))


async def _completed(store: Store) -> int:
    return await store.count_executions(
        ExecutionQuery(statuses=[ExecutionStatus.COMPLETED], flow_id=nap.id)
    )


async def _fired_times(store: Store, eid: str) -> list[float]:
    return [e.recorded_at for e in await store.read(eid) if e.type is EventType.TIMER_FIRED]


async def test_a_batch_fires_only_what_is_due_and_each_once(backend: Backend) -> None:
    # 300 due at T0 and 100 due 10 s later, claimed 64 at a time with 16 wakes at once: the
    # first pass fires exactly the 300 (none early), the second the rest; none twice.
    clock = SetClock(T0 - 5)
    store = backend.store()
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False)
    rt.register(nap)
    plan = {f"v{i:03d}": T0 for i in range(300)} | {f"w{i:03d}": T0 + 10 for i in range(100)}
    await _asleep(rt, plan)
    assert rt.timers is not None
    rt.timers.batch, rt.timers.concurrency = 64, 16

    assert await rt.timers.run_due() == 0  # nothing is due yet
    clock.t = T0
    assert await rt.timers.run_due() == 300
    await until(lambda: _all_done(store, 300), "300 completed", timeout=60)
    assert await _completed(store) == 300
    for eid, when in plan.items():
        fired = await _fired_times(store, eid)
        if when == T0:
            assert len(fired) == 1 and fired[0] >= when, (eid, fired)
        else:
            assert fired == [], (eid, fired)  # due later: not fired early
    assert await _timer_store(store).next_timer_due() == T0 + 10  # the fired rows are gone

    clock.t = T0 + 10
    assert await rt.timers.run_due() == 100
    await until(lambda: _all_done(store, 400), "all 400 completed", timeout=60)
    for eid, when in plan.items():
        fired = await _fired_times(store, eid)
        assert len(fired) == 1 and fired[0] >= when, (eid, fired)
    assert await _timer_store(store).next_timer_due() is None
    assert sorted(t.execution_id for t in rt.timers.fired) == sorted(plan)
    await rt.close()


async def _all_done(store: Store, n: int) -> bool:
    return await _completed(store) >= n


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
async def test_two_services_racing_over_500_timers_fire_each_once(backend: Backend) -> None:
    # Two runtimes, each over its own store handle (its own connection or pool, as two
    # processes have), claim from the same 500 due timers at once.
    n = 500
    clock = SetClock(T0 - 5)
    plan = {f"r{i:03d}": T0 for i in range(n)}
    starter = loom.WorkflowRuntime(backend.store(), clock=clock, timers=False)
    starter.register(nap)
    await _asleep(starter, plan)
    racers = [loom.WorkflowRuntime(backend.store(), clock=clock, timers=False) for _ in range(2)]
    services: list[TimerService] = []
    for rt in racers:
        rt.register(nap)
        assert rt.timers is not None
        rt.timers.batch = 50  # small claims, so the two interleave
        services.append(rt.timers)
    clock.t = T0
    claimed = await asyncio.gather(*(s.run_due() for s in services))
    assert sum(claimed) == n, claimed  # a claim is exclusive: nothing handed out twice

    store = starter.store
    await until(lambda: _all_done(store, n), f"{n} completed", timeout=120)
    fired = Counter(t.execution_id for s in services for t in s.fired)
    assert sorted(fired) == sorted(plan) and set(fired.values()) == {1}
    logs = await asyncio.gather(*(store.read(eid) for eid in plan))
    for eid, log in zip(plan, logs, strict=True):
        types = [e.type for e in log]
        assert types.count(EventType.TIMER_FIRED) == 1, (eid, types)
        assert types[-1] is EventType.EXECUTION_COMPLETED, (eid, types)
    assert await _timer_store(store).next_timer_due() is None
    for rt in [starter, *racers]:
        await rt.close()


class _FailingSettle:
    """A store whose grouped deletion fails (a crash after the wakes, before the delete)."""

    def __init__(self, store: TimerStore) -> None:
        self.store = store
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def complete_timers(self, timers: Sequence[Timer]) -> None:
        self.failed += len(timers)
        raise OSError("the disk went away")


async def test_a_crash_mid_batch_loses_no_timer_and_fires_none_twice(backend: Backend) -> None:
    # A service dies holding claims: one claims 100 timers and never wakes them; another wakes
    # 100 more but its deletion of the fired rows fails. After the leases expire, a healthy
    # service fires the unwoken ones once and finds the woken ones stale.
    clock = SetClock(T0 - 5)
    store = backend.store()
    timers = _timer_store(store)
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False)
    rt.register(nap)
    plan = {f"c{i:03d}": T0 for i in range(250)}
    await _asleep(rt, plan)
    clock.t = T0

    dead = await timers.claim_due_timers(T0, owner="dead", lease=30, limit=100)
    assert len(dead) == 100
    failing = _FailingSettle(timers)
    half = TimerService(
        failing,  # type: ignore[arg-type]
        rt._wake_locally,
        clock=clock,
        lease=30,
        batch=100,
    )
    claimed = await half.run_due()
    assert claimed == 150 and failing.failed == 150  # the rest, woken; their deletion failed
    await until(lambda: _all_done(store, 150), "150 completed", timeout=60)

    assert rt.timers is not None
    assert await rt.timers.run_due() == 0  # every timer is claimed until the leases expire
    clock.t = T0 + 31
    assert await rt.timers.run_due() == 250
    await until(lambda: _all_done(store, 250), "250 completed", timeout=60)
    outcomes = Counter(t.execution_id for t in rt.timers.fired)
    assert sorted(outcomes) == sorted(t.execution_id for t in dead)  # only the unwoken fired
    for eid in plan:
        fired = await _fired_times(store, eid)
        assert len(fired) == 1 and fired[0] >= T0, (eid, fired)
    assert await timers.next_timer_due() is None
    await rt.close()


async def test_a_stale_wake_is_settled_in_the_same_grouped_write(backend: Backend) -> None:
    # A wake that finds its wait already ended (STALE) deletes the timer like a fired one.
    store = backend.store()
    timers = _timer_store(store)
    for i in range(40):
        await timers.schedule_timer(Timer(f"s{i:02d}", 0, T0, "sleep", "f"))

    async def stale(timer: Timer) -> WakeOutcome:
        await asyncio.sleep(0)
        return WakeOutcome.STALE

    service = TimerService(timers, stale, clock=SetClock(T0), batch=7, concurrency=3)
    assert await service.run_due() == 40
    assert service.fired == []
    assert await timers.next_timer_due() is None


async def test_a_batch_read_before_half_its_waits_ended_elsewhere_fires_each_once(
    backend: Backend,
) -> None:
    # The runtime's service reads a claimed batch's states at once (where the store
    # LoadsMany) before taking them over (in one write, where it TakesOverMany). Here another
    # runtime ends half of those waits in between: a state read with the batch may only lead
    # to a take-over, which then loses (the fence moved), and the wake decides again on a
    # fresh read. Each wait ends once, and only the half whose batch-read state was still
    # current is woken without another read.
    clock = SetClock(T0 - 5)
    store = backend.store()
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False)
    rt.register(nap)
    plan = {f"h{i:03d}": T0 for i in range(120)}
    await _asleep(rt, plan)
    other = loom.WorkflowRuntime(backend.store(), clock=clock, timers=False)
    other.register(nap)
    ended_elsewhere: list[str] = []

    # By id, for every batch: the service prepares the next batch while the last one's
    # take-over is written, so two batches' reads may be under way at once.
    claimed: dict[str, Timer] = {}

    async def interfere(ids: Sequence[str]) -> None:
        for timer in [claimed[eid] for eid in ids][::2]:  # half of the batch's waits end elsewhere
            outcome, _ = await other.fire_timer(timer.execution_id, timer.position)
            assert outcome is WakeOutcome.FIRED
            ended_elsewhere.append(timer.execution_id)

    if isinstance(store, LoadsMany):
        read_many = store.load_many

        async def read_then_interfere(ids: Sequence[str]) -> Any:
            read = await read_many(ids)  # the batch's states are read now...
            await interfere(ids)  # ...and half of them move before the batch's take-over
            return read

        store.load_many = read_then_interfere  # type: ignore[method-assign]

    async def prepare(due: Sequence[Timer]) -> Any:
        claimed.update((t.execution_id, t) for t in due)
        decided = await rt._prepare_wakes(due)
        if not isinstance(store, LoadsMany):
            await interfere([t.execution_id for t in due])  # every wake reads its own
        return decided

    loads: list[str] = []
    load = rt._load

    async def counted_load(execution_id: str, **kw: Any) -> Any:
        loads.append(execution_id)
        return await load(execution_id, **kw)

    rt._load = counted_load  # type: ignore[method-assign]
    clock.t = T0
    service = TimerService(
        _timer_store(store),
        rt._wake_locally,
        clock=clock,
        batch=40,
        concurrency=8,
        prepare=prepare,
    )
    assert await service.run_due() == len(plan)
    await until(lambda: _all_done(store, len(plan)), "all completed", timeout=60)
    woken_here = sorted(t.execution_id for t in service.fired)
    assert woken_here == sorted(set(plan) - set(ended_elsewhere))
    for eid in plan:
        assert len(await _fired_times(store, eid)) == 1, eid
    if isinstance(store, LoadsMany):
        assert sorted(loads) == sorted(ended_elsewhere)  # only the moved ones were read again
    assert await _timer_store(store).next_timer_due() is None
    await other.close()
    await rt.close()


async def test_a_failing_prepare_still_wakes_its_batch(backend: Backend) -> None:
    clock = SetClock(T0)
    store = backend.store()
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False)
    rt.register(nap)
    plan = {f"p{i:02d}": T0 for i in range(30)}
    await _asleep(rt, plan)

    async def broken(due: Sequence[Timer]) -> None:
        raise RuntimeError("the batch read failed")

    service = TimerService(_timer_store(store), rt._wake_locally, clock=clock, prepare=broken)
    assert await service.run_due() == len(plan)
    assert sorted(t.execution_id for t in service.fired) == sorted(plan)
    await until(lambda: _all_done(store, len(plan)), "all completed", timeout=60)
    await rt.close()
