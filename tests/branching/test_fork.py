"""runtime.fork and runtime.promote on SQLite and PostgreSQL (and memory): the parent is never
touched, a branch replays the prefix without effects, lineage, promotion closes the parent's
gate."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import (
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    ForkError,
    GateSupersededError,
    PromotionConflictError,
    RefExistsError,
)
from loom.model import EventType, ExecutionStatus
from loom.storage import InMemoryStore, SQLiteStore, TenantScopedEventStore
from loom.testing import SkippingClock
from tests.branching import flows
from tests.branching.flows import EFFECTS, guarded
from tests.support.pg import require_pg, temp_schema


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "sqlite":
        s = SQLiteStore(tmp_path / "fork.db")
        yield s
        await s.close()
    else:
        dsn = require_pg()
        from loom.storage.postgres import PostgresStore

        async with temp_schema(dsn) as schema:
            s = await PostgresStore.open(dsn, schema=schema)
            yield s
            await s.close()


async def _parent(rt: loom.WorkflowRuntime, eid: str = "parent-1") -> int:
    handle = await rt.start(guarded, 1, execution_id=eid)
    state = await handle.wait_for_suspend(timeout=30)
    assert state.waiting is not None and state.waiting.event_type == "Approve"
    return state.last_sequence


async def test_three_forks_leave_the_parent_untouched_and_replay_without_effects(
    store: Any,
) -> None:
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(guarded)
    EFFECTS.clear()
    gate_seq = await _parent(rt)
    before_log = [(e.envelope_id, e.payload_json) for e in await store.read("parent-1")]
    before = await rt.load_state("parent-1")
    assert before is not None
    timers_before = await store.next_timer_due(prefix="parent-1")
    fence_before = await store.current_fence("parent-1")
    assert timers_before is not None and EFFECTS["prepare"] == 2

    branches = [
        await rt.fork("parent-1", gate_seq, branch=f"sim/{p}", execution_id=f"b-{p}")
        for p in ("a", "b", "c")
    ]
    for b in branches:
        # The prefix is the parent's, byte for byte; then the branch's own records.
        log = await store.read(b.execution_id)
        assert [(e.sequence, e.type, e.payload_json) for e in log[: gate_seq + 1]] == [
            (e.sequence, e.type, e.payload_json) for e in await store.read("parent-1")
        ]
        assert log[gate_seq + 1].type == EventType.EXECUTION_FORKED
        assert log[gate_seq + 1].payload["parent_id"] == "parent-1"
        assert log[gate_seq + 1].payload["at_sequence"] == gate_seq
        assert log[gate_seq + 1].payload["flow_version"] == "1"
        assert b.state.status is ExecutionStatus.SUSPENDED
        assert b.ref is not None and b.ref.tip == b.state.last_sequence
        # Loading reads the seeded snapshot plus the branch's own tail.
        snap = await store.load_snapshot(b.execution_id)
        assert snap is not None and snap.sequence == b.state.last_sequence
    for b, plan in zip(branches, "abc", strict=True):
        handle = await rt.resume(b.execution_id, "Approve", {"plan": plan})
        result = await handle.result(timeout=30)
        assert result == {"out": f"applied {plan}", "prepared": 3, "simulation": False}
    # Steps before the fork point were served from the log; the one after ran once each.
    assert EFFECTS == {"prepare": 2, "apply:a": 1, "apply:b": 1, "apply:c": 1}

    after = await rt.load_state("parent-1")
    assert after is not None
    assert after.last_sequence == before.last_sequence == gate_seq
    assert after.status is ExecutionStatus.SUSPENDED
    assert [(e.envelope_id, e.payload_json) for e in await store.read("parent-1")] == before_log
    assert await store.next_timer_due(prefix="parent-1") == timers_before
    assert await store.current_fence("parent-1") == fence_before

    # Lineage of 4: three branches and a branch of a branch.
    grand = await rt.fork("b-a", gate_seq + 1, execution_id="b-a-again")
    assert grand.state.forked_from is not None
    kids = await store.children("parent-1")
    assert [k.execution_id for k in kids] == ["b-a", "b-b", "b-c", "b-a-again"]
    assert [k.forked_from for k in kids] == ["parent-1"] * 3 + ["b-a"]

    # Promote one: the parent's gate is closed on its log; approving it is refused.
    await store.put_ref("main", "parent-1", gate_seq)
    moved = await rt.promote("sim/b", "main", by="ann", reason="cheapest")
    assert (moved.execution_id, moved.updated_by, moved.promoted_from) == ("b-b", "ann", "sim/b")
    with pytest.raises(GateSupersededError) as info:
        await rt.resume("parent-1", "Approve", {"plan": "x"})
    assert info.value.superseded_by == "b-b" and info.value.execution_id == "parent-1"
    parent = await rt.load_state("parent-1")
    assert parent is not None and parent.status is ExecutionStatus.CANCELLED
    assert await store.next_timer_due(prefix="parent-1") is None
    # The other branches forked at that gate can no longer be promoted.
    with pytest.raises(PromotionConflictError):
        await rt.promote("sim/c", "main", by="bob")
    main = await store.get_ref("main")
    assert main is not None and main.execution_id == "b-b"
    assert EFFECTS["apply:x"] == 0
    await rt.close()


async def test_a_fork_at_a_gate_reopens_it_with_a_fresh_deadline(store: Any) -> None:
    clock = SkippingClock(start=1_000_000.0)
    rt = loom.WorkflowRuntime(store, timers=False, clock=clock)
    rt.register(guarded)
    gate_seq = await _parent(rt)
    parent = await rt.load_state("parent-1")
    assert parent is not None and parent.waiting is not None
    assert parent.waiting.timeout_at == 1_000_000.0 + 3600
    clock.advance(7200)  # the parent's gate has timed out meanwhile (no timer service runs)
    b = await rt.fork("parent-1", gate_seq, execution_id="late")
    assert b.state.waiting is not None
    assert b.state.waiting.timeout_at == 1_000_000.0 + 7200 + 3600
    assert await store.next_timer_due(prefix="late") == b.state.waiting.timeout_at
    # The branch takes a decision the parent can no longer take.
    result = await (await rt.resume("late", "Approve", {"plan": "z"})).result(timeout=30)
    assert result["out"] == "applied z"
    await rt.close()


async def test_refused_forks_write_nothing(store: Any) -> None:
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(guarded, flows.slow_flow)
    gate_seq = await _parent(rt)
    with pytest.raises(ForkError) as past:
        await rt.fork("parent-1", gate_seq + 1)
    assert past.value.head == gate_seq and past.value.execution_id == "parent-1"
    with pytest.raises(ForkError):
        await rt.fork("parent-1", -1)
    with pytest.raises(ExecutionNotFoundError):
        await rt.fork("nobody", 0)
    await rt.fork("parent-1", 1, execution_id="taken")
    with pytest.raises(ExecutionAlreadyExistsError):
        await rt.fork("parent-1", 2, execution_id="taken")
    await rt.fork("parent-1", 1, branch="named", execution_id="named-1")
    with pytest.raises(RefExistsError):
        await rt.fork("parent-1", 2, branch="named", execution_id="named-2")
    # Inside a step: its attempt started and has no record yet.
    flows.RELEASE = asyncio.Event()
    handle = await rt.start(flows.slow_flow, 5, execution_id="slow-1")
    while await store.last_sequence("slow-1") < 1:
        await store.wait_for_append("slow-1", 0, timeout=5)
    with pytest.raises(ForkError, match="inside step 'slow'"):
        await rt.fork("slow-1", 1)
    flows.RELEASE.set()
    assert await handle.result(timeout=30) == 5
    with pytest.raises(ForkError, match="its end"):
        await rt.fork("slow-1")
    ids = [i async for i in store.iterate_execution_ids()]
    assert sorted(ids) == ["named-1", "parent-1", "slow-1", "taken"]
    await rt.close()


async def test_a_branch_forked_between_steps_runs_on_by_recovery(store: Any) -> None:
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(guarded)
    EFFECTS.clear()
    await _parent(rt)
    # Sequence 1 is the first step's record: the branch re-runs only the second step.
    b = await rt.fork("parent-1", 1, execution_id="mid")
    assert b.state.status is ExecutionStatus.RUNNING
    handle = await rt.recover("mid")
    state = await handle.wait_for_suspend(timeout=30)
    assert state.waiting is not None and EFFECTS["prepare"] == 3
    await rt.close()


async def test_forks_stay_inside_their_tenant() -> None:
    physical = InMemoryStore()
    acme = loom.WorkflowRuntime(TenantScopedEventStore(physical, "acme"), timers=False)
    globex = loom.WorkflowRuntime(TenantScopedEventStore(physical, "globex"), timers=False)
    for rt in (acme, globex):
        rt.register(guarded)
    gate_seq = await _parent(acme, "p")
    with pytest.raises(ExecutionNotFoundError):
        await globex.fork("p", gate_seq)
    b = await acme.fork("p", gate_seq, branch="sim/x", execution_id="bx")
    assert b.ref is not None and b.ref.forked_from == "p"
    assert [k.execution_id for k in await acme.store.children("p")] == ["bx"]  # type: ignore[attr-defined]
    assert await globex.store.children("p") == []  # type: ignore[attr-defined]
    assert await physical.get_ref("acme:sim/x") is not None
    assert physical.last_sequence  # the physical store holds only scoped ids
    assert sorted([i async for i in physical.iterate_execution_ids()]) == ["acme:bx", "acme:p"]
    await acme.close()
    await globex.close()
