"""Timer hardening (#11 gaps): an unlogged wait backs off; only registered flows' timers are
claimed."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import loom
from loom.runtime.timers import TimerService, WakeOutcome
from loom.storage import InMemoryStore, SQLiteStore, Store, Timer, TimerStore
from loom.storage.postgres import PostgresStore
from loom.storage.tenancy import TenantScopedEventStore
from loom.testing import SkippingClock
from tests.support.pg import require_pg, temp_schema


async def test_a_timer_whose_wait_was_never_logged_backs_off() -> None:
    clock = SkippingClock()
    store = InMemoryStore()
    tries: list[float] = []

    async def wake(timer: Timer) -> WakeOutcome:
        tries.append(clock.now())
        return WakeOutcome.EARLY  # due, but nothing waits in the log: its holder died

    service = TimerService(store, wake, clock=clock, early_retry=0.5, max_early_backoff=30.0)
    await store.schedule_timer(Timer("orphan", 3, clock.now(), flow_id="f"))
    for _ in range(10):
        assert await service.run_due() == 1
        due = await store.next_timer_due()
        assert due is not None  # handed back, never dropped: recovery settles it later
        clock.advance(due - clock.now())
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert gaps[0] == pytest.approx(0.5)
    assert all(later >= earlier for earlier, later in itertools.pairwise(gaps))
    assert gaps[-1] == pytest.approx(30.0)  # capped
    # Once the wait is logged and the timer fires, the back-off is forgotten.
    await store.schedule_timer(Timer("orphan", 3, clock.now(), flow_id="f"))
    fired: list[Timer] = []

    async def wake_ok(timer: Timer) -> WakeOutcome:
        fired.append(timer)
        return WakeOutcome.FIRED

    service.wake = wake_ok
    assert await service.run_due() == 1 and len(fired) == 1
    assert await store.next_timer_due() is None
    assert service._early == {}


async def test_a_timer_not_yet_due_by_the_wakers_clock_is_retried_promptly() -> None:
    clock = SkippingClock()
    store = InMemoryStore()
    tries: list[float] = []

    async def wake(timer: Timer) -> WakeOutcome:
        tries.append(clock.now())
        return WakeOutcome.EARLY

    service = TimerService(store, wake, clock=clock, early_retry=0.5)
    # Claimed early (another node's clock ran ahead): not an unlogged wait, no back-off.
    await store.schedule_timer(Timer("ahead", 0, clock.now() + 10, flow_id="f"))
    clock.advance(10)
    for _ in range(4):
        await service.run_due()
        due = await store.next_timer_due()
        assert due is not None
        clock.advance(due - clock.now())
    assert len(tries) == 4


BACKENDS = ["memory", "sqlite", "tenant", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
async def timer_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield InMemoryStore()
    elif request.param == "sqlite":
        store = SQLiteStore(tmp_path / "timers.db")
        yield store
        await store.close()
    elif request.param == "tenant":
        view = TenantScopedEventStore(SQLiteStore(tmp_path / "t.db"), "acme", close_store=True)
        yield view
        await view.close()
    else:
        dsn = require_pg()
        async with temp_schema(dsn) as schema:
            pg = await PostgresStore.open(dsn, schema=schema)
            yield pg
            await pg.close()


async def test_a_claim_takes_only_timers_of_the_given_flows(timer_store: Store) -> None:
    assert isinstance(timer_store, TimerStore)
    for eid, flow in [("x", "known"), ("y", "unknown"), ("z", "known")]:
        await timer_store.schedule_timer(Timer(eid, 1, 100.0, flow_id=flow))
    none = await timer_store.claim_due_timers(200.0, owner="o", lease=30, flow_ids=[])
    assert none == []
    mine = await timer_store.claim_due_timers(200.0, owner="o", lease=30, flow_ids={"known"})
    assert sorted(t.execution_id for t in mine) == ["x", "z"]
    rest = await timer_store.claim_due_timers(200.0, owner="p", lease=30)
    assert [t.execution_id for t in rest] == ["y"]  # not held for a lease by the runtime above


@loom.flow(id="napper", version="1")
async def napper(ctx: loom.WorkflowContext) -> str:
    await ctx.sleep(5)
    return "rested"


async def test_a_runtime_without_a_flows_code_leaves_its_timers_to_one_that_has_it() -> None:
    clock = SkippingClock()
    store = InMemoryStore()
    owner = loom.WorkflowRuntime(store, clock=clock, timers=False)
    owner.register(napper)
    await (await owner.start(napper, execution_id="nap")).wait_for_suspend()
    stranger = loom.WorkflowRuntime(store, clock=clock, timers=False)  # lacks napper's code
    clock.advance(10)
    assert stranger.timers is not None and owner.timers is not None
    assert await stranger.timers.run_due() == 0  # not claimed, so not held for 30 s either
    assert await owner.timers.run_due() == 1
    state = await owner.handle("nap").settled(10)
    assert state.output == "rested"
    await owner.close()
