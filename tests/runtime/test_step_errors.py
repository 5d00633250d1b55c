"""Step errors a flow can catch by type, and per-step timeouts (issue 19 items 6 and 7)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import loom
from loom.errors import ConfigurationError, StepFailedError
from loom.model import EventType, ExecutionStatus
from loom.testing import SkippingClock
from tests.conftest import Backend


@loom.register_error
class PaymentDeclined(Exception):
    """A business error with JSON fields: the flow catches it by type."""

    def __init__(self, reason: str, amount: int) -> None:
        super().__init__(f"declined: {reason}")
        self.reason = reason
        self.amount = amount


class NotRegistered(Exception):
    pass


CALLS: list[str] = []


@loom.step(id="charge")
async def charge(amount: int) -> str:
    CALLS.append("charge")
    raise PaymentDeclined("insufficient funds", amount)


@loom.step(id="refund-note")
async def refund_note(reason: str) -> str:
    return f"noted: {reason}"


@loom.step(id="plain-failure")
async def plain_failure() -> None:
    raise NotRegistered("nope")


@loom.flow(id="checkout")
async def checkout(ctx: loom.WorkflowContext, amount: int) -> dict[str, Any]:
    try:
        await ctx.run(charge, amount)
    except PaymentDeclined as exc:
        note = await ctx.run(refund_note, exc.reason)
        cause = exc.__cause__
        return {
            "note": note,
            "amount": exc.amount,
            "args": list(exc.args),
            "cause": type(cause).__name__,
            "position": getattr(cause, "details", {}).get("position"),
        }
    return {"note": "paid"}


@loom.flow(id="untyped")
async def untyped(ctx: loom.WorkflowContext) -> str:
    try:
        await ctx.run(plain_failure)
    except StepFailedError as exc:
        return f"caught {exc.error_type}"
    return "no"


async def test_a_registered_error_is_caught_by_type_first_run_and_replay(
    backend: Backend,
) -> None:
    rt = loom.WorkflowRuntime(backend.store(), clock=SkippingClock())
    CALLS.clear()
    handle = await rt.start(checkout, 42, execution_id="co-1")
    first = await handle.result(timeout=10)
    expected = {
        "note": "noted: insufficient funds",
        "amount": 42,
        "args": ["declined: insufficient funds"],
        "cause": "StepFailedError",
        "position": 0,
    }
    assert first == expected
    await rt.close()
    # Replay from the log in a fresh process-like runtime: the same type, fields and cause,
    # and the failed step is not run again.
    from loom.testing import replay_flow

    rt2 = loom.WorkflowRuntime(backend.store(), clock=SkippingClock())
    log = await rt2.store.read("co-1")
    state = await replay_flow(checkout, log)
    assert state.status is ExecutionStatus.COMPLETED and state.output == expected
    assert CALLS == ["charge"]
    failed = next(e for e in log if e.type == EventType.STEP_FAILED)
    assert failed.payload["error"]["registered"].endswith("PaymentDeclined")
    await rt2.close()


async def test_an_unregistered_error_stays_step_failed_with_its_type_named() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore(), clock=SkippingClock())
    handle = await rt.start(untyped, None, execution_id="untyped-1")
    assert await handle.result(timeout=10) == "caught NotRegistered"
    await rt.close()


def test_register_error_refuses_what_cannot_round_trip() -> None:
    with pytest.raises(ConfigurationError):
        loom.register_error(int)  # type: ignore[type-var]

    class Clash(Exception):
        pass

    loom.register_error(name="tests.clash")(Clash)
    with pytest.raises(ConfigurationError):

        @loom.register_error(name="tests.clash")
        class Other(Exception):
            pass


# ------------------------------------------------------------------ per-step timeout

ATTEMPTS: list[int] = []


@loom.step(
    id="sometimes-slow",
    timeout=0.05,
    retry=loom.RetryPolicy(max_attempts=3, initial_backoff=0),
)
async def sometimes_slow() -> str:
    info = loom.current_step()
    assert info is not None
    ATTEMPTS.append(info.attempt)
    if info.attempt < 3:
        await asyncio.sleep(3600)  # only the timeout ends these attempts
    return "third time"


@loom.flow(id="slow-flow")
async def slow_flow(ctx: loom.WorkflowContext) -> str:
    out: str = await ctx.run(sometimes_slow)
    return out


@loom.step(id="always-slow", timeout=0.05)
async def always_slow() -> str:
    await asyncio.sleep(3600)  # only the timeout ends it
    return "never"


@loom.flow(id="always-slow-flow")
async def always_slow_flow(ctx: loom.WorkflowContext) -> str:
    out: str = await ctx.run(always_slow)
    return out


async def test_a_step_attempt_past_its_timeout_is_a_failed_attempt_then_retried() -> None:
    ATTEMPTS.clear()
    rt = loom.WorkflowRuntime(loom.InMemoryStore())
    handle = await rt.start(slow_flow, None, execution_id="slow-1")
    assert await handle.result(timeout=10) == "third time"
    assert ATTEMPTS == [1, 2, 3]
    failures = [e for e in await rt.store.read("slow-1") if e.type == EventType.STEP_FAILED]
    assert [f.payload["attempt"] for f in failures] == [1, 2]
    assert all(f.payload["error"]["type"] == "TimeoutError" for f in failures)
    assert "timed out after 0.05s" in failures[0].payload["error"]["message"]
    await rt.close()


async def test_a_step_that_always_times_out_fails_the_flow_with_a_typed_record() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore())
    handle = await rt.start(always_slow_flow, None, execution_id="slow-2")
    state = await handle.wait_for_completion(timeout=10)
    assert state.status is ExecutionStatus.FAILED
    assert state.error is not None and state.error["type"] == "StepFailedError"
    assert "TimeoutError" in state.error["message"]
    await rt.close()


def test_a_step_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigurationError):
        loom.step(id="bad", timeout=0)(always_slow.fn)


# ------------------------------------------------------------------ execution deadline


@loom.flow(id="waits-forever", resume_schemas={"Approve": dict})
async def waits_forever(ctx: loom.WorkflowContext) -> str:
    await ctx.suspend("Approve")
    return "approved"


@loom.flow(id="quick")
async def quick(ctx: loom.WorkflowContext) -> str:
    return "done"


async def test_an_execution_deadline_cancels_it_with_a_recorded_reason(backend: Backend) -> None:
    from datetime import timedelta

    from loom.errors import ExecutionCancelledError, NotWaitingError
    from loom.testing import TimeSkippingEnvironment

    env = TimeSkippingEnvironment(backend.store())
    handle = await env.runtime.start(
        waits_forever, None, execution_id="dl-1", deadline=timedelta(hours=2)
    )
    state = await handle.wait_for_suspend(timeout=10)
    assert state.metadata["loom.deadline"] == env.clock.now() + 7200
    assert await env.advance(timedelta(hours=1)) == 0  # not due: nothing happens
    assert (await env.runtime.load_state("dl-1")).status is ExecutionStatus.SUSPENDED  # type: ignore[union-attr]
    await env.advance(timedelta(hours=1, seconds=1))
    final = await env.runtime.load_state("dl-1")
    assert final is not None and final.status is ExecutionStatus.CANCELLED
    assert final.cancel_reason is not None and final.cancel_reason.startswith("deadline exceeded")
    with pytest.raises(ExecutionCancelledError):
        await env.runtime.handle("dl-1").result(timeout=10)
    with pytest.raises(NotWaitingError):
        await env.runtime.resume("dl-1", "Approve", {})
    # An execution that ends first is left alone by its deadline.
    done = await env.runtime.start(quick, None, execution_id="dl-2", deadline=60)
    assert await done.result(timeout=10) == "done"
    await env.advance(120)
    ended = await env.runtime.load_state("dl-2")
    assert ended is not None and ended.status is ExecutionStatus.COMPLETED
    with pytest.raises(ConfigurationError):
        await env.runtime.start(quick, None, execution_id="dl-3", deadline=-1)
    await env.close()
