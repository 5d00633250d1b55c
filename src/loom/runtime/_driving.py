"""Driving an execution: taking it over (or appending under a held lease), running its flow
as a task the runtime owns, and recording how it ended."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from loom.errors import (
    DuplicateSequenceError,
    ExecutionSupersededError,
    NonDeterminismError,
    PayloadError,
    RuntimeClosedError,
    StaleFenceError,
    StorageError,
)
from loom.model import (
    EventPayload,
    ExecutionCancelled,
    ExecutionCompleted,
    ExecutionFailed,
    ExecutionState,
    ExecutionStatus,
)
from loom.runtime import _children
from loom.runtime._cancel import cancel_request
from loom.runtime._context import SuspendExecution, WorkflowContext, error_record, replayed_value
from loom.runtime._driver import Driver, LeavesReplay, StopAtBoundary
from loom.runtime._fence import Lease, superseded
from loom.runtime._handle import ExecutionHandle
from loom.runtime._sdk import Flow, _current_flow

if TYPE_CHECKING:
    from loom.runtime._runtime import WorkflowRuntime

log = logging.getLogger("loom.runtime")

OutputT = TypeVar("OutputT")

#: How long a fenced-out holder waits for the new fence's first write (a cancel elsewhere
#: fences, then appends) before it reports a supersession.
_FENCED_GRACE = 2.0


async def continue_with(
    runtime: WorkflowRuntime,
    state: ExecutionState,
    snap_seq: int,
    holder: Lease | None,
    event: EventPayload,
    flow: Flow[Any, Any],
    *,
    from_fence: int | None = None,
    extra: Sequence[EventPayload] = (),
) -> ExecutionHandle[Any] | None:
    """Append ``event`` (and ``extra``, in the same write) and drive the flow on from
    ``state``.

    With the caller's ``holder`` lease (a worker's) the event is appended under it, and
    losing it is a superseded refusal. Without one, the runtime takes over
    conditionally: the fence advances only if nobody moved since ``state`` was read, so
    a racer that loses never fences out the holder that won. None means another writer
    moved first: the caller re-reads and decides again. ``from_fence`` is the fence the
    caller read before ``state`` (else the current one is read now).
    """
    eid = state.execution_id
    if holder is not None:
        driver = new_driver(runtime, state, holder.fence, last_snapshot=snap_seq)
        try:
            await driver.append([event, *extra])
        except StaleFenceError as exc:
            if exc.execution_id != eid:
                raise  # another execution's refusal: a genuine failure for this one
            raise superseded(eid, exc) from exc
        return launch(runtime, driver, flow)
    current = from_fence if from_fence is not None else await runtime.store.current_fence(eid)
    driver = new_driver(runtime, state, current + 1, last_snapshot=snap_seq)
    try:
        await driver.take_over([event, *extra], from_fence=current)
    except (StaleFenceError, DuplicateSequenceError) as exc:
        if exc.execution_id != eid:
            raise
        return None
    log.debug(
        "took over execution %s at fence %d (%s)",
        eid,
        current + 1,
        type(event).__name__,
        extra={"execution_id": eid},
    )
    return launch(runtime, driver, flow)


def new_driver(
    runtime: WorkflowRuntime, state: ExecutionState, fence: int, *, last_snapshot: int
) -> Driver:
    driver = Driver(
        runtime.store,
        state,
        fence,
        runtime.clock,
        snapshot_every=runtime.snapshot_every,
        limits=runtime.limits,
        last_snapshot=last_snapshot,
    )
    if runtime._timer_store is not None:
        driver.schedule_timer = runtime._schedule_timer
    driver.intercept = runtime._intercept
    driver.resources = runtime.resources
    driver.runtime = runtime
    return driver


def launch(
    runtime: WorkflowRuntime, driver: Driver, flow: Flow[Any, OutputT]
) -> ExecutionHandle[OutputT]:
    eid = driver.state.execution_id
    replaced = runtime._drivers.get(eid)
    if (
        replaced is not None
        and replaced.task is not None
        and not replaced.done.is_set()
        and replaced.state.status is ExecutionStatus.RUNNING
    ):
        # The new holder fenced it out already; stop its in-flight effect too. (A driver
        # whose suspension is already durable is only finishing up: it is left alone.)
        if replaced.stop_reason is None:  # a cancel's own takeover keeps its reason
            replaced.stop_reason = "replaced"
        replaced.task.cancel()
    runtime._drivers[eid] = driver
    driver.task = asyncio.create_task(_drive(runtime, driver, flow), name=f"loom:{eid}")
    runtime._tasks.add(driver.task)
    driver.task.add_done_callback(runtime._tasks.discard)
    # A task cancelled before it first ran (a cancel right after start) never enters
    # _drive(), so its handle learns the end here.
    driver.task.add_done_callback(lambda _: _finished(runtime, driver))
    return ExecutionHandle(runtime, eid, driver)


def _finished(runtime: WorkflowRuntime, driver: Driver) -> None:
    if driver.done.is_set():
        return
    eid = driver.state.execution_id
    if driver.error is None and driver.stop_reason != "cancelled":
        driver.error = _stop_error(driver)
    driver.done.set()
    if runtime._drivers.get(eid) is driver:
        del runtime._drivers[eid]


def _stop_error(driver: Driver) -> BaseException:
    eid = driver.state.execution_id
    if driver.stop_reason == "replaced":
        return ExecutionSupersededError(
            f"execution {eid!r} was taken over by a newer holder in this process",
            execution_id=eid,
        )
    if driver.stop_reason == "stopped":
        return RuntimeClosedError(
            f"this process stopped driving {eid!r}; it is resumable", execution_id=eid
        )
    return RuntimeClosedError(f"the runtime stopped driving {eid!r} (closed)", execution_id=eid)


async def _drive(runtime: WorkflowRuntime, driver: Driver, flow: Flow[Any, Any]) -> None:
    eid = driver.state.execution_id
    try:
        if runtime.heartbeat is not None:
            await runtime.heartbeat.begin(driver)
        if driver.deferred is None:
            outcome = await _run_flow(driver, flow)
        else:
            outcome = await _run_deferred(driver, flow)
        if isinstance(outcome, ExecutionFailed):
            err = outcome.error or {}
            log.error(
                "execution %s (flow %s) failed: %s: %s",
                eid,
                flow.id,
                err.get("type"),
                err.get("message"),
                extra={"execution_id": eid, "flow_id": flow.id},
            )
        if outcome is not None:
            try:
                await driver.append([outcome])
            except PayloadError as exc:
                # The output itself cannot be stored (too large, too deep): record that as
                # the flow's failure, or every recovery would stop at the same place.
                await driver.append([ExecutionFailed(error_record(exc))])
            await _children.notify_parent(runtime, driver.state)
    except StaleFenceError as exc:
        if driver.lost_take_over:
            # It never held the execution (its deferred take-over lost): nothing to find out.
            driver.error = superseded(eid, exc)
        else:
            driver.error = await _fenced_out_error(runtime, driver, exc)
    except StopAtBoundary:
        # A draining close stopped it right after a durable append: resumable from there.
        if driver.state.status is ExecutionStatus.RUNNING:
            driver.error = RuntimeClosedError(
                f"the runtime stopped driving {eid!r} at a durable boundary (closed)",
                execution_id=eid,
            )
    except asyncio.CancelledError:
        # Never hand a CancelledError to the tasks awaiting the handle: say why instead.
        if driver.stop_reason != "cancelled":
            driver.error = _stop_error(driver)
        raise
    except BaseException as exc:
        driver.error = exc
        if not isinstance(exc, Exception):
            raise
        log.warning(
            "execution %s stopped without an outcome: %r",
            eid,
            exc,
            extra={"execution_id": eid},
        )
    finally:
        driver.done.set()
        current = runtime._drivers.get(eid) is driver
        if current:
            del runtime._drivers[eid]
        if runtime.heartbeat is not None:
            await runtime.heartbeat.end(driver, release=current)


async def _run_deferred(
    driver: Driver, flow: Flow[Any, Any]
) -> ExecutionCompleted | ExecutionFailed | ExecutionCancelled | None:
    """Run the flow of a driver whose take-over is deferred (see ``DeferredTakeOver``): a
    flow that only replays to its end gets its outcome written with the take-over (by
    ``_drive``); one that reaches anything else stops there, and runs again once the
    take-over is written alone."""
    deferred = driver.deferred
    assert deferred is not None
    try:
        outcome = await _run_flow(driver, flow)
    except LeavesReplay:
        outcome = None
    except asyncio.CancelledError:
        raise
    except BaseException:
        await driver.flush_deferred()  # the take-over stands, as a lone wake's would
        raise
    if not deferred.aborted:
        if outcome is None:
            await driver.flush_deferred()  # (a run that suspends appended already)
        return outcome
    # Even if the flow caught LeavesReplay itself: what it did after that is discarded (it
    # wrote nothing, see Driver._append_deferred) and the run starts over.
    if deferred.left_replay is not None:
        deferred.left_replay()
    await driver.flush_deferred()
    driver.pending_records, driver.pending_ui, driver.pending_blobs = [], [], {}
    return await _run_flow(driver, flow)


async def _run_flow(
    driver: Driver, flow: Flow[Any, Any]
) -> ExecutionCompleted | ExecutionFailed | ExecutionCancelled | None:
    """Run (or replay) the flow; return its terminal event, or None when it suspended.

    Errors that mean the execution must stay resumable (non-determinism, storage,
    fencing) propagate; anything else the flow raises is its failure, recorded.
    """
    ctx = WorkflowContext(driver, flow)
    token = _current_flow.set(ctx)
    try:
        try:
            outcome = await _run_body(ctx, driver, flow)
        except LeavesReplay:
            # The flow's own concurrent tasks stop too before it runs again: none of them
            # may go on with this run.
            await ctx.stop_stragglers()
            raise
        if outcome is not None:
            # Children started and never awaited are recorded before the outcome. A start
            # that failed then changes nothing: the outcome stands, that child was not
            # started (nothing records it).
            try:
                await ctx.settle_child_starts()
            except Exception as exc:
                log.warning(
                    "execution %s: a child start failed: %r", driver.state.execution_id, exc
                )
    finally:
        _current_flow.reset(token)
    if outcome is not None:
        # The flow's own concurrent tasks (a gathered step still running after another
        # failed) stop before the outcome is written: nothing follows a terminal event.
        await ctx.stop_stragglers()
    return outcome


async def _run_body(
    ctx: WorkflowContext, driver: Driver, flow: Flow[Any, Any]
) -> ExecutionCompleted | ExecutionFailed | ExecutionCancelled | None:
    outcome = await _run_body_outcome(ctx, driver, flow)
    request = cancel_request(driver.state)
    if outcome is not None and request is not None:
        # A cancelled flow that cleaned up ends cancelled, whatever it returned or raised.
        return ExecutionCancelled(request.get("reason"))
    return outcome


async def _run_body_outcome(
    ctx: WorkflowContext, driver: Driver, flow: Flow[Any, Any]
) -> ExecutionCompleted | ExecutionFailed | None:
    try:
        if flow.takes_input:
            inp = replayed_value(flow.input, driver.state.input, ctx, "the flow's input")
            out = await flow.fn(ctx, inp)
        else:
            out = await flow.fn(ctx)
        ctx._check_fully_replayed()
        output = flow.output.dump(out, f"output of flow {flow.id!r}")
    except SuspendExecution:
        if ctx.wait_violation is not None:
            return ExecutionFailed(error_record(ctx.wait_violation))
        return None
    except (NonDeterminismError, StorageError):
        raise
    except Exception as exc:
        if driver.fenced_out is not None:
            raise driver.fenced_out from exc  # the flow swallowed its own fencing
        return ExecutionFailed(error_record(ctx.wait_violation or exc))
    if ctx.wait_violation is not None:
        return ExecutionFailed(error_record(ctx.wait_violation))
    return ExecutionCompleted(output)


async def _fenced_out_error(
    runtime: WorkflowRuntime, driver: Driver, exc: StaleFenceError
) -> BaseException | None:
    eid = driver.state.execution_id
    if exc.execution_id != eid:
        # A store that rejects a whole coalesced batch named another execution: for this
        # one it is a genuine storage failure (retryable), not a supersession.
        return exc
    # If a cancel fenced it out, the handle reports the cancellation; otherwise another
    # holder owns the execution: a superseded refusal (ADR 0004), even if that holder has
    # finished it meanwhile.
    if driver.cancel_requested:
        return None  # this process's cancel fenced it out; its handle reports that
    latest = await runtime.load_state(eid)
    current = exc.details.get("current_fence")
    if (
        latest is not None
        and not latest.is_terminal
        and isinstance(current, int)
        and latest.fence < current
    ):
        # The new fence has written nothing yet. A cancel elsewhere fences first and
        # appends second: give its append a moment before calling this a supersession.
        await runtime.store.wait_for_append(eid, latest.last_sequence, timeout=_FENCED_GRACE)
        latest = await runtime.load_state(eid)
    if latest is not None and latest.status is ExecutionStatus.CANCELLED:
        return None
    return superseded(eid, exc)
