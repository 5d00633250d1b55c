"""The TimerStore conformance kit: ``await run_timer_store_conformance(make_store)``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from loom.errors import PayloadError
from loom.storage import Timer, TimerStore

__all__ = ["TIMER_CHECKS", "run_timer_store_conformance"]

MakeTimerStore = Callable[[], Awaitable[TimerStore]]
TimerCheck = Callable[[TimerStore], Awaitable[None]]
TIMER_CHECKS: dict[str, TimerCheck] = {}


def _check(fn: TimerCheck) -> TimerCheck:
    TIMER_CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


@_check
async def check_schedule_and_claim_due(store: TimerStore) -> None:
    await store.schedule_timer(Timer("a", 1, 100.0, "sleep", "f"))
    await store.schedule_timer(Timer("b", 2, 152.0, "gate_timeout", "g"))
    assert await store.next_timer_due() == 100.0
    assert await store.claim_due_timers(99.0, owner="x", lease=10) == []
    got = await store.claim_due_timers(150.0, owner="x", lease=10)
    assert got == [Timer("a", 1, 100.0, "sleep", "f")], got
    later = await store.claim_due_timers(155.0, owner="y", lease=10, limit=10)
    assert later == [Timer("b", 2, 152.0, "gate_timeout", "g")], later  # a is still claimed


@_check
async def check_claims_are_exclusive(store: TimerStore) -> None:
    for i in range(50):
        await store.schedule_timer(Timer(f"e{i:02d}", 0, 10.0))
    batches = await asyncio.gather(
        *(store.claim_due_timers(20.0, owner=f"o{k}", lease=60, limit=7) for k in range(10))
    )
    claimed = [t.execution_id for batch in batches for t in batch]
    assert len(claimed) == len(set(claimed)) == 50, sorted(claimed)


@_check
async def check_expired_claims_are_handed_out_again(store: TimerStore) -> None:
    await store.schedule_timer(Timer("lease", 3, 10.0))
    assert len(await store.claim_due_timers(10.0, owner="dead", lease=5)) == 1
    assert await store.claim_due_timers(14.0, owner="other", lease=5) == []
    again = await store.claim_due_timers(15.5, owner="other", lease=5)
    assert [t.execution_id for t in again] == ["lease"]


@_check
async def check_complete_and_cancel(store: TimerStore) -> None:
    await store.schedule_timer(Timer("done", 1, 5.0))
    await store.schedule_timer(Timer("done", 4, 6.0))
    await store.schedule_timer(Timer("gone", 1, 5.0))
    await store.schedule_timer(Timer("gone", 2, 7.0))
    await store.complete_timer(Timer("done", 1, 5.0))
    assert await store.cancel_timers("gone") == 2
    assert await store.cancel_timers("gone") == 0
    left = await store.claim_due_timers(100.0, owner="x", lease=1, limit=10)
    assert [(t.execution_id, t.position) for t in left] == [("done", 4)]
    await store.complete_timer(left[0])
    assert await store.next_timer_due() is None


@_check
async def check_complete_many_deletes_only_those_positions(store: TimerStore) -> None:
    for i in range(30):
        await store.schedule_timer(Timer(f"m{i:02d}", 1, 5.0))
        await store.schedule_timer(Timer(f"m{i:02d}", 2, 5.0))
    claimed = await store.claim_due_timers(10.0, owner="x", lease=60, limit=100)
    fired = [t for t in claimed if t.position == 1]
    assert len(fired) == 30, claimed
    await store.complete_timers(fired)
    await store.complete_timers(fired)  # settling twice is harmless
    await store.complete_timers([])
    left = await store.claim_due_timers(100.0, owner="y", lease=1, limit=100)
    assert sorted((t.execution_id, t.position) for t in left) == [
        (f"m{i:02d}", 2) for i in range(30)
    ], left


@_check
async def check_schedule_is_idempotent_per_position(store: TimerStore) -> None:
    await store.schedule_timer(Timer("same", 1, 50.0))
    await store.schedule_timer(Timer("same", 1, 60.0))
    got = await store.claim_due_timers(100.0, owner="x", lease=1, limit=10)
    assert got == [Timer("same", 1, 60.0)], got


async def run_timer_store_conformance(make_store: MakeTimerStore) -> list[str]:
    """Run every check on a fresh store each; return the names that passed."""
    passed = []
    for name, check in TIMER_CHECKS.items():
        store = await make_store()
        try:
            await check(store)
        except AssertionError as exc:
            raise AssertionError(f"timer store check {name!r} failed: {exc}") from exc
        finally:
            close = getattr(store, "close", None)
            if close is not None:
                await close()
        passed.append(name)
    return passed


@_check
async def check_non_finite_fire_times_are_refused(store: TimerStore) -> None:
    """A timer at NaN or an infinity would never fire, or fire at once forever: refused with
    PayloadError naming the execution, and nothing stored (an earlier timer stays)."""
    await store.schedule_timer(Timer("nf", 1, 100.0))
    for bad in (float("nan"), float("inf"), float("-inf")):
        for eid, position in (("nf", 1), ("nf-other", 0)):
            try:
                await store.schedule_timer(Timer(eid, position, bad))
            except PayloadError as exc:
                assert exc.execution_id == eid, exc
            else:
                raise AssertionError(f"a timer at {bad!r} was accepted")
    assert await store.next_timer_due() == 100.0
    assert await store.claim_due_timers(1e12, owner="x", lease=10) == [Timer("nf", 1, 100.0)]
