"""PostgresStore as a TimerStore: the timer conformance kit over a real server, the schema
migration that added timers, and two TimerService processes sharing 1,000 due timers."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable
from typing import Any

import psycopg
import pytest

import loom
from loom.errors import PayloadError, StorageError
from loom.model import EventType, ExecutionStatus
from loom.runtime import WakeOutcome
from loom.storage import Timer, TimerStore
from loom.storage.postgres import SCHEMA_VERSION, PostgresStore
from loom.testing import TIMER_CHECKS, SkippingClock
from loom.testing._store_conformance import env
from tests.children.timer_service import nap_until
from tests.support.old_schema import PG_EVENTS_BEFORE_RUNG_10
from tests.support.poll import until
from tests.support.proc import Child

pytestmark = pytest.mark.postgres


VARIANTS = {"coalesced": {}, "per-write": {"group_commit": False}}


@pytest.mark.parametrize("check", sorted(TIMER_CHECKS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
async def test_timer_store_conformance(check: str, variant: str, pg_dsn: str, schema: str) -> None:
    store = await PostgresStore.open(pg_dsn, schema=schema, **VARIANTS[variant])
    assert isinstance(store, TimerStore)
    try:
        await TIMER_CHECKS[check](store)
    finally:
        await store.close()


async def test_claims_are_exclusive_across_stores(pg_dsn: str, schema: str) -> None:
    """Claimers in separate pools (as in separate processes) never share a timer."""
    stores = await asyncio.gather(*(PostgresStore.open(pg_dsn, schema=schema) for _ in range(4)))
    try:
        await asyncio.gather(
            *(stores[0].schedule_timer(Timer(f"x{i:03d}", 1, 5.0)) for i in range(300))
        )
        batches = await asyncio.gather(
            *(
                s.claim_due_timers(10.0, owner=f"o{k}", lease=60, limit=9)
                for k in range(40)
                for s in stores
            )
        )
        claimed = [t.execution_id for batch in batches for t in batch]
        assert len(claimed) == len(set(claimed)) == 300
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_text_postgres_cannot_hold_is_refused_or_never_stored(
    pg_dsn: str, schema: str
) -> None:
    store = await PostgresStore.open(pg_dsn, schema=schema)
    try:
        with pytest.raises(PayloadError, match="NUL"):
            await store.schedule_timer(Timer("a\x00b", 1, 5.0))
        with pytest.raises(PayloadError, match="UTF-8"):
            await store.schedule_timer(Timer("ok", 1, 5.0, flow_id="\ud800"))
        assert await store.cancel_timers("a\x00b") == 0
        await store.complete_timer(Timer("a\x00b", 1, 5.0))
        assert await store.next_timer_due() is None
    finally:
        await store.close()


# ---------------------------------------------------------------- the schema migration


async def _sql(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(sql, params)
        return await cur.fetchall() if cur.description else []


async def _version_1_schema(dsn: str, schema: str) -> None:
    """A schema as Loom 1 left it, with one execution in it: the current schema minus what
    versions 2 and later added, its version set back to 1."""
    store = await PostgresStore.open(dsn, schema=schema)
    fence = await store.acquire_fence("old")
    await store.append([env("old", 0, fence), env("old", 1, fence)])
    await store.close()
    await _sql(dsn, f'DROP TABLE "{schema}".timers')
    await _sql(dsn, f'DROP TABLE "{schema}".executions')  # and what version 3 added
    await _sql(dsn, f'DROP SEQUENCE "{schema}".executions_cursor')
    await _sql(dsn, f'DROP TABLE "{schema}".blobs')
    await _sql(dsn, f'DROP TABLE "{schema}".leases')
    await _sql(dsn, f'DROP TABLE "{schema}".mailbox')  # and what version 7 added
    await _sql(dsn, f'DROP TABLE "{schema}".refs')  # and what version 8 added
    await _sql(dsn, f'DROP TABLE "{schema}".snapshot_segments')  # and what version 9 added
    for statement in PG_EVENTS_BEFORE_RUNG_10:  # and what version 10 changed
        await _sql(dsn, statement.format(s=f'"{schema}"'))
    await _sql(dsn, f"UPDATE \"{schema}\".meta SET value = '1' WHERE key = 'schema_version'")


async def _version(dsn: str, schema: str) -> int:
    rows = await _sql(dsn, f"SELECT value FROM \"{schema}\".meta WHERE key = 'schema_version'")
    return int(rows[0][0])


async def _has_table(dsn: str, schema: str, table: str) -> bool:
    rows = await _sql(dsn, "SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".{table}',))
    return bool(rows[0][0])


async def test_a_version_1_schema_is_upgraded_in_place(pg_dsn: str, schema: str) -> None:
    assert SCHEMA_VERSION >= 2
    await _version_1_schema(pg_dsn, schema)
    assert not await _has_table(pg_dsn, schema, "timers")
    # Several processes opening the old schema at once: one migrates, the others wait for it.
    stores = await asyncio.gather(*(PostgresStore.open(pg_dsn, schema=schema) for _ in range(4)))
    try:
        assert await _version(pg_dsn, schema) == SCHEMA_VERSION
        assert await _has_table(pg_dsn, schema, "mailbox")
        assert [e.sequence for e in await stores[1].read("old")] == [0, 1]
        await stores[2].schedule_timer(Timer("old", 2, 1.0, "sleep", "f"))
        assert await stores[3].claim_due_timers(2.0, owner="x", lease=5) == [
            Timer("old", 2, 1.0, "sleep", "f")
        ]
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_a_failed_migration_changes_nothing(pg_dsn: str, schema: str) -> None:
    """Version 2 creates a table and then an index; the index's name is taken, so the second
    statement fails: the table the first one created is rolled back with it."""
    await _version_1_schema(pg_dsn, schema)
    await _sql(pg_dsn, f'CREATE TABLE "{schema}".timers_due (squatter int)')
    with pytest.raises(StorageError, match=r"from schema version 1 to \d+: .* nothing was changed"):
        await PostgresStore.open(pg_dsn, schema=schema)
    assert await _version(pg_dsn, schema) == 1
    assert not await _has_table(pg_dsn, schema, "timers")
    await _sql(pg_dsn, f'DROP TABLE "{schema}".timers_due')
    store = await PostgresStore.open(pg_dsn, schema=schema)
    try:
        assert await _version(pg_dsn, schema) == SCHEMA_VERSION
        assert await _has_table(pg_dsn, schema, "mailbox")
        assert await store.last_sequence("old") == 1
    finally:
        await store.close()


# ---------------------------------------------------------------- runtimes over PostgreSQL


async def test_the_runtimes_own_timer_loop_fires_a_postgres_timer(pg_dsn: str, schema: str) -> None:
    """A runtime over PostgresStore keeps its timers in the database and fires them itself."""
    clock = SkippingClock()
    store = await PostgresStore.open(pg_dsn, schema=schema)
    runtime = loom.WorkflowRuntime(store, clock=clock)
    runtime.register(nap_until)
    try:
        handle = await runtime.start(nap_until, clock.now() + 3600, execution_id="built-in")
        assert (await handle.settled()).status is ExecutionStatus.SUSPENDED
        assert await store.next_timer_due() == clock.now() + 3600
        assert runtime.timers is not None
        clock.advance(3600)
        runtime.timers.kick()
        assert await handle.result(timeout=10) == "woke"
        fired = [e for e in await store.read("built-in") if e.type is EventType.TIMER_FIRED]
        assert len(fired) == 1
        # Completed after the wake returned.
        await until(lambda: _is_none(store.next_timer_due()), "no timer left")
    finally:
        await runtime.close()


async def test_a_due_timer_claimed_before_its_wait_is_logged_still_fires(
    pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A due timer is durable before its wait is logged. A service that claims it in between
    finds no wait yet: it must hand the timer back (EARLY), not delete it as stale. The wake
    is made to run exactly in that window (a barrier, not a sleep)."""
    store = await PostgresStore.open(pg_dsn, schema=schema)
    runtime = loom.WorkflowRuntime(store)
    runtime.register(nap_until)
    assert runtime.timers is not None
    woken = asyncio.Event()
    wake = runtime.timers.wake

    async def wake_then_signal(timer: Timer) -> WakeOutcome:
        try:
            return await wake(timer)
        finally:
            woken.set()

    append = store.append

    async def log_the_wait_after_the_wake(envelopes: Any) -> None:
        if envelopes[0].type is EventType.TIMER_SCHEDULED:
            await asyncio.wait_for(woken.wait(), 10)
        await append(envelopes)

    monkeypatch.setattr(runtime.timers, "wake", wake_then_signal)
    monkeypatch.setattr(store, "append", log_the_wait_after_the_wake)
    try:
        handle = await runtime.start(nap_until, time.time() - 1, execution_id="early-claim")
        assert await handle.result(timeout=3) == "woke"
    finally:
        await runtime.close()


async def _is_none(value: Awaitable[Any]) -> bool:
    return await value is None


async def test_two_timer_service_processes_fire_1000_timers_once_each(
    pg_dsn: str, schema: str
) -> None:
    n = 1000
    ids = [f"nap-{i:04d}" for i in range(n)]
    runtime = loom.WorkflowRuntime(await PostgresStore.open(pg_dsn, schema=schema), timers=False)
    runtime.register(nap_until)
    services: list[Child] = []
    try:
        due = time.time() - 1  # already passed: every timer is due once a service looks
        for chunk in range(0, n, 250):
            handles = await asyncio.gather(
                *(runtime.start(nap_until, due, execution_id=i) for i in ids[chunk : chunk + 250])
            )
            await asyncio.gather(*(h.settled() for h in handles))
        store = runtime.store
        assert isinstance(store, PostgresStore)
        assert await store.next_timer_due() == due

        services = [Child("timer_service", pg_dsn, schema, stdin=True) for _ in range(2)]
        for proc in services:  # the barrier: both are connected and waiting
            await asyncio.to_thread(proc.ready, "ready")
        for proc in services:
            proc.send("go")
        outputs = [await asyncio.to_thread(proc.finish, timeout=60) for proc in services]
        for code, _, err in outputs:
            assert code == 0, err
        reports = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in outputs]

        fired = [eid for report in reports for eid in report["fired"]]
        split = [len(report["fired"]) for report in reports]
        print(
            f"\ntimer services fired {split[0]} + {split[1]} of {n} (claimed "
            f"{reports[0]['claimed']} + {reports[1]['claimed']})"
        )
        duplicated = [eid for eid, k in Counter(fired).items() if k > 1]
        assert not duplicated, duplicated
        assert sorted(fired) == ids
        assert all(k > 0 for k in split), f"one process fired nothing: {split}"

        logs = await asyncio.gather(*(store.read(i) for i in ids))
        for eid, log in zip(ids, logs, strict=True):
            types = [e.type for e in log]
            assert types.count(EventType.TIMER_FIRED) == 1, (eid, types)
            assert types[-1] is EventType.EXECUTION_COMPLETED, (eid, types)
        states = await asyncio.gather(*(runtime.load_state(i) for i in ids))
        assert all(s is not None and s.status is ExecutionStatus.COMPLETED for s in states)
        assert await store.next_timer_due() is None
    finally:
        for proc in services:
            proc.kill()
        await runtime.close()
