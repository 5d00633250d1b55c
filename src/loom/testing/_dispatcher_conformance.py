"""The dispatcher conformance kit (Dispatcher SPI 1.1.0).

    from loom.testing import run_execution_dispatcher_conformance
    await run_execution_dispatcher_conformance(lambda worker: MyDispatcher(worker),
                                               over_worker=True)

``make_dispatcher(worker)`` builds the dispatcher under test around the given WorkerRuntime.
The general cases hand it a real LocalWorkerRuntime over an in-memory store. ``over_worker=True``
adds the cases that script the worker (superseded refusals, genuine failures); they need a
dispatcher that retries (at least 2 attempts or restarts).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from loom.errors import (
    ExecutionAlreadyExistsError,
    StaleFenceError,
    StorageWriteError,
)
from loom.model import EventType, ExecutionStatus
from loom.placement import (
    ExecutionDispatcher,
    ExecutionPackage,
    ExecutionResult,
    Health,
    LocalWorkerRuntime,
    ResumeEvent,
    WorkerLease,
    WorkerRuntime,
    is_superseded_refusal,
)
from loom.runtime import WorkflowContext, WorkflowRuntime, flow, step
from loom.storage import InMemoryStore

__all__ = ["DISPATCHER_CHECKS", "run_execution_dispatcher_conformance"]

MakeDispatcher = Callable[[WorkerRuntime], ExecutionDispatcher]
DispatcherCheck = Callable[[MakeDispatcher], Awaitable[None]]
DISPATCHER_CHECKS: dict[str, tuple[bool, DispatcherCheck]] = {}


def _check(over_worker: bool) -> Callable[[DispatcherCheck], DispatcherCheck]:
    def register(fn: DispatcherCheck) -> DispatcherCheck:
        DISPATCHER_CHECKS[fn.__name__.removeprefix("check_")] = (over_worker, fn)
        return fn

    return register


class _Kit:
    """A runtime with flows whose effects are counted."""

    def __init__(self) -> None:
        self.effects: dict[str, int] = {}
        self.runtime = WorkflowRuntime(InMemoryStore())

        @step(id="count")
        async def count(name: str) -> str:
            self.effects[name] = self.effects.get(name, 0) + 1
            return name

        @flow(id="kit-two-gates", version="1")
        async def two_gates(ctx: WorkflowContext, n: int) -> int:
            await ctx.run(count, "before")
            first = await ctx.suspend("First")
            await ctx.run(count, "between")
            second = await ctx.suspend("Second")
            await ctx.run(count, "after")
            return n + int(first) + int(second)

        @flow(id="kit-fails", version="1")
        async def fails(ctx: WorkflowContext) -> None:
            await ctx.run(count, "doomed")
            raise RuntimeError("flow-level failure")

        self.runtime.register(two_gates, fails)
        self.worker = LocalWorkerRuntime(self.runtime)


@_check(over_worker=False)
async def check_suspend_is_a_result_and_resume_is_a_fresh_dispatch(make: MakeDispatcher) -> None:
    kit = _Kit()
    d = make(kit.worker)
    pkg = ExecutionPackage(execution_id="k1", flow_id="kit-two-gates", input=1)
    first = await d.dispatch(pkg)
    assert first.status is ExecutionStatus.SUSPENDED, first.status
    assert first.folded.waiting is not None and first.folded.waiting.event_type == "First"
    second = await d.dispatch(
        ExecutionPackage(
            execution_id="k1", flow_id="kit-two-gates", resume_event=ResumeEvent("First", 10)
        )
    )
    assert second.status is ExecutionStatus.SUSPENDED
    assert second.folded.waiting is not None and second.folded.waiting.event_type == "Second"
    done = await d.dispatch(
        ExecutionPackage(
            execution_id="k1", flow_id="kit-two-gates", resume_event=ResumeEvent("Second", 100)
        )
    )
    assert done.status is ExecutionStatus.COMPLETED and done.output == 111
    assert done.last_sequence == await kit.runtime.store.last_sequence("k1")
    assert kit.effects == {"before": 1, "between": 1, "after": 1}
    await kit.runtime.close()


@_check(over_worker=False)
async def check_lost_response_redispatch_is_idempotent(make: MakeDispatcher) -> None:
    kit = _Kit()
    d = make(kit.worker)
    pkg = ExecutionPackage(execution_id="k2", flow_id="kit-two-gates", input=1)
    await d.dispatch(pkg)
    before = await kit.runtime.store.read("k2")
    again = await d.dispatch(pkg)  # the caller never saw the first response
    assert again.status is ExecutionStatus.SUSPENDED
    after = await kit.runtime.store.read("k2")
    assert [e.type for e in after if e.type is EventType.EXECUTION_STARTED] == [
        EventType.EXECUTION_STARTED
    ]
    assert len(after) == len(before) and kit.effects == {"before": 1}
    resume = ExecutionPackage(
        execution_id="k2", flow_id="kit-two-gates", resume_event=ResumeEvent("First", 1)
    )
    await d.dispatch(resume)
    replayed = await d.dispatch(resume)  # the resume's response was lost too
    assert replayed.status is ExecutionStatus.SUSPENDED
    assert kit.effects == {"before": 1, "between": 1}
    await kit.runtime.close()


@_check(over_worker=False)
async def check_flow_failure_is_an_outcome(make: MakeDispatcher) -> None:
    kit = _Kit()
    d = make(kit.worker)
    result = await d.dispatch(ExecutionPackage(execution_id="k3", flow_id="kit-fails"))
    assert result.status is ExecutionStatus.FAILED
    assert result.error is not None and "flow-level failure" in result.error["message"]
    assert kit.effects == {"doomed": 1}  # returned, never retried
    health = await d.health()
    assert isinstance(health, Health) and health.healthy
    assert d.spi_version == "1.1.0"
    await kit.runtime.close()


class _ScriptedWorker:
    """A worker whose execute raises the scripted errors in turn, then delegates."""

    def __init__(self, inner: WorkerRuntime, errors: list[BaseException]) -> None:
        self.inner = inner
        self.errors = list(errors)
        self.executions = 0

    async def allocate(self, package: ExecutionPackage) -> WorkerLease:
        return await self.inner.allocate(package)

    async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
        self.executions += 1
        if self.errors:
            raise self.errors.pop(0)
        return await self.inner.execute(lease, package)

    async def release(self, lease: WorkerLease) -> None:
        await self.inner.release(lease)

    async def health(self) -> Health:
        return await self.inner.health()


def _wrapped(cause: BaseException) -> StorageWriteError:
    err = StorageWriteError("coalesced batch rejected")
    err.__cause__ = cause
    return err


@_check(over_worker=True)
async def check_superseded_refusals_are_not_retried(make: MakeDispatcher) -> None:
    refusals: list[BaseException] = [
        ExecutionAlreadyExistsError("lost the race", execution_id="k4"),
        StaleFenceError("stale", execution_id="k4"),
        _wrapped(StaleFenceError("stale", execution_id="k4")),
    ]
    for refusal in refusals:
        kit = _Kit()
        worker = _ScriptedWorker(kit.worker, [refusal])
        d = make(worker)
        try:
            await d.dispatch(ExecutionPackage(execution_id="k4", flow_id="kit-fails"))
        except Exception as exc:
            assert is_superseded_refusal(exc, "k4"), repr(exc)
        else:
            raise AssertionError(f"{refusal!r} was swallowed instead of rethrown")
        assert worker.executions == 1, f"{refusal!r} was retried {worker.executions - 1} times"
        assert kit.effects == {}
        await kit.runtime.close()


@_check(over_worker=True)
async def check_genuine_failures_are_retried(make: MakeDispatcher) -> None:
    genuine: list[BaseException] = [
        ConnectionError("worker unreachable"),
        _wrapped(StaleFenceError("another execution's refusal", execution_id="someone-else")),
        _wrapped(OSError("disk I/O error")),
    ]
    for failure in genuine:
        kit = _Kit()
        worker = _ScriptedWorker(kit.worker, [failure])
        d = make(worker)
        result = await d.dispatch(
            ExecutionPackage(execution_id="k5", flow_id="kit-two-gates", input=0)
        )
        assert result.status is ExecutionStatus.SUSPENDED, f"{failure!r} was not retried"
        assert worker.executions == 2
        await kit.runtime.close()


async def run_execution_dispatcher_conformance(
    make_dispatcher: MakeDispatcher, *, over_worker: bool = False
) -> list[str]:
    """Run every applicable check; return the names that passed (raise on the first failure)."""
    passed = []
    for name, (needs_worker, check) in DISPATCHER_CHECKS.items():
        if needs_worker and not over_worker:
            continue
        try:
            await check(make_dispatcher)
        except AssertionError as exc:
            raise AssertionError(f"dispatcher conformance check {name!r} failed: {exc}") from exc
        passed.append(name)
    return passed
