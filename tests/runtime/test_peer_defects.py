"""Issue 19's three defects, each reproduced exactly as the peers' test suites found it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import loom
from loom.errors import (
    ConcurrentWaitError,
    ExecutionCancelledError,
    ExecutionEndedError,
    ExecutionFailedError,
    NotWaitingError,
)
from loom.model import EventType, ExecutionStatus
from loom.runtime.recovery import recover_abandoned
from loom.testing import SkippingClock
from tests.conftest import Backend


@pytest.fixture
async def runtime(backend: Backend) -> Any:
    rt = loom.WorkflowRuntime(backend.store(), clock=SkippingClock())
    yield rt
    await rt.close()


# ---------------------------------------------------------------- 1: two gates awaited at once


@loom.flow(id="two-gates")
async def two_gates(ctx: loom.WorkflowContext) -> Any:
    a, b = await asyncio.gather(ctx.suspend("A"), ctx.suspend("B"))
    return [a, b]


async def test_two_gates_at_once_are_refused_loudly_never_stuck(
    runtime: loom.WorkflowRuntime,
) -> None:
    handle = await runtime.start(two_gates, None, execution_id="two-gates-1")
    state = await handle.settled(timeout=10)
    # Refused at the point it happens: the execution fails with a typed error naming both
    # waits; it is never left running with nothing waiting.
    assert state.status is ExecutionStatus.FAILED
    assert state.error is not None and state.error["type"] == "ConcurrentWaitError"
    assert "'A'" in state.error["message"] and "'B'" in state.error["message"]
    with pytest.raises(ExecutionFailedError):
        await handle.result()
    with pytest.raises(NotWaitingError):
        await runtime.resume("two-gates-1", "A", None)
    with pytest.raises(NotWaitingError):
        await runtime.resume("two-gates-1", "B", None)
    await runtime.recover("two-gates-1")
    await recover_abandoned(runtime, is_abandoned=lambda s: True)
    final = await runtime.load_state("two-gates-1")
    assert final is not None and final.status is ExecutionStatus.FAILED
    assert ConcurrentWaitError.code == "concurrent_wait"


@loom.flow(id="gate-and-sleep")
async def gate_and_sleep(ctx: loom.WorkflowContext) -> Any:
    await asyncio.gather(ctx.sleep(60), ctx.suspend("A"))
    return "unreachable"


async def test_a_gate_and_a_sleep_at_once_are_refused_too(runtime: loom.WorkflowRuntime) -> None:
    handle = await runtime.start(gate_and_sleep, None, execution_id="gate-sleep-1")
    state = await handle.settled(timeout=10)
    assert state.status is ExecutionStatus.FAILED
    assert state.error is not None and state.error["type"] == "ConcurrentWaitError"


# ------------------------------------------- 2: a gathered step writing past the terminal event

SLOW_RELEASE: dict[str, asyncio.Event] = {}
SLOW_RAN: list[str] = []


@loom.step(id="slow-ok")
async def slow_ok(key: str) -> str:
    await SLOW_RELEASE[key].wait()
    SLOW_RAN.append(key)
    return "ok"


@loom.step(id="fails", retry=loom.RetryPolicy(max_attempts=2, initial_backoff=0))
async def fails(key: str) -> str:
    raise ValueError(f"boom {key}")


@loom.flow(id="gather-fail")
async def gather_fail(ctx: loom.WorkflowContext, key: str) -> Any:
    return await asyncio.gather(ctx.run(slow_ok, key), ctx.run(fails, key))


async def test_a_gathered_step_never_writes_past_the_terminal_event(
    runtime: loom.WorkflowRuntime,
) -> None:
    key = "gf-1"
    SLOW_RELEASE[key] = asyncio.Event()
    handle = await runtime.start(gather_fail, key, execution_id=key)
    with pytest.raises(ExecutionFailedError):
        await handle.result(timeout=10)
    SLOW_RELEASE[key].set()  # the slow step would now finish, if it were still running
    for _ in range(20):
        await asyncio.sleep(0)
    types = [e.type for e in await runtime.store.read(key)]
    assert types[-1] == EventType.EXECUTION_FAILED, types
    assert types.count(EventType.STEP_FAILED) == 2
    assert EventType.STEP_COMPLETED not in types
    assert key not in SLOW_RAN  # the flow's remaining work was stopped before the terminal event
    state = await runtime.load_state(key)
    assert state is not None and state.status is ExecutionStatus.FAILED
    with pytest.raises(ExecutionFailedError):
        await runtime.handle(key).result()
    assert [s.execution_id async for s in runtime.executions()] == [key]


async def test_the_store_refuses_an_append_after_the_terminal_event(
    runtime: loom.WorkflowRuntime,
) -> None:
    @loom.flow(id="done-quickly")
    async def done_quickly(ctx: loom.WorkflowContext) -> str:
        return "done"

    handle = await runtime.start(done_quickly, None, execution_id="ended-1")
    assert await handle.result() == "done"
    state = await runtime.load_state("ended-1")
    assert state is not None
    late = loom.Envelope.create(
        "ended-1",
        state.last_sequence + 1,
        EventType.STEP_COMPLETED,
        {"position": 0, "step_id": "x", "attempt": 1, "output": None},
        fence=state.fence,
        recorded_at=0.0,
    )
    before = await runtime.store.read("ended-1")
    with pytest.raises(ExecutionEndedError) as info:
        await runtime.store.append([late])
    assert info.value.execution_id == "ended-1"
    assert await runtime.store.read("ended-1") == before


# --------------------------------------------------------- 3: cancel right after start


@loom.flow(id="busy")
async def busy(ctx: loom.WorkflowContext, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.run(add_one, i)
    return total


@loom.step(id="add-one")
async def add_one(i: int) -> int:
    return i + 1


@pytest.mark.parametrize("attempt", range(10))
async def test_cancel_right_after_start_reports_the_cancellation(
    runtime: loom.WorkflowRuntime, attempt: int
) -> None:
    eid = f"cancel-early-{attempt}"
    # Long enough that the cancel (one state read, then the fencing write) lands while it
    # runs even on a loaded machine: with 50 steps a slow read let the flow finish first.
    handle = await runtime.start(busy, 5_000, execution_id=eid)
    await runtime.cancel(eid, reason="operator")
    with pytest.raises(ExecutionCancelledError):
        await handle.result(timeout=10)
    with pytest.raises(ExecutionCancelledError):
        await runtime.handle(eid).result(timeout=10)
    state = await runtime.load_state(eid)
    assert state is not None and state.status is ExecutionStatus.CANCELLED
