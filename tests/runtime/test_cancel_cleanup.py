"""Cleanup on cancel (issue 19 item 8): a flow with cancel_grace reacts to its cancellation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import loom
from loom.errors import ExecutionCancelledError
from loom.model import EventType, ExecutionStatus
from loom.testing import TimeSkippingEnvironment
from tests.conftest import Backend

EFFECTS: list[str] = []


@loom.step(id="reserve")
async def reserve(item: str) -> str:
    EFFECTS.append(f"reserve {item}")
    return f"r-{item}"


@loom.step(id="release")
async def release(reservation: str) -> str:
    EFFECTS.append(f"release {reservation}")
    return "released"


@loom.flow(id="booking", cancel_grace=timedelta(minutes=5), resume_schemas={"Confirm": dict})
async def booking(ctx: loom.WorkflowContext, item: str) -> str:
    reservation = await ctx.run(reserve, item)
    try:
        await ctx.suspend("Confirm")
    except ExecutionCancelledError:
        await ctx.run(release, reservation)  # the compensating step, recorded like any other
        raise
    return "confirmed"


@loom.flow(id="stubborn", cancel_grace=timedelta(minutes=5), resume_schemas={"Confirm": dict})
async def stubborn(ctx: loom.WorkflowContext, item: str) -> str:
    await ctx.run(reserve, item)
    try:
        await ctx.suspend("Confirm")
    finally:
        await ctx.suspend("OperatorSaysDone")  # a cleanup that never finishes by itself
    return "never"


@loom.flow(id="plain", resume_schemas={"Confirm": dict})
async def plain(ctx: loom.WorkflowContext, item: str) -> str:
    reservation = await ctx.run(reserve, item)
    try:
        await ctx.suspend("Confirm")
    except ExecutionCancelledError:
        await ctx.run(release, reservation)
        raise
    return "confirmed"


@pytest.fixture
async def env(backend: Backend) -> Any:
    e = TimeSkippingEnvironment(backend.store())
    yield e
    await e.close()


async def test_a_cancelled_flow_runs_its_compensating_step_and_ends_cancelled(
    env: TimeSkippingEnvironment,
) -> None:
    EFFECTS.clear()
    rt = env.runtime
    handle = await rt.start(booking, "seat-1", execution_id="book-1")
    await handle.wait_for_suspend(timeout=10)
    requested = await rt.cancel("book-1", reason="customer left")
    assert requested.status is ExecutionStatus.RUNNING  # cleaning up, not ended yet
    with pytest.raises(ExecutionCancelledError):
        await rt.handle("book-1").result(timeout=10)
    state = await rt.load_state("book-1")
    assert state is not None and state.status is ExecutionStatus.CANCELLED
    assert state.cancel_reason == "customer left"
    assert EFFECTS == ["reserve seat-1", "release r-seat-1"]
    types = [e.type for e in await rt.store.read("book-1")]
    assert types[-3:] == [
        "loom.cancel_requested",
        EventType.STEP_COMPLETED,
        EventType.EXECUTION_CANCELLED,
    ]
    # Replaying the log runs nothing again and reaches the same end.
    from loom.testing import replay_flow

    again = await replay_flow(booking, await rt.store.read("book-1"))
    assert again.status is ExecutionStatus.CANCELLED
    assert EFFECTS == ["reserve seat-1", "release r-seat-1"]


async def test_a_cleanup_that_overruns_its_grace_is_cancelled_by_the_timer(
    env: TimeSkippingEnvironment,
) -> None:
    rt = env.runtime
    handle = await rt.start(stubborn, "seat-2", execution_id="book-2")
    await handle.wait_for_suspend(timeout=10)
    await rt.cancel("book-2", reason="timeout")
    state = await rt.handle("book-2").settled(timeout=10)
    assert state.status is ExecutionStatus.SUSPENDED  # the cleanup waits on its own gate
    await env.advance(timedelta(minutes=4))
    assert (await rt.load_state("book-2")).status is ExecutionStatus.SUSPENDED  # type: ignore[union-attr]
    await env.advance(timedelta(minutes=2))
    final = await rt.load_state("book-2")
    assert final is not None and final.status is ExecutionStatus.CANCELLED
    assert final.cancel_reason is not None and "grace period" in final.cancel_reason


async def test_a_second_cancel_stops_a_cleanup_at_once(env: TimeSkippingEnvironment) -> None:
    rt = env.runtime
    handle = await rt.start(stubborn, "seat-3", execution_id="book-3")
    await handle.wait_for_suspend(timeout=10)
    await rt.cancel("book-3", reason="first")
    await rt.handle("book-3").settled(timeout=10)
    final = await rt.cancel("book-3", reason="now")
    assert final.status is ExecutionStatus.CANCELLED and final.cancel_reason == "now"


async def test_a_flow_without_grace_stops_at_once_as_before(env: TimeSkippingEnvironment) -> None:
    EFFECTS.clear()
    rt = env.runtime
    handle = await rt.start(plain, "seat-4", execution_id="book-4")
    await handle.wait_for_suspend(timeout=10)
    final = await rt.cancel("book-4", reason="stop")
    assert final.status is ExecutionStatus.CANCELLED
    assert EFFECTS == ["reserve seat-4"]  # no compensation ran
