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
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import loom
from loom.agents import ApprovalPolicy
from loom.errors import ConfigurationError, ExecutionFailedError, RetryableError
from loom.model import EventType, ExecutionStatus
from loom.runtime.timers import TimerService, WakeOutcome
from loom.storage import PostgresStore, SQLiteStore, Timer, TimerStore
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


# ---------------------------------------------------------------------- naive datetimes

#: Flipped by the replay test: the recorded sleep was scheduled with an aware time, the replay
#: asks with a naive one (as code written before the refusal would).
_SLEEP_AT: dict[str, datetime] = {}


@loom.flow(id="sleep-at", version="1")
async def sleep_at(ctx: loom.WorkflowContext, key: str) -> str:
    await ctx.run(mark, "before")
    await ctx.sleep_until(_SLEEP_AT[key])
    return await ctx.run(mark, "after")


async def test_a_naive_datetime_is_refused_before_anything_is_recorded(backend: Backend) -> None:
    store = backend.store()
    runtime = loom.WorkflowRuntime(store=store)
    runtime.register(sleep_at)
    _SLEEP_AT["naive"] = datetime(2030, 1, 1, 12, 0)
    try:
        handle = await runtime.start("sleep-at", "naive", execution_id="naive")
        with pytest.raises(ExecutionFailedError) as caught:
            await handle.result(timeout=20)
        error = caught.value.details["error"]
        assert error["type"] == "ConfigurationError", error
        assert error["execution_id"] == "naive" and "naive datetime" in error["message"], error
        assert "aware datetime" in error["hint"], error
        types = [e.type for e in await store.read("naive")]
        assert EventType.TIMER_SCHEDULED not in types, types
        if isinstance(store, TimerStore):
            assert await store.next_timer_due() is None
    finally:
        await runtime.close()


async def test_a_sleep_recorded_before_the_refusal_still_replays(backend: Backend) -> None:
    """Only a new timer is refused: a recorded one replays even if the code now passes a
    naive datetime, so an execution in flight across the upgrade is not stranded."""
    runtime = loom.WorkflowRuntime(store=backend.store())
    runtime.register(sleep_at)
    # Far enough ahead that the execution is seen suspended first on a loaded machine (0.3 s
    # was once not, with the whole suite and a benchmark running beside it).
    soon = datetime.now(UTC) + timedelta(seconds=1.5)
    _SLEEP_AT["replayed"] = soon
    try:
        handle = await runtime.start("sleep-at", "replayed", execution_id="replayed")
        state = await runtime.wait("replayed", until="settled", timeout=20)
        assert state.status is ExecutionStatus.SUSPENDED
        _SLEEP_AT["replayed"] = soon.replace(tzinfo=None)
        assert await handle.result(timeout=20) == "after"
    finally:
        await runtime.close()


# ------------------------------------------------------------------- settings in seconds

SETTING_VALUES = [math.nan, math.inf, -1.0]


@pytest.mark.parametrize("value", SETTING_VALUES, ids=["nan", "inf", "negative"])
async def test_a_wait_timeout_must_be_finite(backend: Backend, value: float) -> None:
    """``timeout=nan`` used to wait forever: every comparison with the deadline was false."""
    runtime = loom.WorkflowRuntime(store=backend.store())
    runtime.register(bad_wait)
    try:
        handle = await runtime.start("bad-wait", ["sleep", "nan"], execution_id="t")
        with pytest.raises(ConfigurationError, match="timeout") as caught:
            await handle.result(timeout=value)
        assert caught.value.execution_id == "t"
        with pytest.raises(ConfigurationError, match="timeout"):
            await runtime.wait("t", timeout=value)
    finally:
        await runtime.close()


@pytest.mark.parametrize("value", SETTING_VALUES, ids=["nan", "inf", "negative"])
def test_settings_in_seconds_must_be_finite_and_positive(tmp_path: Any, value: float) -> None:
    db = str(tmp_path / "settings.db")
    with pytest.raises(ConfigurationError, match="lease_ttl"):
        loom.WorkflowRuntime(store=SQLiteStore(db), lease_ttl=value)
    with pytest.raises(ConfigurationError, match="poll_interval"):
        SQLiteStore(db, poll_interval=value)
    with pytest.raises(ConfigurationError, match="busy_timeout"):
        SQLiteStore(db, busy_timeout=value)
    with pytest.raises(ConfigurationError, match="safety_poll_interval"):
        PostgresStore("postgresql://127.0.0.1/none", safety_poll_interval=value)
    store = SQLiteStore(db)
    for setting in ("lease", "poll_interval", "early_retry", "max_early_backoff"):
        with pytest.raises(ConfigurationError, match=setting):
            TimerService(store, _never_woken, **{setting: value})


async def _never_woken(timer: Timer) -> WakeOutcome:
    raise AssertionError(f"no timer is due in this test ({timer})")
