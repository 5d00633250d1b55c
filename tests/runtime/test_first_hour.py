"""Library-side items of the first-hour pass: direct step calls, logging, retries, start
attach, storability, bad input, HTTP resume of the wrong event type."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path

import pydantic
import pytest

import loom
from loom.errors import (
    ConfigurationError,
    ExecutionAlreadyExistsError,
    InvalidInputError,
    NotWaitingError,
    StepFailedError,
)

calls: list[str] = []


class Opaque:
    """Not something pydantic can serialise."""


class Job(pydantic.BaseModel):
    table: str
    rows: int


@loom.step(id="effect")
async def effect(x: int) -> int:
    calls.append(f"effect {x}")
    return x * 2


def _store(tmp_path: Path) -> loom.SQLiteStore:
    return loom.SQLiteStore(tmp_path / "loom.db")


def test_a_step_called_directly_in_a_flow_is_recorded_once(tmp_path: Path) -> None:
    @loom.flow(id="direct")
    async def direct(ctx: loom.WorkflowContext, x: int) -> int:
        a = await effect(x)  # no ctx.run: still the durable call
        b = await ctx.run(effect, a)
        await ctx.suspend("Go")
        return b

    calls.clear()

    async def go() -> None:
        async with loom.WorkflowRuntime(_store(tmp_path)) as rt:
            rt.register(direct)
            await (await rt.start(direct, 3, execution_id="d1")).wait_for_suspend(timeout=10)
            events = [e.type.value for e in await rt.store.read("d1")]
            assert events.count("STEP_COMPLETED") == 2
            # Replay after the gate re-walks both calls from the log: no effect runs again.
            assert await (await rt.resume("d1", "Go")).result(timeout=10) == 12
        assert calls == ["effect 3", "effect 6"]
        assert await effect(5) == 10  # outside a flow it just runs

    asyncio.run(go())


def test_failures_retries_and_recoveries_are_logged_with_the_execution_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[int] = []

    @loom.step(id="flaky", retry=loom.RetryPolicy(max_attempts=2, initial_backoff=0))
    async def flaky() -> int:
        attempts.append(1)
        raise ValueError("boom")

    @loom.flow(id="doomed")
    async def doomed(ctx: loom.WorkflowContext) -> int:
        return await ctx.run(flaky)

    @loom.flow(id="paused")
    async def paused(ctx: loom.WorkflowContext) -> str:
        await ctx.suspend("Go")
        return "ok"

    caplog.set_level(logging.DEBUG, logger="loom")

    async def go() -> None:
        async with loom.WorkflowRuntime(_store(tmp_path)) as rt:
            rt.register(doomed, paused)
            with pytest.raises(loom.ExecutionFailedError):
                await (await rt.start(doomed, execution_id="f1")).result(timeout=10)
            # A running execution with no holder (as after a crash) is recovered.
            await (await rt.start(paused, execution_id="p1")).wait_for_suspend(timeout=10)
            await (await rt.resume("p1", "Go")).result(timeout=10)

    asyncio.run(go())
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("f1" in r.getMessage() for r in warnings)
    assert "will retry" in warnings[0].getMessage() and "final" in warnings[1].getMessage()
    assert all(getattr(r, "execution_id", None) == "f1" for r in warnings)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.name for r in errors] == ["loom.runtime"] and "f1" in errors[0].getMessage()
    assert "ValueError: boom" in errors[0].getMessage()


def test_recovery_is_logged_at_info(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    entered = asyncio.Event()
    hold = [True]

    @loom.step(id="blocking")
    async def blocking() -> str:
        entered.set()
        if hold[0]:
            await asyncio.Event().wait()  # until the runtime closes under it
        return "done"

    @loom.flow(id="held")
    async def held(ctx: loom.WorkflowContext) -> str:
        return await ctx.run(blocking)

    caplog.set_level(logging.INFO, logger="loom")

    async def go() -> None:
        async with loom.WorkflowRuntime(_store(tmp_path)) as rt:
            rt.register(held)
            await rt.start(held, execution_id="r1")
            await asyncio.wait_for(entered.wait(), 10)
        hold[0] = False  # closed mid-step: left running, as after a crash
        async with loom.WorkflowRuntime(_store(tmp_path)) as rt:
            rt.register(held)
            assert await (await rt.recover("r1")).result(timeout=10) == "done"

    asyncio.run(go())
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    recovered = [r for r in infos if "recovered execution r1" in r.getMessage()]
    assert recovered and getattr(recovered[0], "execution_id", None) == "r1"


def test_retry_jitter_and_the_original_exception_type(tmp_path: Path) -> None:
    policy = loom.RetryPolicy(max_attempts=5, initial_backoff=1.0, jitter=0.5)
    delays = {policy.backoff(1) for _ in range(50)}
    assert len(delays) > 1 and all(0.5 <= d <= 1.5 for d in delays)
    assert loom.RetryPolicy(initial_backoff=1.0).backoff(1) == 1.0
    with pytest.raises(ConfigurationError):
        loom.RetryPolicy(jitter=2)

    @loom.step(id="bad-value")
    async def bad_value() -> int:
        raise ValueError("not a number")

    seen: list[tuple[str | None, bool, bool]] = []

    @loom.flow(id="typed")
    async def typed(ctx: loom.WorkflowContext) -> str:
        try:
            await ctx.run(bad_value)
        except StepFailedError as exc:
            seen.append((exc.error_type, exc.caused_by(ValueError), exc.caused_by(TimeoutError)))
        await ctx.suspend("Go")
        return "ok"

    async def go() -> None:
        async with loom.WorkflowRuntime(_store(tmp_path)) as rt:
            rt.register(typed)
            await (await rt.start(typed, execution_id="t1")).wait_for_suspend(timeout=10)
            await (await rt.resume("t1", "Go")).result(timeout=10)  # replays the failure

    asyncio.run(go())
    assert seen == [("ValueError", True, False)] * 2


def test_storability_is_checked_before_the_effect_or_hinted(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot store"):

        @loom.step(id="opaque")
        async def opaque() -> Opaque:
            return Opaque()

    @loom.step(id="when")
    async def when() -> datetime:  # annotated: stored as ISO text, reloaded as a datetime
        return datetime(2026, 1, 1, tzinfo=UTC)

    @loom.step(id="unannotated")
    async def unannotated():  # type: ignore[no-untyped-def]
        return datetime(2026, 1, 1, tzinfo=UTC)

    @loom.flow(id="times")
    async def times(ctx: loom.WorkflowContext) -> str:
        first = await ctx.run(when)
        assert isinstance(first, datetime)
        await ctx.run(unannotated)
        return "unreachable"

    async def go() -> None:
        async with loom.WorkflowRuntime(_store(tmp_path)) as rt:
            rt.register(times)
            with pytest.raises(loom.ExecutionFailedError) as info:
                await (await rt.start(times, execution_id="s1")).result(timeout=10)
            assert "Annotate the step's return type" in str(info.value.details)

    asyncio.run(go())


def test_bad_input_is_one_line_without_an_execution_id() -> None:
    @loom.flow(id="typed-input")
    async def typed_input(ctx: loom.WorkflowContext, job: Job) -> int:
        return job.rows

    with pytest.raises(InvalidInputError) as info:
        typed_input.encode_input({"rows": "many"}, "x1")
    text = str(info.value)
    assert "\n" not in text and "x1" not in text and info.value.execution_id == "x1"
    assert "table: Field required" in text and "rows: Input should be a valid integer" in text


def test_start_attach_executes_once(tmp_path: Path) -> None:
    @loom.flow(id="once")
    async def once(ctx: loom.WorkflowContext, x: int) -> int:
        return await ctx.run(effect, x)

    @loom.flow(id="other")
    async def other(ctx: loom.WorkflowContext) -> None:
        return None

    calls.clear()

    async def go() -> None:
        async with loom.WorkflowRuntime(_store(tmp_path)) as rt:
            rt.register(once, other)
            first = await (await rt.start(once, 1, execution_id="a1")).result(timeout=10)
            again = await rt.start(once, 1, execution_id="a1", if_exists="attach")
            assert await again.result(timeout=10) == first == 2
            with pytest.raises(ExecutionAlreadyExistsError) as info:
                await rt.start(once, 1, execution_id="a1")
            assert "runtime.handle(id).result()" in str(info.value)
            assert "load_state" not in str(info.value)
            with pytest.raises(ExecutionAlreadyExistsError, match="runs flow 'once'"):
                await rt.start(other, execution_id="a1", if_exists="attach")
        assert calls == ["effect 1"]

    asyncio.run(go())


def test_resume_package_of_the_wrong_event_type_is_refused(tmp_path: Path) -> None:
    from loom.placement import ExecutionPackage, LocalWorkerRuntime
    from loom.placement._wire import ResumeEvent

    @loom.flow(id="gated")
    async def gated(ctx: loom.WorkflowContext) -> str:
        await ctx.suspend("Approved")
        return "ok"

    async def go() -> None:
        async with loom.WorkflowRuntime(_store(tmp_path)) as rt:
            rt.register(gated)
            await (await rt.start(gated, execution_id="g1")).wait_for_suspend(timeout=10)
            worker = LocalWorkerRuntime(rt)

            def package(event: str) -> ExecutionPackage:
                return ExecutionPackage(
                    execution_id="g1",
                    flow_id="gated",
                    flow_version="1",
                    resume_event=ResumeEvent(event, None),
                )

            typo = package("Aproved")
            lease = await worker.allocate(typo)
            with pytest.raises(NotWaitingError, match="not 'Aproved'"):
                await worker.execute(lease, typo)
            good = package("Approved")
            lease = await worker.allocate(good)
            assert (await worker.execute(lease, good)).status == "completed"
            # The same decision again (a lost response redispatched) still reports, 200.
            lease = await worker.allocate(good)
            assert (await worker.execute(lease, good)).status == "completed"

    asyncio.run(go())
