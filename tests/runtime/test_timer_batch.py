"""A claimed timer batch is taken over in one write, its flows run on ahead of it: nothing
new runs before its take-over is durable, no timer fires early or twice, none is lost.

A flow that only replays to its end has its outcome written with the batch's take-overs; one
that reaches a step stops there until its own take-over is written, then runs again. The
in-process tests check, from inside each step's effect, that its holder's TIMER_FIRED is
already in the store; the crash tests SIGKILL a service process mid-batch and check with an
effect ledger that every effect ran once, under a fence the log holds.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.model import EventType, ExecutionStatus
from loom.runtime.timers import TimerService
from loom.storage import ExecutionQuery, Store, TakesOverMany, Timer, TimerStore
from tests.children.timer_batch import batch_nap
from tests.conftest import Backend
from tests.support.clock import SetClock
from tests.support.poll import until
from tests.support.proc import run_child

T0 = 2_000_000.0


#: (execution id, fence, TIMER_FIRED at that fence already stored) per effect run in-process.
EFFECTS: list[tuple[str, int, bool]] = []
STORE: list[Store] = []


@loom.step(id="checked-touch")
async def checked_touch(execution_id: str) -> int:
    info = loom.current_step()
    assert info is not None
    fired = [
        e
        for e in await STORE[0].read(execution_id)
        if e.type is EventType.TIMER_FIRED and e.fence == info.fence
    ]
    EFFECTS.append((execution_id, info.fence, bool(fired)))
    return info.fence


@loom.flow(id="nap-then-maybe-step", version="1")
async def nap_then_maybe_step(ctx: loom.WorkflowContext, args: dict[str, Any]) -> Any:
    await ctx.sleep_until(float(args["when"]))
    if args["step"]:
        return await ctx.run(checked_touch, ctx.execution_id)
    if args["again"]:
        await ctx.sleep_until(float(args["when"]) + 10)  # a new wait: written after the take-over
    return "woke"


async def _completed(store: Store, flow_id: str) -> int:
    return await store.count_executions(
        ExecutionQuery(statuses=[ExecutionStatus.COMPLETED], flow_id=flow_id)
    )


async def test_a_batch_runs_no_step_before_its_take_over_is_durable(backend: Backend) -> None:
    clock = SetClock(T0 - 5)
    store = backend.store()
    EFFECTS.clear()
    STORE[:] = [store]
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False)
    rt.register(nap_then_maybe_step)
    plan = {f"b{i:03d}": {"when": T0, "step": i % 3 == 0, "again": i % 3 == 1} for i in range(150)}
    ids = list(plan)
    for chunk in range(0, len(ids), 50):
        handles = await asyncio.gather(
            *(
                rt.start(nap_then_maybe_step, plan[i], execution_id=i)
                for i in ids[chunk : chunk + 50]
            )
        )
        await asyncio.gather(*(h.settled() for h in handles))
    assert isinstance(store, TimerStore)
    service = TimerService(
        store, rt._wake_locally, clock=clock, batch=40, prepare=rt._prepare_wakes
    )
    assert await service.run_due() == 0  # nothing due yet: none early
    clock.t = T0
    assert await service.run_due() == len(plan)

    async def settled() -> bool:
        states = [await rt.load_state(i) for i in ids]
        return all(s is not None and s.status is not ExecutionStatus.RUNNING for s in states)

    await until(settled, "every woken flow settled", timeout=60)
    stepped = [i for i in ids if plan[i]["step"]]
    # Each step ran once, and only once its holder's take-over was in the store.
    assert Counter(e[0] for e in EFFECTS) == Counter(stepped)
    assert all(durable for _, _, durable in EFFECTS), [e for e in EFFECTS if not e[2]]
    for eid in ids:
        log = await store.read(eid)
        fired = [e for e in log if e.type is EventType.TIMER_FIRED]
        assert len(fired) == 1 and fired[0].recorded_at >= T0, (eid, fired)
        assert log[-1].type is (
            EventType.EXECUTION_SUSPENDED if plan[eid]["again"] else EventType.EXECUTION_COMPLETED
        ), (eid, log[-1])
    if isinstance(store, TakesOverMany):
        # Those that only replayed to their end: the outcome in the take-over's write (its
        # fence, its instant).
        for eid in ids:
            if not plan[eid]["step"] and not plan[eid]["again"]:
                log = await store.read(eid)
                assert log[-2].type is EventType.TIMER_FIRED, (eid, log[-2:])
                assert log[-1].fence == log[-2].fence
                assert log[-1].recorded_at == log[-2].recorded_at, eid
    # The second sleeps fire later, each once, and never early.
    clock.t = T0 + 9
    assert await service.run_due() == 0
    clock.t = T0 + 10
    again = [i for i in ids if plan[i]["again"]]
    assert await service.run_due() == len(again)
    await until(lambda: _all_completed(store, len(plan)), "every execution completed", timeout=60)
    for eid in again:
        fired = [e for e in await store.read(eid) if e.type is EventType.TIMER_FIRED]
        assert [e.recorded_at >= T0 + 10 for e in fired] == [False, True], (eid, fired)
    await rt.close()


async def _all_completed(store: Store, n: int) -> bool:
    return await _completed(store, nap_then_maybe_step.id) == n


#: (execution id, TIMER_FIRED already stored) per decision computed in-process.
DECIDED: list[tuple[str, bool]] = []


@loom.flow(id="nap-then-decide", version="1")
async def nap_then_decide(ctx: loom.WorkflowContext, args: dict[str, Any]) -> Any:
    await ctx.sleep_until(float(args["when"]))
    eid = ctx.execution_id

    async def checked() -> bool:
        log = await STORE[0].read(eid)
        fired = any(e.type is EventType.TIMER_FIRED for e in log)
        DECIDED.append((eid, fired))
        return fired

    return await ctx.decide("checked", checked)


async def test_a_batch_decides_nothing_before_its_take_over_is_durable(backend: Backend) -> None:
    """Not only steps: a decision (as any new wait, child start or UI patch) after the wake is
    computed only once the take-over is in the store, never by a flow run on ahead of it."""
    clock = SetClock(T0 - 5)
    store = backend.store()
    DECIDED.clear()
    STORE[:] = [store]
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False)
    rt.register(nap_then_decide)
    ids = [f"d{i:02d}" for i in range(20)]
    handles = await asyncio.gather(
        *(rt.start(nap_then_decide, {"when": T0}, execution_id=i) for i in ids)
    )
    await asyncio.gather(*(h.settled() for h in handles))
    assert isinstance(store, TimerStore)
    service = TimerService(
        store, rt._wake_locally, clock=clock, batch=40, prepare=rt._prepare_wakes
    )
    clock.t = T0
    assert await service.run_due() == len(ids)

    async def done() -> bool:
        n = await store.count_executions(
            ExecutionQuery(statuses=[ExecutionStatus.COMPLETED], flow_id=nap_then_decide.id)
        )
        return n == len(ids)

    await until(done, "every woken flow completed", timeout=60)
    assert Counter(eid for eid, _ in DECIDED) == Counter(ids)  # each decided once
    assert all(fired for _, fired in DECIDED), [d for d in DECIDED if not d[1]]
    await rt.close()


async def test_racing_batches_fire_each_timer_once(backend: Backend) -> None:
    # Two runtimes' services (one store) prepare and take over the same due timers at once:
    # each take-over is a compare-and-swap, so each wait ends once whichever batch wins.
    clock = SetClock(T0 - 5)
    store = backend.store()
    EFFECTS.clear()
    STORE[:] = [store]
    rts = [loom.WorkflowRuntime(store, clock=clock, timers=False) for _ in range(2)]
    for rt in rts:
        rt.register(nap_then_maybe_step)
    plan = {f"r{i:03d}": {"when": T0, "step": i % 2 == 0, "again": False} for i in range(120)}
    for chunk in range(0, 120, 40):
        handles = await asyncio.gather(
            *(
                rts[0].start(nap_then_maybe_step, plan[i], execution_id=i)
                for i in list(plan)[chunk : chunk + 40]
            )
        )
        await asyncio.gather(*(h.settled() for h in handles))
    assert isinstance(store, TimerStore)
    clock.t = T0
    loads = [rt._prepare_wakes for rt in rts]
    services = [
        TimerService(store, rt._wake_locally, clock=clock, batch=30, lease=0.0, prepare=load)
        for rt, load in zip(rts, loads, strict=True)
    ]
    # A lease of 0: each claim is handed out again at once, so both services claim (and
    # prepare) the same timers.
    await asyncio.gather(*(s.run_due() for s in services))
    await until(lambda: _all_completed(store, len(plan)), "every execution completed", timeout=60)
    for eid in plan:
        fired = [e for e in await store.read(eid) if e.type is EventType.TIMER_FIRED]
        assert len(fired) == 1, (eid, fired)
    assert Counter(e[0] for e in EFFECTS) == Counter(i for i in plan if plan[i]["step"])
    assert all(durable for _, _, durable in EFFECTS)
    for rt in rts:
        await rt.close()


async def test_a_batch_never_fires_a_wait_before_its_logged_time(backend: Backend) -> None:
    # Timer rows due earlier than the waits they end (a service with a clock ahead stored
    # them, say): the batch claims them, but only the log's time may end a wait.
    clock = SetClock(T0 - 20)
    store = backend.store()
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False)
    rt.register(nap_then_maybe_step)
    ids = [f"e{i:02d}" for i in range(60)]
    handles = await asyncio.gather(
        *(
            rt.start(
                nap_then_maybe_step, {"when": T0, "step": False, "again": False}, execution_id=i
            )
            for i in ids
        )
    )
    await asyncio.gather(*(h.settled() for h in handles))
    assert isinstance(store, TimerStore)
    for eid in ids:
        await store.schedule_timer(Timer(eid, 0, T0 - 10, "sleep", nap_then_maybe_step.id))
    service = TimerService(
        store, rt._wake_locally, clock=clock, batch=25, prepare=rt._prepare_wakes
    )
    clock.t = T0 - 5
    assert await service.run_due() == len(ids)  # claimed (due by the rows)...
    for eid in ids:  # ...and not one fired: each handed back
        assert not [e for e in await store.read(eid) if e.type is EventType.TIMER_FIRED], eid
    assert service.fired == []
    clock.t = T0
    while await store.next_timer_due() is not None:
        await service.run_due()
    await until(lambda: _all_completed(store, len(ids)), "every execution completed", timeout=60)
    for eid in ids:
        fired = [e for e in await store.read(eid) if e.type is EventType.TIMER_FIRED]
        assert len(fired) == 1 and fired[0].recorded_at >= T0, (eid, fired)
    await rt.close()


def _start_sleepers(db: Path, n: int, when: float) -> list[str]:
    async def start() -> list[str]:
        store = loom.SQLiteStore(db)
        rt = loom.WorkflowRuntime(store, timers=False)
        rt.register(batch_nap)
        ids = [f"k{i:03d}" for i in range(n)]
        for chunk in range(0, n, 50):
            handles = await asyncio.gather(
                *(
                    rt.start(batch_nap, {"when": when, "step": i % 2 == 0}, execution_id=eid)
                    for i, eid in enumerate(ids[chunk : chunk + 50], start=chunk)
                )
            )
            await asyncio.gather(*(h.settled() for h in handles))
        await rt.close()
        await store.close()
        return ids

    ids = asyncio.run(start())
    with sqlite3.connect(db) as conn:
        # Half load from the log alone (a state with no snapshot takes a new step's position
        # by another path than one loaded from a snapshot): both must wait for the take-over.
        conn.executemany(
            "DELETE FROM loom_snapshots WHERE execution_id = ?", [(i,) for i in ids[::4]]
        )
        conn.executemany(
            "DELETE FROM loom_snapshot_segments WHERE execution_id = ?", [(i,) for i in ids[::4]]
        )
    return ids


@pytest.mark.parametrize(
    ("fault", "fired_before"),
    [
        # The child claims a batch, claims the next while preparing the first (commits 1 and
        # 2), then writes the first batch's take-overs (commit 3, the second batch's with
        # them when both are ready at once).
        ("before_commit=kill@3", {0}),  # that write: nothing of it committed
        ("after_append_before_ack=kill@3", {50, 100}),  # committed; nobody drove them on
        ("before_effect=kill@5", None),  # mid-batch, as the fifth step's effect starts
        ("after_effect_before_record=kill@3", None),  # a step's effect ran, its record did not
    ],
)
def test_sigkill_mid_batch_then_another_service_fires_each_once(
    fault: str, fired_before: set[int] | None, tmp_path: Path
) -> None:
    db, ledger = tmp_path / "loom.db", tmp_path / "ledger.db"
    n = 120
    ids = _start_sleepers(db, n, time.time())  # due by the time a service looks
    killed = run_child("timer_batch", db, ledger, env={"LOOM_FAULTS": fault})
    assert killed.returncode == -9, (killed.returncode, killed.stdout, killed.stderr)
    if fired_before is not None:
        with sqlite3.connect(db) as conn:
            (count,) = conn.execute(
                "SELECT count(*) FROM loom_events WHERE type = 'TIMER_FIRED'"
            ).fetchone()
        assert count in fired_before, count  # killed where the test means to
    done = run_child("timer_batch", db, ledger, "recover")
    assert done.returncode == 0 and "done" in done.stdout, done.stderr
    with sqlite3.connect(db) as conn:
        fired = Counter(
            eid
            for (eid,) in conn.execute(
                "SELECT execution_id FROM loom_events WHERE type = 'TIMER_FIRED'"
            )
        )
        statuses = dict(conn.execute("SELECT execution_id, status FROM loom_executions"))
    assert all(fired[eid] == 1 for eid in ids), [e for e in ids if fired[e] != 1]
    assert all(statuses[eid] == "completed" for eid in ids), Counter(statuses.values())
    with sqlite3.connect(ledger) as conn:
        effects = conn.execute("SELECT execution_id, fence, durable FROM effects").fetchall()
    # No effect ran for a holder whose take-over was not committed.
    assert all(durable == 1 for _, _, durable in effects), [e for e in effects if e[2] != 1]
    ran = Counter(eid for eid, _, _ in effects)
    stepped = Counter(eid for i, eid in enumerate(ids) if i % 2 == 0)
    assert set(ran) == set(stepped), set(ran) ^ set(stepped)
    if fired_before is not None:
        assert ran == stepped, ran  # killed before any effect ran: each runs once
    else:
        # An effect whose record the kill lost runs again (at most once more); no other does.
        assert max(ran.values()) <= 2, ran
