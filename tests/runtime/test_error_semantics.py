"""Retry semantics live in the error types, errors carry typed attributes, and every LoomError
subclass round-trips through the JSON recorded in the log (old records included)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import loom
from loom.errors import (
    LoomError,
    NonDeterminismError,
    RetryableError,
    StaleFenceError,
    StepFailedError,
    StorageError,
    StorageWriteError,
    TerminalError,
    WriteOutcome,
    error_from_dict,
)
from loom.model import EventType
from loom.testing import TimeSkippingEnvironment
from tests.conftest import Backend


class CardDeclined(TerminalError):
    """A user's own terminal failure."""


calls: dict[str, int] = {}


@loom.step(id="declines", retry=loom.RetryPolicy(max_attempts=5))
async def declines() -> None:
    calls["declines"] = calls.get("declines", 0) + 1
    raise CardDeclined("card declined", reason="insufficient funds")


@loom.step(id="throttled", retry=loom.RetryPolicy(max_attempts=4, initial_backoff=1.0))
async def throttled() -> str:
    calls["throttled"] = calls.get("throttled", 0) + 1
    if calls["throttled"] == 1:
        raise RetryableError("429", retry_after=timedelta(seconds=7))
    if calls["throttled"] == 2:
        raise RetryableError("503")  # no retry_after: the policy's backoff (2nd attempt: 2 s)
    return "ok"


@loom.step(id="retryable-once")
async def retryable_once() -> None:
    raise RetryableError("still bounded by max_attempts", retry_after=1)


@loom.flow(id="semantics")
async def semantics(ctx: loom.WorkflowContext) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        await ctx.run(declines)
    except StepFailedError as exc:
        out["declined"] = (exc.attempts, exc.error and exc.error["type"])
    out["throttled"] = await ctx.run(throttled)
    try:
        await ctx.run(retryable_once)
    except StepFailedError as exc:
        out["once"] = exc.attempts
    return out


async def test_the_error_decides_whether_and_when_a_step_is_retried(backend: Backend) -> None:
    calls.clear()
    env = TimeSkippingEnvironment(backend.store())
    env.runtime.register(semantics)
    handle = await env.runtime.start(semantics, execution_id="sem")
    assert await env.result(handle) == {
        "declined": [1, "CardDeclined"],
        "throttled": "ok",
        "once": 1,
    }
    # TerminalError: one attempt although the policy allows five.
    assert calls["declines"] == 1
    # retry_after replaced the backoff (1 s) for the first retry; the second used the policy.
    assert env.clock.slept == [7.0, 2.0]
    failed = [
        (e.payload["step_id"], e.payload["final"])
        for e in await env.runtime.store.read("sem")
        if e.type is EventType.STEP_FAILED
    ]
    assert failed == [
        ("declines", True),
        ("throttled", False),
        ("throttled", False),
        ("retryable-once", True),
    ]
    await env.close()


def test_retry_after_is_typed_and_recorded() -> None:
    err = RetryableError("slow down", retry_after=timedelta(minutes=1), execution_id="e")
    assert err.retry_after == 60.0 and err.to_dict()["details"] == {"retry_after": 60.0}
    back = error_from_dict(err.to_dict())
    assert isinstance(back, RetryableError) and back.retry_after == 60.0
    assert RetryableError("x").retry_after is None
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError):
            RetryableError("x", retry_after=bad)
    assert loom.RetryPolicy(initial_backoff=3).delay(err, 1) == 60.0
    assert loom.RetryPolicy(initial_backoff=3).delay(RuntimeError(), 1) == 3.0


def test_a_users_subclass_round_trips_and_cannot_shadow_loom_s_own() -> None:
    err = CardDeclined("declined", execution_id="e", reason="funds")
    back = error_from_dict(err.to_dict())
    assert type(back) is CardDeclined and back.details == {"reason": "funds"}

    class StorageError(LoomError):  # same name as Loom's own: Loom's stays registered
        pass

    rebuilt = error_from_dict({"type": "StorageError", "message": "m", "details": {}})
    assert type(rebuilt) is loom.errors.StorageError and type(rebuilt) is not StorageError


def test_storage_write_outcome_is_an_enum_and_old_records_read_the_same() -> None:
    plain = StorageWriteError("not written", execution_id="e")
    assert plain.outcome is WriteOutcome.NOT_APPLIED
    assert "outcome" not in plain.to_dict()["details"]  # the recorded JSON is unchanged
    # A record written before the enum existed:
    recorded = {
        "type": "StorageWriteError",
        "code": "storage_write",
        "message": "the connection was lost while committing",
        "execution_id": "e",
        "hint": None,
        "details": {"outcome": "unknown"},
    }
    back = error_from_dict(recorded)
    assert isinstance(back, StorageWriteError) and back.outcome is WriteOutcome.UNKNOWN
    assert back.to_dict() == recorded
    committed = StorageWriteError("acked late", outcome=WriteOutcome.COMMITTED)
    assert committed.to_dict()["details"] == {"outcome": "committed"}


def test_typed_attributes_mirror_the_recorded_details() -> None:
    recorded = {
        "type": "StaleFenceError",
        "code": "stale_fence",
        "message": "fence 1 is stale",
        "execution_id": "e",
        "hint": None,
        "details": {"fence": 1, "current_fence": 2},
    }
    err = error_from_dict(recorded)
    assert isinstance(err, StaleFenceError) and (err.fence, err.current_fence) == (1, 2)
    assert isinstance(err, StorageError) and err.to_dict() == recorded
    nd = NonDeterminismError("diverged", position=3, recorded="step:a", requested="step:b")
    assert (nd.position, nd.recorded, nd.requested) == (3, "step:a", "step:b")
    failed = StepFailedError("x", step_id="s", position=0, attempts=2, error={"type": "E"})
    assert (failed.step_id, failed.attempts, failed.error) == ("s", 2, {"type": "E"})


@pytest.mark.parametrize(
    "details",
    [{"outcome": "sideways"}, {"message": "dup", "hint": 3}, {"retry_after": "soon"}],
)
def test_details_a_class_cannot_take_still_decode(details: dict[str, Any]) -> None:
    for name in ("StorageWriteError", "RetryableError", "StaleFenceError"):
        err = error_from_dict({"type": name, "message": "m", "details": details})
        assert isinstance(err, LoomError) and err.message == "m"
