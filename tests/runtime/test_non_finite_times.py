"""NaN and infinite times are refused where they are given, before anything is recorded.

``ctx.sleep_until(float("nan"))`` used to reach the store: SQLite refused the timer row
(StorageWriteError, and the execution stopped without an outcome, to fail the same way on every
recovery), an infinite one was stored as a timer before its record was refused, and PostgreSQL
kept a timer that sorts after every time. Now each time-taking API raises ConfigurationError
naming the execution, in the flow, with nothing stored: the flow fails loudly, or goes on if it
catches the error.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import loom
from loom.agents import ApprovalPolicy
from loom.errors import ConfigurationError, ExecutionFailedError, RetryableError
from loom.model import EventType, ExecutionStatus
from loom.storage import TimerStore
from tests.conftest import Backend

BAD = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

WAITS: dict[str, Callable[[loom.WorkflowContext, float], Awaitable[Any]]] = {
    "sleep": lambda ctx, v: ctx.sleep(v),
    "sleep_until": lambda ctx, v: ctx.sleep_until(v),
    "gate_timeout": lambda ctx, v: ctx.suspend("Go", timeout=v),
}


@loom.step(id="mark")
async def mark(what: str) -> str:
    return what


@loom.flow(id="bad-wait", version="1")
async def bad_wait(ctx: loom.WorkflowContext, how: list[str]) -> str:
    wait, value = how
    await ctx.run(mark, "before")
    await WAITS[wait](ctx, BAD[value])
    return "woke"


@loom.flow(id="caught-wait", version="1")
async def caught_wait(ctx: loom.WorkflowContext, how: list[str]) -> str:
    wait, value = how
    try:
        await WAITS[wait](ctx, BAD[value])
    except ConfigurationError as exc:
        caught = str(exc)
    else:
        caught = "nothing"
    # The refused wait took no position: what follows is recorded where it would have been.
    await ctx.sleep(0)
    return await ctx.run(mark, caught)


CASES = [(w, v) for w in WAITS for v in BAD]


@pytest.mark.parametrize(("wait", "value"), CASES)
async def test_a_non_finite_wait_fails_the_flow_loudly_and_stores_nothing(
    backend: Backend, wait: str, value: str
) -> None:
    store = backend.store()
    runtime = loom.WorkflowRuntime(store=store)
    runtime.register(bad_wait)
    eid = f"bad-{wait}-{value}"
    try:
        handle = await runtime.start("bad-wait", [wait, value], execution_id=eid)
        with pytest.raises(ExecutionFailedError) as caught:
            await handle.result(timeout=20)
        error = caught.value.details["error"]
        assert error["type"] == "ConfigurationError", error
        assert error["execution_id"] == eid and "finite" in error["message"], error
        state = await runtime.load_state(eid)
        assert state.status is ExecutionStatus.FAILED
        types = [e.type for e in await store.read(eid)]
        assert EventType.TIMER_SCHEDULED not in types, types
        assert EventType.EXECUTION_SUSPENDED not in types, types
        if isinstance(store, TimerStore):
            assert await store.next_timer_due() is None
    finally:
        await runtime.close()


@pytest.mark.parametrize(("wait", "value"), [("sleep_until", "nan"), ("gate_timeout", "inf")])
async def test_a_flow_that_catches_the_refusal_goes_on_as_if_it_never_waited(
    backend: Backend, wait: str, value: str
) -> None:
    store = backend.store()
    runtime = loom.WorkflowRuntime(store=store)
    runtime.register(caught_wait)
    eid = f"caught-{wait}"
    try:
        handle = await runtime.start("caught-wait", [wait, value], execution_id=eid)
        result = await handle.result(timeout=20)
        assert eid in result and "finite" in result, result
        # Replayed from its log alone, it asks for the same operations in the same places.
        again = loom.WorkflowRuntime(store=backend.store())
        again.register(caught_wait)
        try:
            state = await again.load_state(eid)
            assert state.status is ExecutionStatus.COMPLETED
            assert state.output == result
        finally:
            await again.close()
    finally:
        await runtime.close()


async def test_a_start_deadline_must_be_finite(backend: Backend) -> None:
    runtime = loom.WorkflowRuntime(store=backend.store())
    runtime.register(bad_wait)
    try:
        for value in BAD.values():
            with pytest.raises(ConfigurationError, match="finite"):
                await runtime.start("bad-wait", ["sleep", "nan"], execution_id="dl", deadline=value)
        assert await backend.store().read("dl") == []
    finally:
        await runtime.close()


async def _plain(what: str) -> str:
    return what


async def _flow(ctx: loom.WorkflowContext, what: str) -> str:
    return what


@pytest.mark.parametrize("value", list(BAD.values()), ids=list(BAD))
def test_declared_times_must_be_finite(value: float) -> None:
    for field in ("initial_backoff", "max_backoff", "backoff_multiplier", "jitter"):
        with pytest.raises(ConfigurationError, match="finite"):
            loom.RetryPolicy(**{field: value})
    with pytest.raises(ConfigurationError, match="finite"):
        loom.step(id="slow", timeout=value)(_plain)
    with pytest.raises(ConfigurationError, match="finite"):
        loom.flow(id="graceful", version="1", cancel_grace=value)(_flow)
    with pytest.raises(ConfigurationError, match="finite"):
        ApprovalPolicy(deadline=value)
    if value != -math.inf:  # a negative retry_after was refused already
        with pytest.raises(ValueError, match="finite"):
            RetryableError("busy", retry_after=value)
