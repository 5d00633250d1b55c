"""ADR 0004, amendment L20: a superseded dispatch is not a failed attempt.

Every case runs over a plain store AND a TenantScopedEventStore, with real dispatchers over one
SQLite file, deterministically (the arena drives timing with events; no timers). The counts
are the ADR's: with the superseded checks reverted they become 5 / 6 / 18.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import ExecutionAlreadyExistsError
from loom.model import EventType, ExecutionStatus
from loom.placement import (
    ExecutionPackage,
    LocalDispatcher,
    SupervisingDispatcher,
    is_superseded_refusal,
)
from loom.storage import SQLiteStore, Store, TenantScopedEventStore
from loom.storage.postgres import PostgresStore
from tests.support.arena import Arena, ArenaWorker, DelayedBootstrap
from tests.support.pg import require_pg, temp_schema

EID = "pay-7"
PACKAGE = ExecutionPackage(execution_id=EID, flow_id="one-effect")


@pytest.fixture(params=["plain", "tenant", pytest.param("postgres", marks=pytest.mark.postgres)])
async def arena(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "postgres":  # the same races over PostgreSQL's fencing
        dsn = require_pg()
        async with temp_schema(dsn) as schema:
            pg = PostgresStore(dsn, schema=schema)
            a = Arena(pg, lambda store: store)
            yield a
            await a.close()
            await pg.close()
        return
    shared = SQLiteStore(tmp_path / "arena.db")
    if request.param == "tenant":

        def view(store: Store) -> Store:
            return TenantScopedEventStore(store, "acme")
    else:

        def view(store: Store) -> Store:
            return store

    a = Arena(shared, view)
    yield a
    await a.close()


def _dispatcher(arena: Arena, rt: loom.WorkflowRuntime, attempts: int = 3, **kw: Any) -> Any:
    worker = ArenaWorker(arena, rt, **kw)
    return LocalDispatcher(worker, max_attempts=attempts), worker


async def _log(rt: loom.WorkflowRuntime) -> list[loom.Envelope]:
    return await rt.store.read(EID)


async def test_sequence_zero_race_runs_the_effect_once(arena: Arena) -> None:
    import asyncio

    rt_a = arena.runtime(DelayedBootstrap(arena.make_view(arena.shared), EID))  # type: ignore[arg-type]
    rt_b = arena.runtime()
    a_allocated = asyncio.Event()

    async def signal() -> None:
        a_allocated.set()

    disp_a, _ = _dispatcher(arena, rt_a, after_first_allocate=signal)
    disp_b, _ = _dispatcher(arena, rt_b)

    async def b_after_a() -> Any:
        await a_allocated.wait()
        return await arena.run(disp_b, PACKAGE)

    res_a, res_b = await asyncio.gather(arena.run(disp_a, PACKAGE), b_after_a())
    assert isinstance(res_a, ExecutionAlreadyExistsError) and res_a.execution_id == EID
    assert is_superseded_refusal(res_a, EID)
    assert res_b.status is ExecutionStatus.COMPLETED
    assert arena.effects == 1, arena.effect_fences
    log = await _log(rt_b)
    assert sum(e.type is EventType.EXECUTION_STARTED for e in log) == 1
    assert disp_a.attempts == 1  # the refusal was not retried


async def test_duplicate_dispatch_after_bootstrap_runs_it_twice(arena: Arena) -> None:
    import asyncio

    rt_a, rt_b = arena.runtime(), arena.runtime()
    disp_a, _ = _dispatcher(arena, rt_a)
    disp_b, _ = _dispatcher(arena, rt_b)
    first = asyncio.ensure_future(arena.run(disp_a, PACKAGE))
    await arena.in_effect.wait()  # A has written sequence 0 and is inside the effect
    res_a, res_b = await asyncio.gather(first, arena.run(disp_b, PACKAGE))
    assert arena.effect_fences == [1, 2]
    assert is_superseded_refusal(res_a, EID), res_a
    assert res_b.status is ExecutionStatus.COMPLETED
    assert (disp_a.attempts, disp_b.attempts) == (1, 1)
    log = await _log(rt_b)
    assert sum(e.type is EventType.EXECUTION_STARTED for e in log) == 1
    assert {e.fence for e in log} == {1, 2}


async def test_supervised_stack_runs_it_twice_with_circuit_closed(arena: Arena) -> None:
    import asyncio

    rt_a, rt_b = arena.runtime(), arena.runtime()
    sup_a = SupervisingDispatcher(_dispatcher(arena, rt_a)[0], max_restarts=2)
    sup_b = SupervisingDispatcher(_dispatcher(arena, rt_b)[0], max_restarts=2)
    first = asyncio.ensure_future(arena.run(sup_a, PACKAGE))
    await arena.in_effect.wait()
    res_a, res_b = await asyncio.gather(first, arena.run(sup_b, PACKAGE))
    assert arena.effects == 2, arena.effect_fences
    assert is_superseded_refusal(res_a, EID)
    assert res_b.status is ExecutionStatus.COMPLETED
    for sup in (sup_a, sup_b):
        assert not sup.circuit_open and sup.consecutive_failures == 0 and sup.restarts == 0
        assert (await sup.health()).detail["circuit"] == "closed"


async def test_dead_holder_is_taken_over_and_the_zombie_does_not_take_it_back(
    arena: Arena,
) -> None:
    import asyncio

    rt_zombie, rt_new = arena.runtime(), arena.runtime()
    zombie, _ = _dispatcher(arena, rt_zombie, attempts=3)
    takeover, _ = _dispatcher(arena, rt_new, attempts=3)
    arena.hang_fence = 1  # the first holder wedges inside its effect
    z = asyncio.ensure_future(arena.run(zombie, PACKAGE))
    await arena.in_effect.wait()
    arena.in_effect.clear()
    t = asyncio.ensure_future(arena.run(takeover, PACKAGE))
    await arena.in_effect.wait()  # the takeover re-runs the interrupted effect
    arena.wake.set()  # the zombie wakes up and tries to record
    res_z, res_t = await asyncio.gather(z, t)
    assert is_superseded_refusal(res_z, EID), res_z
    assert res_t.status is ExecutionStatus.COMPLETED
    assert arena.effect_fences == [1, 2]  # exactly one re-run
    assert zombie.attempts == 1  # it did not take the execution back
    log = await _log(rt_new)
    assert max(e.fence for e in log) == 2
    assert [e.type for e in log].count(EventType.EXECUTION_RECOVERED) == 1


async def test_start_fenced_out_by_a_silent_holder_completes(arena: Arena) -> None:
    arena.remaining = 1
    rt = arena.runtime()
    view = rt.store

    async def silent_holder() -> None:
        # Another dispatcher takes a fence here and dies before writing sequence 0.
        await arena.fence_taken(await view.acquire_fence(EID))

    disp, _ = _dispatcher(arena, rt, after_first_allocate=silent_holder)
    result = await arena.run(disp, PACKAGE)
    assert not isinstance(result, BaseException), repr(result)
    assert result.status is ExecutionStatus.COMPLETED
    assert disp.attempts == 2 and arena.effects == 1
    log = await _log(rt)
    assert log[0].type is EventType.EXECUTION_STARTED and log[0].fence == 3


# --------------------------------------------------------------------------- mutation checks
# The cases above must fail when the code they guard is reverted. These run them with the
# guard removed and assert the failure, and the seed's exact effect counts.


async def _run_reverted(case: Any, tmp_path: Path, view: Any = lambda s: s) -> int:
    arena = Arena(SQLiteStore(tmp_path / "mutant.db"), view)
    try:
        with pytest.raises(AssertionError):
            await case(arena)
        return arena.effects
    finally:
        await arena.close()


async def _seed_race_counts(tmp_path: Path, view: Any = lambda s: s) -> list[int]:
    """Effect counts of the seed's three races, each of which must now fail its test."""
    counts = []
    for i, case in enumerate(
        [
            test_sequence_zero_race_runs_the_effect_once,
            test_duplicate_dispatch_after_bootstrap_runs_it_twice,
            test_supervised_stack_runs_it_twice_with_circuit_closed,
        ]
    ):
        sub = tmp_path / str(i)
        sub.mkdir()
        counts.append(await _run_reverted(case, sub, view))
    return counts


async def test_reverting_the_dispatcher_checks_restores_5_6_18(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import loom.placement.dispatchers as dispatchers

    monkeypatch.setattr(dispatchers, "is_superseded_refusal", lambda err, eid: False)
    assert await _seed_race_counts(tmp_path) == [5, 6, 18]


async def test_reverting_the_start_fenced_out_cause_loses_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import loom.storage.sqlite as sqlite_module
    from loom.errors import StaleFenceError
    from loom.storage._common import refusal_for

    def reverted(eid: str, first: int, fence: int, current: int, nxt: int) -> Any:
        if first == 0 and nxt == 0 and fence != current:
            return StaleFenceError("stale", execution_id=eid)
        return refusal_for(eid, first, fence, current, nxt)

    monkeypatch.setattr(sqlite_module, "refusal_for", reverted)
    assert await _run_reverted(test_start_fenced_out_by_a_silent_holder_completes, tmp_path) == 0


async def test_reverting_the_tenant_unscoping_fails_the_tenant_variants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refusals would name the scoped key ("acme:pay-7"): the predicate must not match them.
    monkeypatch.setattr(TenantScopedEventStore, "_tenant_error", lambda self, err: err)
    tenant_view = lambda s: TenantScopedEventStore(s, "acme")  # noqa: E731
    assert await _seed_race_counts(tmp_path, tenant_view) == [5, 6, 18]
