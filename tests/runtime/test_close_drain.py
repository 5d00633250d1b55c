"""WorkflowRuntime.close(drain=...) finishes what runs, then stops at a durable boundary (#11)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import loom
from loom.model import ExecutionStatus
from tests.support.poll import until

RAN: Counter[str] = Counter()
GATE = asyncio.Event()


@loom.step(id="held")
async def held() -> int:
    RAN["held"] += 1
    await GATE.wait()
    return 1


@loom.step(id="after")
async def after(x: int) -> int:
    RAN["after"] += 1
    return x + 1


@loom.flow(id="two-steps", version="1")
async def two_steps(ctx: loom.WorkflowContext) -> int:
    return await ctx.run(after, await ctx.run(held))


@pytest.fixture(autouse=True)
def _fresh() -> None:
    global GATE
    GATE = asyncio.Event()
    RAN.clear()


async def test_close_with_a_drain_lets_running_executions_finish() -> None:
    store = loom.InMemoryStore()
    rt = loom.WorkflowRuntime(store)
    rt.register(two_steps)
    await rt.start(two_steps, execution_id="d-1")
    await until(lambda: RAN["held"] == 1, "the step never started")
    closing = asyncio.ensure_future(rt.close(drain=30))
    await asyncio.sleep(0)
    with pytest.raises(loom.LoomError):
        await rt.start(two_steps, execution_id="d-2")  # closed to new work at once
    GATE.set()  # the in-flight step ends within the drain
    await closing
    reader = loom.WorkflowRuntime(store)
    state = await reader.load_state("d-1")
    assert state is not None and state.status is ExecutionStatus.COMPLETED
    assert RAN == {"held": 1, "after": 1}


async def test_past_the_deadline_an_execution_stops_at_its_next_durable_boundary() -> None:
    store = loom.InMemoryStore()
    rt = loom.WorkflowRuntime(store)
    rt.register(two_steps)
    await rt.start(two_steps, execution_id="d-3")
    await until(lambda: RAN["held"] == 1, "the step never started")
    closing = asyncio.ensure_future(rt.close(drain=0.05))
    # The deadline passes with the step still running; it ends after: its result is recorded
    # (the durable boundary), and nothing after it runs.
    await until(lambda: rt._stopping_at_boundary, "the drain deadline never passed")
    GATE.set()
    await closing
    state = await loom.WorkflowRuntime(store).load_state("d-3")
    assert state is not None and state.status is ExecutionStatus.RUNNING  # resumable
    assert state.ops[0].status == "completed" and 1 not in state.ops
    assert RAN == {"held": 1}


async def test_a_step_that_never_ends_does_not_hold_close_forever() -> None:
    store = loom.InMemoryStore()
    rt = loom.WorkflowRuntime(store)
    rt.register(two_steps)
    await rt.start(two_steps, execution_id="d-4")
    await until(lambda: RAN["held"] == 1, "the step never started")
    await asyncio.wait_for(rt.close(drain=0.05), 10)  # bounded: twice the drain, then cancelled
    state = await loom.WorkflowRuntime(store).load_state("d-4")
    assert state is not None and state.status is ExecutionStatus.RUNNING
    assert 0 not in state.ops or state.ops[0].status != "completed"
