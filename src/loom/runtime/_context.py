"""WorkflowContext: what a flow uses to run steps, wait on gates and record decisions."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar, cast

import pydantic

from loom import faults
from loom.errors import (
    ConcurrentWaitError,
    ConfigurationError,
    ExecutionCancelledError,
    GateTimedOutError,
    LoomError,
    NonDeterminismError,
    PayloadError,
    StaleFenceError,
    StepFailedError,
)
from loom.learning import _decisions as _learning
from loom.model import (
    DecisionRecorded,
    EventPayload,
    ExecutionResumed,
    ExecutionSuspended,
    OpKind,
    OpRecord,
    OpStatus,
    PayloadLimits,
    StepCompleted,
    StepFailed,
    StepStarted,
    TimerScheduled,
    UIPatched,
    WaitOutcome,
    encode_json,
)
from loom.model._state import LazyOps
from loom.runtime import _children
from loom.runtime._cancel import cancel_request
from loom.runtime._children import ChildHandle
from loom.runtime._clock import Clock
from loom.runtime._driver import Driver, LeavesReplay
from loom.runtime._intercept import StepCall
from loom.runtime._sdk import (
    Flow,
    Step,
    _current_step,
    _seconds,
    new_step_info,
    registered_error,
)
from loom.storage import BlobStore, Message, Timer

log = logging.getLogger("loom.steps")

#: How a Step calls its function; a subclass that overrides it is called through it.
_STEP_INVOKE = Step.invoke
#: math.isfinite over a step's value once its type is known to be float.
_finite: Callable[[Any], bool] = math.isfinite
_new_tuple = tuple.__new__

if sys.version_info >= (3, 12):
    _current_task: Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None] = (
        asyncio.current_task
    )
else:
    # 3.11's current_task is Python around this dict read: a third of a replayed step's
    # cost once per durable call (3.11 is frozen, so the private name stays).
    _current_task = cast(
        "Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None]",
        asyncio.tasks._current_tasks.get,  # type: ignore[attr-defined]
    )

#: What a replay lookup returns for a position that holds no completed step of that name.
_NOT_REPLAYED: Any = object()
_COMPLETED = OpStatus.COMPLETED
_STEP = OpKind.STEP

#: The event type of a durable sleep's wait (what a timer wake resumes).
TIMER_EVENT = "loom.timer"

__all__ = [
    "TIMER_EVENT",
    "SuspendExecution",
    "UIState",
    "WorkflowContext",
    "error_record",
    "replayed_value",
]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class SuspendExecution(BaseException):
    """Unwinds a flow that is waiting on a durable gate or timer.

    This is Loom's internal control flow. Do not catch it: a bare ``except:`` or
    ``except BaseException:`` in a flow must re-raise it, or the execution cannot suspend.
    """


#: What a record must be for its operation to be a pure replay (returns or raises what it
#: recorded, runs nothing): a finished step or decision, a resolved wait.
_SETTLED = frozenset({OpStatus.COMPLETED, OpStatus.FAILED, OpStatus.RESOLVED})


def error_record(exc: BaseException) -> dict[str, Any]:
    """A JSON description of an exception, as recorded in the log."""
    if isinstance(exc, LoomError):
        record = exc.to_dict()
    else:
        record = {"type": type(exc).__name__, "message": str(exc)}
    name = getattr(type(exc), "__loom_error_name__", None)
    if isinstance(name, str) and registered_error(name) is type(exc):
        fields = {"args": list(exc.args), "attrs": dict(vars(exc))}
        try:
            encode_json(fields, what="error fields")
        except PayloadError:
            pass  # not JSON: it stays a StepFailedError (with error_type) in the flow
        else:
            record["registered"] = name
            record["fields"] = fields
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    record["traceback"] = tb[-4000:]
    return record


def replayed_value(codec: Any, recorded: Any, ctx: WorkflowContext, what: str) -> Any:
    """Load a recorded value through today's schema. A value the code can no longer read is
    a code change under a running execution: NonDeterminismError (the execution stays
    resumable once the code is fixed), never a recorded failure."""
    try:
        return codec.load(recorded)
    except pydantic.ValidationError as exc:
        raise NonDeterminismError(
            f"{what} recorded for execution {ctx.execution_id!r} no longer matches the "
            f"code's schema: {exc.error_count()} error(s), first: {exc.errors()[0]['msg']}",
            execution_id=ctx.execution_id,
        ) from exc


async def _bounded(step: Step[Any, Any], attempt: int, work: Awaitable[Any]) -> Any:
    """Await one attempt for at most ``step.timeout`` seconds (then it is abandoned)."""
    assert step.timeout is not None
    try:
        # Inline like an attempt without a timeout, and not asyncio.wait_for: on 3.11 that
        # swallows a cancel (close, a takeover) landing as the attempt finishes.
        async with asyncio.timeout(step.timeout):
            return await work
    except TimeoutError:
        raise TimeoutError(
            f"step {step.id!r} attempt {attempt} timed out after {step.timeout:g}s"
        ) from None


def _typed(record: dict[str, Any], failed: StepFailedError) -> BaseException:
    """A registered error rebuilt from its record (``failed`` as its cause), else ``failed``."""
    cls = registered_error(record.get("registered"))
    fields = record.get("fields")
    if cls is None or not isinstance(fields, dict):
        return failed
    exc = cls.__new__(cls)
    BaseException.__init__(exc, *(fields.get("args") or []))
    exc.__dict__.update(fields.get("attrs") or {})
    exc.__cause__ = failed
    return exc


class UIState:
    """Durable projection state (what a console shows). Patches are buffered and committed
    with the flow's next durable write, so they cost no commit of their own."""

    def __init__(self, ctx: WorkflowContext) -> None:
        self._ctx = ctx

    def set(self, key: str, value: Any) -> None:
        """Set ``key`` to ``value`` (JSON)."""
        self._ctx._ui_patch("set", key, value)

    def merge(self, key: str, value: dict[str, Any]) -> None:
        """Shallow-merge the mapping ``value`` into the mapping at ``key``."""
        self._ctx._ui_patch("merge", key, value)

    def get(self, key: str, default: Any = None) -> Any:
        return self._ctx._driver.state.ui.get(key, default)


class WorkflowContext:
    """The flow's handle on durability. Every method is deterministic under replay: each call
    takes the next *position*, and replay compares what the code asks for at a position with
    what the log recorded there (raising :class:`NonDeterminismError` on a mismatch)."""

    def __init__(self, driver: Driver, flow: Flow[Any, Any]) -> None:
        self._driver = driver
        self._flow = flow
        self._position = 0
        self.ui = UIState(self)
        #: The durable wait (position, event type) this run is suspending on, if any.
        self._open_wait: tuple[int, str] | None = None
        #: A second wait that was refused while one was open: fails the run whatever the
        #: flow does with the error (one of the two waits may already be logged).
        self.wait_violation: ConcurrentWaitError | None = None
        #: Tasks other than the flow's own that used this context (``asyncio.gather``): they
        #: are stopped before the run's terminal event is appended.
        self._main_task = asyncio.current_task()
        #: The loop the flow runs on: ``current_task(loop)`` skips looking the loop up again
        #: (on 3.11 that is most of its cost, paid once per durable call).
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[Any]] = set()
        #: The task that is unwinding a suspension (its later durable calls unwind too).
        self._unwinding: asyncio.Task[Any] | None = None
        #: A recorded cancel request (flows with cancel_grace): delivered once, at its position.
        request = cancel_request(driver.state)
        self._cancel_at: int | None = None if request is None else int(request["at_position"])
        self._cancel_reason = None if request is None else request.get("reason")
        #: Child starts under way (their records are written before any wait or the outcome).
        self._child_starts: list[asyncio.Task[None]] = []
        #: A new step may take its position inline (see run) unless a subclass watches every
        #: position through _take_position (the upgrade check stops at the first new one).
        self._inline_take = type(self)._take_position is WorkflowContext._take_position

    @property
    def execution_id(self) -> str:
        return self._driver.state.execution_id

    @property
    def flow_id(self) -> str:
        return self._flow.id

    @property
    def flow_version(self) -> str:
        return self._flow.version

    @property
    def is_replaying(self) -> bool:
        """True while the flow re-walks positions the log already holds."""
        return self._position in self._driver.state.ops

    def claim_position(self, kind: str, name: str) -> tuple[int, OpRecord | None]:
        """Take the next position for an operation of an extension's own ``kind``.

        Returns the position and what the log recorded there (None on first execution). Replay
        compares ``(kind, name)`` with the record and raises :class:`NonDeterminismError` on a
        mismatch, exactly as for steps. Pair it with :meth:`record`: an extension whose
        registered reducer records ``OpRecord(kind, name, ...)`` at that position gets
        replay-safe operations of its own (see ``docs/events.md``).
        """
        return self._take_position(kind, name)

    async def record(self, *events: EventPayload) -> None:
        """Append events of registered types durably (one atomic write, with any buffered UI
        patches) and fold them into the state before returning.

        Raises :class:`ConfigurationError` for a payload whose type is not registered and
        :class:`PayloadError` for one that cannot be stored; nothing is written then.
        """
        if not events:
            return
        await self._driver.append(list(events))

    def record_later(self, *events: EventPayload) -> None:
        """Append events of registered types with this execution's next durable write (the
        flow's next step, wait or outcome) instead of a commit of their own.

        Not durable, and not folded, until then: a crash before it loses them. Use it only
        for a record the flow recomputes identically when it replays to this point (a summary
        of what the log already holds), never for a value of the outside world. Raises
        :class:`PayloadError` now for one that cannot be stored.
        """
        for event in events:
            self._driver.defer(event)

    @property
    def simulation(self) -> bool:
        """True in a branch forked for a simulation (``runtime.simulate``, or
        ``runtime.fork(..., simulation=True)``): the flow can skip or dry-run effects."""
        forked = self._driver.state.forked_from
        return bool(forked and forked.get("simulation"))

    def recorded(self, position: int) -> OpRecord | None:
        """What the log (as folded so far) holds at ``position``, if anything."""
        return self._driver.state.ops.get(position)

    # ------------------------------------------------------------------ layer SPI
    # What a layer built on flows (loom.agents) needs from the context besides the flow API,
    # so that it never reaches into the driver. Documented in docs/events.md.

    @property
    def position(self) -> int:
        """The position the next durable call will take (``ctx.recorded(pos)`` after it
        returns gives its record: output, attempts, annotations)."""
        return self._position

    @property
    def limits(self) -> PayloadLimits:
        """The runtime's payload limits (what a record or blob may weigh)."""
        return self._driver.limits

    @property
    def clock(self) -> Clock:
        """The runtime's clock. Reading it is not recorded: use it inside :meth:`decide` (or
        to compute a timeout), never to branch on directly."""
        return self._driver.clock

    @property
    def blob_store(self) -> BlobStore | None:
        """The execution store's :class:`~loom.storage.BlobStore` (None if it keeps none)."""
        return self._driver.blob_store

    def stage_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store ``blobs`` (sha256 hex -> bytes) with this execution's next durable write: in
        its transaction when the store can (``AppendsWithBlobs``), else just before it. Call
        it before the write whose event first names them, so no event ever names a blob the
        store lacks; a write that fails keeps them staged for the next one."""
        if blobs and self.blob_store is None:
            raise ConfigurationError(
                f"execution {self.execution_id!r} stores blobs, but the runtime's store keeps "
                "none (BlobStore)",
                execution_id=self.execution_id,
                hint="Use a store with blob storage: InMemoryStore, SQLiteStore, PostgresStore",
            )
        self._driver.pending_blobs.update(blobs)

    def _take_position(self, kind: str, name: str) -> tuple[int, OpRecord | None]:
        pos = self._position
        self._position += 1
        if self._cancel_at is not None and pos >= self._cancel_at and kind != OpKind.UI:
            # The cancellation reaches the flow here, once, on the first run and every replay.
            self._cancel_at = None
            raise ExecutionCancelledError(
                f"execution {self.execution_id!r} was cancelled ({self._cancel_reason}); "
                "it may run compensating steps before it ends",
                execution_id=self.execution_id,
                position=pos,
                reason=self._cancel_reason,
            )
        op = self._driver.state.ops.get(pos)
        if op is not None and (op.kind != kind or op.name != name):
            raise NonDeterminismError(
                f"replay of execution {self.execution_id!r} diverged at position {pos}: the "
                f"log recorded {op.kind} {op.name!r} there, the code now asks for "
                f"{kind} {name!r}",
                execution_id=self.execution_id,
                position=pos,
                recorded=f"{op.kind}:{op.name}",
                requested=f"{kind}:{name}",
            )
        deferred = self._driver.deferred
        if deferred is not None and (op is None or op.status not in _SETTLED):
            # Its take-over is not written yet: nothing but a replay of settled records may
            # run (see DeferredTakeOver). The run stops, and runs again once it is written.
            deferred.aborted = True
            raise LeavesReplay
        return pos, op

    def _enter(self) -> asyncio.Task[Any] | None:
        """Check that an operation may start in the current task; return that task."""
        task = _current_task(self._loop)
        if task is not None and task is self._unwinding:
            # A ``finally`` (or ``except BaseException``) running while this task unwinds a
            # suspension: it does nothing now, and runs for real when the flow gets past the
            # wait. Without this a cleanup block would run its effects at every suspension.
            raise SuspendExecution("unwinding")
        if task is not None and task is not self._main_task:
            self._tasks.add(task)
        return task

    def _unwind(self, name: str) -> SuspendExecution:
        self._unwinding = asyncio.current_task()
        return SuspendExecution(name)

    def _open(self, pos: int, name: str) -> None:
        """Note that the run waits at ``pos``; refuse a second wait while one is open."""
        if self._open_wait is not None:
            other_pos, other = self._open_wait
            err = ConcurrentWaitError(
                f"execution {self.execution_id!r} awaited {name!r} (position {pos}) while "
                f"still waiting on {other!r} (position {other_pos}): an execution waits on one "
                "gate or sleep at a time",
                execution_id=self.execution_id,
                position=pos,
                open_position=other_pos,
            )
            if self.wait_violation is None:
                self.wait_violation = err
            raise err
        self._open_wait = (pos, name)

    async def stop_stragglers(self, timeout: float = 5.0) -> None:
        """Cancel the flow's other tasks that are still running and wait (bounded) for them,
        so none of them writes after the run's outcome. A write already under way finishes
        (see :meth:`Driver.append`); anything later is refused by the driver."""
        pending = [t for t in self._tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        for t in self._tasks:
            if t.done() and not t.cancelled():
                t.exception()  # seen: the flow's own outcome already says what happened

    def _check_fully_replayed(self) -> None:
        """A flow that returns before reaching positions the log holds has diverged too."""
        beyond = [p for p in self._driver.state.ops if p >= self._position]
        if beyond:
            pos = min(beyond)
            op = self._driver.state.ops[pos]
            raise NonDeterminismError(
                f"replay of execution {self.execution_id!r} diverged at position {pos}: the "
                f"log recorded {op.kind} {op.name!r} there, the code now returns instead",
                execution_id=self.execution_id,
                position=pos,
                recorded=f"{op.kind}:{op.name}",
                requested="return",
            )

    # ------------------------------------------------------------------ steps

    async def run(self, step: Step[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``step`` once for this position and record its result.

        On replay a completed step's recorded output is returned without running it; a step
        that failed for good raises :class:`StepFailedError` again. Retries follow the step's
        :class:`RetryPolicy`, each attempt recorded.
        """
        if not isinstance(step, Step):
            raise TypeError(f"ctx.run() takes a @loom.step, not {step!r}")
        task = self._enter()
        pos = self._position
        ops = self._driver.state.ops
        fresh = False  # known to hold nothing at pos (a new step)
        if type(ops) is LazyOps:
            # A loaded state answers from its snapshot's columns, building no op record.
            recorded = ops.step_output(pos, step.id, _NOT_REPLAYED)
        else:
            op = ops.get(pos)
            fresh = op is None
            recorded = (
                op.output
                if op is not None
                and op.status is _COMPLETED
                and op.kind == _STEP
                and op.name == step.id
                else _NOT_REPLAYED
            )
        if recorded is not _NOT_REPLAYED and self._cancel_at is None:
            # Replaying a completed step, what a recovery does once per step of the log: the
            # checks of _take_position that can apply here, inline, and no message built
            # unless the recorded output no longer loads.
            self._position = pos + 1
            try:
                result: R = step.output.load(recorded)
            except pydantic.ValidationError:
                return replayed_value(  # type: ignore[no-any-return]  # raises
                    step.output, recorded, self, f"the output of step {step.id!r} at {pos}"
                )
            return result
        if fresh and self._cancel_at is None and self._inline_take:
            self._position = pos + 1  # a new step: nothing of _take_position's can apply
            op = None
        else:
            pos, op = self._take_position(OpKind.STEP, step.id)
        attempt = 1
        if op is not None:
            if op.status is OpStatus.COMPLETED:
                result = replayed_value(
                    step.output, op.output, self, f"the output of step {step.id!r} at {pos}"
                )
                return result
            if op.status is OpStatus.FAILED:
                record = op.error or {}
                raise _typed(record, self._step_failed(step, pos, op.attempts, record))
            attempt = op.attempts + 1
        driver = self._driver
        codec = step.output
        # The step's coroutine is awaited directly unless a subclass changed how it is called.
        direct = step.is_async and type(step).invoke is _STEP_INVOKE
        forked = driver.state.forked_from
        simulation = bool(forked and forked.get("simulation"))  # self.simulation, inline
        while True:
            if driver.fenced_out is not None:
                raise driver.fenced_out  # never run an effect for a holder that lost its fence
            deferred = driver.deferred
            if deferred is not None:
                # Nor for one whose take-over is not written yet (see DeferredTakeOver): a
                # new step may reach here without _take_position.
                deferred.aborted = True
                raise LeavesReplay
            started_at = driver.clock.now()
            if step.record_start:
                await driver.append([StepStarted(pos, step.id, attempt)])
            chain = driver.intercept or step._chain
            step_args = (
                driver.state.execution_id,
                pos,
                attempt,
                step.id,
                driver.fence,
                driver.resources,
                simulation,
            )
            if chain is None:
                # Its StepInfo is built only if the step asks for it (see _step_info_now).
                token = _current_step.set(step_args)
            else:
                info = new_step_info(*step_args)
                token = _current_step.set(info)
            try:
                if faults.ARMED:  # (the call is the whole cost of an unarmed point)
                    faults.hit("before_effect")
                work: Awaitable[Any]
                if chain is None:
                    work = step.fn(*args, **kwargs) if direct else step.invoke(*args, **kwargs)  # type: ignore[assignment]
                    annotations = None
                    call = None
                else:
                    call = StepCall(info, step, args, kwargs)
                    work = chain(call)
                value: R
                if step.timeout is None:
                    value = await work
                else:
                    value = await _bounded(step, attempt, work)
                if call is not None:
                    annotations = call.annotations or None
                kind = type(value)
                if codec.passthrough:
                    output = value
                elif kind in codec.as_is and (kind is not float or _finite(value)):
                    output = value  # a plain scalar: stored as it is (see _Codec.dump)
                else:
                    output = codec.dump(value, f"output of step {step.id!r}")
            except Exception as exc:
                await self._attempt_failed(step, pos, attempt, exc)
                attempt += 1
                continue
            finally:
                _current_step.reset(token)
            if faults.ARMED:  # (the call is the whole cost of an unarmed point)
                faults.hit("after_effect_before_record")
            try:
                # StepCompleted(...), without the Python frame of a NamedTuple's __new__.
                completed = _new_tuple(
                    StepCompleted, (pos, step.id, attempt, output, started_at, annotations)
                )
                as_event = step.record_as
                done: EventPayload = completed if as_event is None else as_event(completed)
                if step.defer_record is not None and step.defer_record(output):
                    driver.defer(done)  # durable with the next write (see Step.defer_record)
                elif task is driver.task or driver.task is None:
                    # What append() does in the driver's task, committed in this frame when
                    # the store can (see Driver.append_now).
                    rest = driver.append_now(done)
                    if rest is not None:
                        await rest
                else:
                    await driver.append_elsewhere([done])
            except PayloadError as exc:
                # The output is not storable (checked while building the record, before the
                # store saw anything): a step failure, never a crash of the flow's driver.
                if step.output.passthrough:
                    exc = PayloadError(
                        f"step {step.id!r} returned a {type(value).__name__}, which is not "
                        f"JSON: {exc.message}",
                        execution_id=self.execution_id,
                        hint="Annotate the step's return type (e.g. `-> MyModel` or "
                        "`-> datetime`) so Loom can store it and check it before the effect",
                    )
                await self._attempt_failed(step, pos, attempt, exc)
            return value

    async def _attempt_failed(
        self, step: Step[Any, Any], pos: int, attempt: int, exc: BaseException
    ) -> None:
        """Record a failed attempt, then wait out the backoff before the next one, or raise
        :class:`StepFailedError` when the retry policy is exhausted."""
        driver = self._driver
        final = not step.retry.should_retry(exc, attempt) or isinstance(exc, PayloadError)
        record = error_record(exc)
        log.warning(
            "execution %s: step %r at position %d failed (attempt %d, %s): %s: %s",
            self.execution_id,
            step.id,
            pos,
            attempt,
            "final" if final else "will retry",
            type(exc).__name__,
            exc,
            extra={"execution_id": self.execution_id, "step_id": step.id, "position": pos},
        )
        await driver.append([StepFailed(pos, step.id, attempt, record, final)])
        if final:
            failed = self._step_failed(step, pos, attempt, record)
            failed.__cause__ = exc
            raise _typed(record, failed)
        await driver.clock.sleep(step.retry.delay(exc, attempt))

    def _step_failed(
        self, step: Step[Any, Any], pos: int, attempts: int, record: dict[str, Any]
    ) -> StepFailedError:
        return StepFailedError(
            f"step {step.id!r} at position {pos} failed after {attempts} attempt(s): "
            f"{record.get('type', 'Error')}: {record.get('message', '')}",
            execution_id=self.execution_id,
            step_id=step.id,
            position=pos,
            attempts=attempts,
            error={k: v for k, v in record.items() if k != "traceback"},
        )

    # ------------------------------------------------------------------ gates

    async def suspend(
        self,
        event_type: str,
        *,
        correlation_key: str | None = None,
        timeout: timedelta | float | None = None,
    ) -> Any:
        """Wait durably for ``runtime.resume(execution_id, event_type, payload)``.

        The execution is suspended (no process is held) until the decision arrives; it returns
        the payload validated against the flow's ``resume_schemas[event_type]``. With
        ``timeout``, a gate whose deadline passes first raises :class:`GateTimedOutError`
        in the flow (which may catch it), and a later decision is refused.
        """
        seconds = (
            None if timeout is None else _seconds(timeout, "a gate's timeout", self.execution_id)
        )
        self._enter()
        pos, op = self._take_position(OpKind.GATE, event_type)
        if op is None or op.status is not OpStatus.RESOLVED:
            self._open(pos, event_type)
        if op is not None:
            outcome = op.outcome
            if outcome is WaitOutcome.TIMED_OUT:
                raise GateTimedOutError(
                    f"gate {event_type!r} at position {pos} timed out",
                    execution_id=self.execution_id,
                    event_type=event_type,
                    position=pos,
                )
            if outcome is not None:
                return self._gate_value(event_type, op.output.get("payload"))
            # Still waiting (a recovered holder): a message may have arrived meanwhile.
            return await self._consume_after_suspend(pos, event_type)
        await self.settle_child_starts()
        early = await self._next_message(event_type)
        if early is not None:
            # The message beat the flow to its gate: take it now, and record both the wait
            # and its answer in one write (the execution is never seen waiting).
            await self._driver.append(
                [
                    ExecutionSuspended(pos, event_type, correlation_key, None),
                    self._consumed_record(pos, early),
                ]
            )
            return await self._took(early)
        timeout_at = None
        if seconds is not None:
            timeout_at = self._driver.clock.now() + seconds
            # The timer is stored before the wait is logged: a crash in between leaves a timer
            # that finds nothing waiting (harmless), never a wait that nothing will end.
            await self._schedule(
                Timer(self.execution_id, pos, timeout_at, "gate_timeout", self._flow.id)
            )
        await self._driver.append(
            [ExecutionSuspended(pos, event_type, correlation_key, timeout_at)]
        )
        await self._driver.snapshot_on_suspend()
        faults.hit("after_suspend_recorded")
        return await self._consume_after_suspend(pos, event_type)

    def _gate_value(self, event_type: str, payload: Any) -> Any:
        codec = self._flow.resume_schemas.get(event_type)
        if codec is None:
            return payload
        return replayed_value(codec, payload, self, f"the decision of gate {event_type!r}")

    async def _next_message(self, event_type: str) -> Message | None:
        """The oldest message for ``event_type`` that no gate of this execution has taken."""
        mailbox = self._driver.mailbox
        if mailbox is None:
            return None
        taken = self._driver.consumed_messages()
        for message in await mailbox.pending_messages(self.execution_id, event_type):
            if message.message_id not in taken:
                return message
            # Its key was delivered already (a keyed resume, or a consumption whose mark was
            # lost): the log says it is used, so the mailbox only catches up.
            await mailbox.consume_message(self.execution_id, message.message_id)
        return None

    def _consumed_record(self, pos: int, message: Message) -> ExecutionResumed:
        return ExecutionResumed(pos, message.event_type, message.payload, message.message_id)

    async def _took(self, message: Message) -> Any:
        """The gate's consumption is durable: mark the message and hand the flow its value."""
        self._open_wait = None
        mailbox = self._driver.mailbox
        if mailbox is not None:
            await mailbox.consume_message(self.execution_id, message.message_id)
        return self._gate_value(message.event_type, message.payload)

    async def _consume_after_suspend(self, pos: int, event_type: str) -> Any:
        """With the wait durable, look once more: a message sent while the wait was being
        recorded saw no waiting gate, so it is this holder's to deliver. Either this check sees
        the message, or the sender saw the wait (and resumes it itself)."""
        message = await self._next_message(event_type)
        if message is None:
            raise self._unwind(event_type)
        try:
            await self._driver.append([self._consumed_record(pos, message)])
        except StaleFenceError as exc:
            if exc.execution_id != self.execution_id:
                raise
            raise self._unwind(event_type) from exc  # the sender resumed it first
        return await self._took(message)

    async def _schedule(self, timer: Timer) -> None:
        if self._driver.fenced_out is not None:
            raise self._driver.fenced_out  # a zombie must not move the live holder's timer
        if self._driver.schedule_timer is None:
            raise ConfigurationError(
                f"execution {self.execution_id!r} needs a durable timer, but this runtime's "
                "store keeps none",
                execution_id=self.execution_id,
                hint="Use a store that implements TimerStore (memory, SQLite, PostgreSQL)",
            )
        await self._driver.schedule_timer(timer)

    async def sleep(self, duration: timedelta | float) -> None:
        """Sleep durably. The execution suspends (no process is held) and a timer resumes it;
        the sleep survives restarts of every process."""
        seconds = _seconds(duration, "ctx.sleep's duration", self.execution_id)
        await self._sleep(lambda now: now + seconds)

    async def sleep_until(self, when: datetime | float) -> None:
        """Sleep durably until ``when`` (an aware datetime or epoch seconds).

        A naive datetime is refused: which instant it names depends on the time zone of the
        process that happens to run the step, and a durable timer may be scheduled on one
        machine and fired by another.
        """
        at = when.timestamp() if isinstance(when, datetime) else float(when)
        if not math.isfinite(at):
            raise ConfigurationError(
                f"ctx.sleep_until's time must be finite epoch seconds or a datetime, not {at!r}",
                execution_id=self.execution_id,
                hint="Pass a finite time; nothing was recorded",
            )
        naive = isinstance(when, datetime) and when.utcoffset() is None

        def refuse_naive() -> None:
            raise ConfigurationError(
                f"ctx.sleep_until was given a naive datetime ({when!s}); the "
                "instant it names depends on the local time zone of whichever process runs "
                "it",
                execution_id=self.execution_id,
                hint="Pass an aware datetime (e.g. datetime.now(timezone.utc) + delta) or "
                "epoch seconds; nothing was recorded",
            )

        await self._sleep(lambda now: at, refuse_naive if naive else None)

    async def _sleep(
        self,
        fire_at_from: Callable[[float], float],
        refuse_new: Callable[[], None] | None = None,
    ) -> None:
        self._enter()
        pos, op = self._take_position(OpKind.TIMER, "sleep")
        # Only a new timer is refused: a sleep recorded before the refusal existed replays as
        # it was recorded, so an execution in flight across an upgrade is not stranded.
        if op is None and refuse_new is not None:
            refuse_new()
        if op is None or op.status is not OpStatus.RESOLVED:
            self._open(pos, "sleep")
        if op is not None:
            if op.status is OpStatus.RESOLVED:
                return
            raise self._unwind("sleep")
        await self.settle_child_starts()
        fire_at = fire_at_from(self._driver.clock.now())
        await self._schedule(Timer(self.execution_id, pos, fire_at, "sleep", self._flow.id))
        await self._driver.append(
            [
                TimerScheduled(pos, fire_at, "sleep"),
                ExecutionSuspended(pos, TIMER_EVENT, timeout_at=fire_at, timer=True),
            ]
        )
        await self._driver.snapshot_on_suspend()
        faults.hit("after_suspend_recorded")
        raise self._unwind("sleep")

    # ------------------------------------------------------------------ children

    def start_child(
        self,
        flow: Flow[Any, Any] | str,
        input: Any = None,
        *,
        execution_id: str | None = None,
    ) -> ChildHandle:
        """Start ``flow`` as a child execution of this one and return its handle at once;
        ``await handle`` waits durably for its output.

        The child is its own execution (its own log and holder), with the id
        ``execution_id`` or, by default, ``"<this id>.<position>"``; it is placed through the
        runtime's dispatcher when it has one, else started on this runtime. Its start is
        recorded here, so a replay or a recovery after a crash finds the same child by id and
        never starts a second one. Start several, then await them one after the other: they
        run at the same time, and their results come back in the order awaited. A child that
        fails or is cancelled raises :class:`~loom.errors.ChildFailedError` where it is
        awaited. Bad input raises :class:`~loom.errors.InvalidInputError` here, before
        anything is started.
        """
        return _children.start_child(self, flow, input, execution_id)

    async def call(
        self,
        flow: Flow[Any, T] | str,
        input: Any = None,
        *,
        execution_id: str | None = None,
    ) -> T:
        """Run ``flow`` as a child execution and wait durably for its output (the parent is
        suspended meanwhile, holding no process). See :meth:`start_child`."""
        result: T = await _children.start_child(self, flow, input, execution_id)
        return result

    async def fan_out(
        self,
        branches: Sequence[tuple[Flow[Any, Any] | str, Any]],
        *,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Run each ``(flow, input)`` branch as its own child execution, all at once, and
        return their outputs in branch order. Never two writers on one log: each branch has
        its own execution id (``"<this id>.<position>"``). The first failed branch (in
        order) raises :class:`~loom.errors.ChildFailedError`, unless ``return_exceptions``:
        then its error takes its place in the list."""
        return await _children.fan_out(self, branches, return_exceptions)

    async def execute_graph(self, graph: Any, input: Any = None) -> Any:
        """Run a :class:`loom.orchestration.Graph` durably inside this flow: each node is a
        child execution (id ``"<this id>.<position>.<node>"``), started as soon as its
        dependencies completed and awaited in declared order, so a replay or a recovery
        continues the graph and never runs a finished node again. A node that waits at a
        gate keeps this flow waiting durably (resume the node by its id). A node with
        alternatives fans out: each alternative is its own child
        (``"<this id>.<position>.<node>.<i>"``), taken in declared order. Returns a
        :class:`loom.orchestration.GraphRun` (``completed``, ``failed``, ``rejected`` or
        ``cancelled``; nothing downstream of a failed node starts)."""
        return await _children.execute_graph(self, graph, input)

    async def settle_child_starts(self) -> None:
        """Wait until every child started so far is recorded (raising the first failure)."""
        while self._child_starts:
            pending, self._child_starts = self._child_starts, []
            results = await asyncio.gather(*pending, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result

    # ------------------------------------------------------------------ agents

    async def agent(self, agent: Any, input: Any) -> Any:
        """Run ``agent`` (a :func:`loom.agent`) inline: its model and tool calls are steps of
        this flow. Returns its :class:`~loom.agents.AgentResult`."""
        run = getattr(agent, "run", None)
        if run is None or not hasattr(agent, "provider"):
            raise TypeError(f"ctx.agent() takes a loom.agent(...), not {agent!r}")
        return await run(self, input)

    # ------------------------------------------------------------------ decisions & UI

    async def decide(self, name: str, compute: Callable[[], T | Awaitable[T]]) -> T:
        """Compute a value once (a random id, the current time, a branch), record it, and
        return the recorded value on every replay. The value must be JSON."""
        self._enter()
        pos, op = self._take_position(OpKind.DECISION, name)
        if op is not None:
            recorded: T = op.output
            return recorded
        value = compute()
        if inspect.isawaitable(value):
            value = await value
        await self._driver.append([DecisionRecorded(pos, name, value)])
        return value

    async def decide_with_policy(
        self, decision_id: str, policy: Any, context: Any, actions: Sequence[Any]
    ) -> Any:
        """Let ``policy`` choose among ``actions`` for ``context`` and record the choice with
        the context, the alternatives, the policy's id and version and its propensity, so the
        log can later evaluate other policies (:mod:`loom.learning`). Replay returns the
        recorded action without consulting the policy.

        Raises :class:`~loom.learning.DecisionError` (nothing recorded) when the policy picks
        an action not among ``actions`` or a propensity outside (0, 1].
        """
        return await _learning.decide_with_policy(self, decision_id, policy, context, actions)

    async def record_outcome(self, key: str, score: float, decision_id: str | None = None) -> bool:
        """Record ``score`` as the outcome ``key`` of a decision (the flow's latest
        ``decide_with_policy`` when ``decision_id`` is None). Idempotent per (decision, key):
        a second score for the same pair is not recorded and returns False."""
        return await _learning.record_outcome(self, key, score, decision_id)

    async def now(self) -> datetime:
        """The current time, recorded once so replay sees the same instant."""
        from datetime import UTC

        ts = await self.decide("loom.now", self._driver.clock.now)
        return datetime.fromtimestamp(ts, UTC)

    def _ui_patch(self, op: str, key: str, value: Any) -> None:
        pos, recorded = self._take_position(OpKind.UI, key)
        if recorded is not None:
            return
        # Encode now so a bad value fails at the call site, not at a later unrelated append.
        encode_json(value, limits=self._driver.limits, what=f"ui value {key!r}")
        self._driver.pending_ui.append(UIPatched(pos, key, value, op))
