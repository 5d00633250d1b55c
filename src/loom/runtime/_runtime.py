"""WorkflowRuntime: registers flows and starts, resumes, recovers and cancels executions."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType, TracebackType
from typing import Any, Literal, TypeVar

import pydantic
import pydantic_core

from loom import faults
from loom.errors import (
    ConfigurationError,
    CorruptEventError,
    DuplicateSequenceError,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    ExecutionSupersededError,
    FlowNotFoundError,
    GateTimedOutError,
    NonDeterminismError,
    NotWaitingError,
    PayloadError,
    ResumeValidationError,
    RuntimeClosedError,
    StaleFenceError,
    StorageError,
)
from loom.model import (
    DEFAULT_LIMITS,
    Envelope,
    EventPayload,
    ExecutionCancelled,
    ExecutionCompleted,
    ExecutionFailed,
    ExecutionRecovered,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionState,
    ExecutionStatus,
    ExecutionSummary,
    Gate,
    OpKind,
    PayloadLimits,
    TimerFired,
    WaitOutcome,
    apply_event,
    encode_json,
    execution_id_problem,
    new_envelope_id,
)
from loom.runtime import _await, _cancel, _children, _mailbox
from loom.runtime._cancel import (
    CANCEL_GRACE_POSITION,
    DEADLINE_KEY,
    DEADLINE_POSITION,
    cancel_request,
)
from loom.runtime._clock import Clock, SystemClock
from loom.runtime._context import (
    TIMER_EVENT,
    SuspendExecution,
    WorkflowContext,
    error_record,
    replayed_value,
)
from loom.runtime._driver import Driver, StopAtBoundary
from loom.runtime._fork import Branch, refuse_superseded
from loom.runtime._gates import GateRecord, gate_validator
from loom.runtime._handle import ExecutionHandle
from loom.runtime._intercept import StepInterceptor, build_chain
from loom.runtime._lease import Heartbeat
from loom.runtime._sdk import _NOT_JSON, Flow, _current_flow, json_dump
from loom.runtime.timers import TimerService, WakeOutcome
from loom.storage import BranchRef, ExecutionQuery, LeaseStore, Message, Store, Timer, TimerStore
from loom.storage._common import validate_snapshot

__all__ = ["ExecutionHandle", "Lease", "WorkflowRuntime"]  # ExecutionHandle is re-exported here

log = logging.getLogger("loom.runtime")

OutputT = TypeVar("OutputT")


def _superseded(execution_id: str, cause: BaseException) -> ExecutionSupersededError:
    err = ExecutionSupersededError(
        f"execution {execution_id!r} was superseded by a newer fence holder",
        execution_id=execution_id,
    )
    err.__cause__ = cause
    return err


class WorkflowRuntime:
    """Runs flows durably over a store. Owns its tasks; ``close()`` (or ``async with``) stops
    them, leaving every execution resumable.

    ``store`` defaults to ``SQLiteStore($LOOM_DB or "loom.db")``. ``snapshot_every`` is the
    number of events between snapshots (loading reads the newest snapshot plus the tail).
    Timer serving (firing the due timers of its store, its own and any other process's, each
    once) follows one rule. ``timers=True`` (the default): served automatically in the
    background from first use (entering with ``async with``, start, resume, send, recover, a
    wait) until ``close()`` or an explicit :meth:`stop_timers`, after which no later use
    restarts it. ``timers=False``: served only when asked, by :meth:`start_timers` (background,
    until :meth:`stop_timers` or ``close()``), :meth:`serve_timers` (foreground) or
    ``async with runtime.timers``; use it where a separate :class:`TimerService` serves them,
    or where the process lives for one command (the CLI).
    ``interceptors`` wrap every step attempt, first = outermost (tracing with
    ``loom.otel.OpenTelemetryInterceptor()``, token accounting, a simulation's dry run);
    ``resources`` are shared with steps by name (``loom.resource("llm")`` inside a step).
    With a store that keeps leases, every execution driven here holds a liveness lease renewed
    every ``lease_ttl / 3`` seconds (``loom.lease_expired`` reads them).
    ``dispatcher`` (an ``ExecutionDispatcher``) places the child executions flows start with
    ``ctx.call`` / ``ctx.start_child``; without one they start on this runtime.
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        clock: Clock | None = None,
        snapshot_every: int = 256,
        limits: PayloadLimits = DEFAULT_LIMITS,
        timers: bool = True,
        interceptors: Sequence[StepInterceptor] = (),
        resources: Mapping[str, Any] | None = None,
        lease_ttl: float = 30.0,
        dispatcher: Any = None,
    ) -> None:
        if store is None:
            from loom.storage import SQLiteStore

            store = SQLiteStore(os.environ.get("LOOM_DB", "loom.db"))
        if snapshot_every < 1:
            raise ConfigurationError("snapshot_every must be at least 1")
        self.store: Store = store
        self.clock: Clock = clock or SystemClock()
        self.snapshot_every = snapshot_every
        self.limits = limits
        self._flows: dict[str, dict[str, Flow[Any, Any]]] = {}
        self._drivers: dict[str, Driver] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # every driver, replaced ones too
        self._closed = False
        self._stopping_at_boundary = False  # a draining close passed its deadline
        self._timer_store: TimerStore | None = store if isinstance(store, TimerStore) else None
        self.timers: TimerService | None = None
        if self._timer_store is not None:
            self.timers = TimerService(
                self._timer_store, self._wake_locally, clock=self.clock, flow_ids=self._flows.keys
            )
        #: whether the first use still has to start timer serving (``timers=True``, not
        #: stopped explicitly yet)
        self._auto_timers = timers
        self.interceptors: tuple[StepInterceptor, ...] = tuple(interceptors)
        self._intercept = build_chain(self.interceptors)
        self.resources: Mapping[str, Any] = MappingProxyType(dict(resources or {}))
        if lease_ttl <= 0:
            raise ConfigurationError("lease_ttl must be positive")
        #: Liveness leases of the executions driven here (see ``loom.lease_expired``).
        self.heartbeat: Heartbeat | None = (
            Heartbeat(store, self.clock, lease_ttl) if isinstance(store, LeaseStore) else None
        )
        #: Where child executions are placed (an ``ExecutionDispatcher``); None starts them
        #: on this runtime, as ``LocalDispatcher(LocalWorkerRuntime(runtime))`` would, without
        #: holding a task for each child's whole run.
        self.dispatcher: Any = dispatcher

    # ------------------------------------------------------------------ registry

    def register(self, *flows: Flow[Any, Any]) -> None:
        """Make flows runnable here. Register every version that still has live executions."""
        for flow in flows:
            if not isinstance(flow, Flow):
                raise ConfigurationError(f"register() takes @loom.flow objects, not {flow!r}")
            versions = self._flows.setdefault(flow.id, {})
            existing = versions.get(flow.version)
            if existing is not None and existing is not flow:
                raise ConfigurationError(
                    f"flow {flow.id!r} version {flow.version!r} is already registered"
                )
            versions[flow.version] = flow

    def get_flow(self, flow_id: str, version: str | None = None) -> Flow[Any, Any]:
        """The registered flow (the newest registered version when ``version`` is None)."""
        versions = self._flows.get(flow_id)
        if not versions:
            known = ", ".join(sorted(self._flows)) or "none"
            raise FlowNotFoundError(f"no flow {flow_id!r} is registered (registered: {known})")
        if version is None:
            return list(versions.values())[-1]
        flow = versions.get(version)
        if flow is None:
            raise FlowNotFoundError(
                f"flow {flow_id!r} version {version!r} is not registered here "
                f"(registered: {', '.join(versions)})",
                hint="Executions are pinned to the version they started with; register that "
                "version alongside the new one until its executions finish",
            )
        return flow

    @property
    def flows(self) -> list[Flow[Any, Any]]:
        return [f for versions in self._flows.values() for f in versions.values()]

    # ------------------------------------------------------------------ reading

    async def load_state(
        self, execution_id: str, *, at_sequence: int | None = None
    ) -> ExecutionState | None:
        """Fold the execution's durable state (newest snapshot plus the tail). Runs nothing.

        ``at_sequence`` folds only up to that sequence (the state as it was then).
        Returns None for an unknown execution id.
        """
        state, _ = await self._load(execution_id, at_sequence=at_sequence)
        return state

    async def _load(
        self, execution_id: str, *, at_sequence: int | None = None
    ) -> tuple[ExecutionState | None, int]:
        _check_id(execution_id)
        state, snap_seq = ExecutionState(execution_id), -1
        try:
            snap = await self.store.load_snapshot(execution_id)
            if snap is not None and (at_sequence is None or snap.sequence <= at_sequence):
                last = await self.store.last_sequence(execution_id)
                state = validate_snapshot(snap, execution_id, last_sequence=last)
                snap_seq = snap.sequence
        except CorruptEventError as exc:
            # A snapshot is only a cache of the fold: one that does not check out is reported
            # and ignored, never trusted (it could even describe another execution).
            log.warning("ignored the snapshot of %s, folding from the log: %s", execution_id, exc)
            state, snap_seq = ExecutionState(execution_id), -1
        envelopes = await self.store.read(execution_id, from_sequence=state.last_sequence + 1)
        tail = [e for e in envelopes if at_sequence is None or e.sequence <= at_sequence]
        if tail:
            # In place: ``state`` is this call's own (fresh or just decoded), so the copy
            # replay() makes of an initial state (10k ops: ~10 ms) buys nothing here.
            for env in tail:
                apply_event(state, env)  # typed errors for malformed records
        if state.last_sequence < 0:
            return None, -1
        return state, snap_seq

    async def _require(self, execution_id: str) -> tuple[ExecutionState, int]:
        state, snap_seq = await self._load(execution_id)
        if state is None:
            raise ExecutionNotFoundError(
                f"no execution {execution_id!r} in this store", execution_id=execution_id
            )
        return state, snap_seq

    async def executions(
        self, query: ExecutionQuery | None = None
    ) -> AsyncIterator[ExecutionSummary]:
        """Every execution matching ``query`` (all by default), newest first, as the store's
        index summarizes it: no log is folded (``load_state`` folds one)."""
        from loom.views import ExecutionViews

        async for summary in ExecutionViews(self.store).all(query):
            yield summary

    async def acquire_lease(self, execution_id: str) -> Lease:
        """Take a new fence on ``execution_id``: a lease for commands that must take it over
        (``recover(..., holder=lease)``). Every older holder is fenced out from here on."""
        self._check_open()
        _check_id(execution_id)
        return Lease(execution_id, await self.store.acquire_fence(execution_id))

    def handle(self, execution_id: str) -> ExecutionHandle[Any]:
        """A handle on any execution in the store (started here or elsewhere)."""
        return ExecutionHandle(self, execution_id, self._drivers.get(execution_id))

    async def wait(
        self,
        execution_id: str,
        *,
        timeout: float | None = None,
        until: Literal["end", "settled"] = "end",
        missing_ok: bool = False,
    ) -> ExecutionState:
        """Await the outcome of any execution by id, whichever process drives it.

        Returns the folded state once the execution is completed, failed or cancelled (with
        ``until="settled"``, also once it is suspended at a gate). It never raises the
        execution's own failure: the state says how it ended. This is how a caller handles a
        superseded refusal (ADR 0004): the winner runs on elsewhere; await it here.

        The wait is woken by the store's commits (LISTEN/NOTIFY on PostgreSQL; in-process
        wake-ups and a shared change watch on SQLite), not by polling the log. Raises
        :class:`ExecutionNotFoundError` for an unknown id (unless ``missing_ok``: then it waits
        for the execution to start) and :class:`TimeoutError` after ``timeout`` seconds.
        """
        _check_id(execution_id)
        return await _await.wait(self, execution_id, timeout, until, missing_ok)

    def subscribe(
        self, execution_id: str, *, after_sequence: int = -1, missing_ok: bool = False
    ) -> AsyncIterator[Envelope]:
        """Every envelope of ``execution_id`` after ``after_sequence``, each as it commits
        (from any process); the iteration ends after the terminal event, or at once when the
        execution already ended at or before ``after_sequence``.

        Raises :class:`ExecutionNotFoundError` (on the first iteration) for an unknown id,
        as :meth:`wait` does, unless ``missing_ok``: then it waits for the execution to start.
        """
        _check_id(execution_id)
        return _await.subscribe(self, execution_id, after_sequence, missing_ok)

    # ------------------------------------------------------------------ start

    async def start(
        self,
        flow: Flow[Any, OutputT] | str,
        input: Any = None,
        *,
        execution_id: str | None = None,
        holder: Lease | None = None,
        metadata: dict[str, Any] | None = None,
        flow_version: str | None = None,
        if_exists: Literal["error", "attach"] = "error",
        deadline: timedelta | float | datetime | None = None,
    ) -> ExecutionHandle[OutputT]:
        """Start an execution and return once its start is durable (the flow runs on).

        Raises :class:`InvalidInputError` (nothing stored) for bad input,
        :class:`ExecutionAlreadyExistsError` if ``execution_id`` exists, unless
        ``if_exists="attach"``: then the handle is the existing execution's (of the same flow),
        so a start retried with the same id executes once.
        ``holder`` starts under a lease the caller already holds (a worker's allocation);
        without one, the start takes the first fence itself in the same write as sequence 0.
        ``deadline`` (a duration from now, or an aware datetime) is a durable timer that
        cancels the execution if it has not ended by then, with the reason recorded; it is
        kept in the start record's metadata as ``loom.deadline`` (epoch seconds).
        """
        self._check_open()
        self._first_use()
        if if_exists not in ("error", "attach"):
            raise ConfigurationError(f"if_exists must be 'error' or 'attach', not {if_exists!r}")
        if if_exists == "attach" and execution_id is not None:
            try:
                return await self._start(
                    flow, input, execution_id, holder, metadata, flow_version, deadline
                )
            except ExecutionAlreadyExistsError:
                return await self._attach(flow, execution_id)
        return await self._start(
            flow, input, execution_id, holder, metadata, flow_version, deadline
        )

    async def _attach(
        self, flow: Flow[Any, OutputT] | str, execution_id: str
    ) -> ExecutionHandle[OutputT]:
        state, _ = await self._require(execution_id)
        flow_id = flow if isinstance(flow, str) else flow.id
        if state.flow_id != flow_id:
            raise ExecutionAlreadyExistsError(
                f"execution {execution_id!r} exists and runs flow {state.flow_id!r}, not "
                f"{flow_id!r}; cannot attach",
                execution_id=execution_id,
                hint="Pick another execution id",
            )
        log.info("start of %s attached to the existing execution", execution_id)
        return self.handle(execution_id)

    async def _start(
        self,
        flow: Flow[Any, OutputT] | str,
        input: Any,
        execution_id: str | None,
        holder: Lease | None,
        metadata: dict[str, Any] | None,
        flow_version: str | None,
        deadline: timedelta | float | datetime | None = None,
    ) -> ExecutionHandle[OutputT]:
        resolved = self.get_flow(flow, flow_version) if isinstance(flow, str) else flow
        if isinstance(flow, Flow) and self._flows.get(flow.id, {}).get(flow.version) is not flow:
            self.register(flow)
        # Time-ordered by default: new executions land at the right edge of the store's indexes
        # instead of dirtying a random page each (measured: random ids halve throughput once
        # the database outgrows its page cache).
        if holder is not None:
            execution_id = _held(holder, execution_id)
        execution_id = execution_id or new_envelope_id()
        _check_id(execution_id)
        encoded = resolved.encode_input(input, execution_id, limits=self.limits)
        if deadline is not None:
            at = _cancel.deadline_at(self, deadline)
            metadata = {**(metadata or {}), DEADLINE_KEY: at}
            if await self.store.last_sequence(execution_id) < 0:
                # Stored before the start, like every timer before its wait: a crash between
                # the two leaves a timer that finds nothing (harmless), never an execution
                # whose deadline nothing enforces. (An existing id's timer is left alone.)
                await _cancel.schedule_deadline(
                    self, Timer(execution_id, DEADLINE_POSITION, at, "deadline", resolved.id)
                )
        started = [ExecutionStarted(resolved.id, resolved.version, encoded, metadata or {})]
        try:
            fence = holder.fence if holder is not None else 0
            driver = self._new_driver(ExecutionState(execution_id), fence, last_snapshot=-1)
            if holder is not None:
                await driver.append(started)
            else:
                # One atomic write takes the first fence and records sequence 0. An existing
                # execution is refused without being fenced, so a duplicate start can never
                # evict a live holder; a fence taken by someone who wrote nothing is taken
                # over (that holder's own start then loses cleanly).
                current = 0
                for _ in range(_RETRIES):
                    try:
                        await driver.take_over(started, from_fence=current)
                        break
                    except StaleFenceError as exc:
                        if exc.execution_id != execution_id:
                            raise
                        current = await self.store.current_fence(execution_id)
                else:
                    raise StorageError(
                        f"could not start {execution_id!r}: its fence kept moving",
                        execution_id=execution_id,
                        hint="Another process is fencing this id; retry the start",
                    )
        except PayloadError as exc:
            raise PayloadError(exc.message, execution_id=execution_id) from exc
        faults.hit("after_start_before_drive")
        return self._launch(driver, resolved)

    # ------------------------------------------------------------------ resume

    async def resume(
        self,
        execution_id: str,
        event_type: str,
        payload: Any = None,
        *,
        holder: Lease | None = None,
        position: int | None = None,
        idempotency_key: str | None = None,
    ) -> ExecutionHandle[Any]:
        """Deliver a gate's decision and continue the execution.

        The payload is validated against the flow's ``resume_schemas[event_type]`` before
        anything is appended. The first valid decision wins; a later one raises
        :class:`NotWaitingError`. Raises :class:`ExecutionNotFoundError`,
        :class:`ResumeValidationError`, :class:`GateTimedOutError` as the case may be.

        ``position`` (the gate's position, ``state.waiting.position``) pins the decision to
        one gate: if the execution waits at another position (a later gate of the same event
        type), it is refused with :class:`NotWaitingError` and nothing is recorded, so a
        duplicate of an earlier decision can never decide a later gate.

        With ``idempotency_key``, a decision whose key a gate of this execution already took
        (by ``resume`` or ``send``) is a no-op returning a handle: a client retrying after the
        flow moved on to a later gate never answers that gate with its old decision.
        """
        self._check_open()
        self._first_use()
        message_id = None if idempotency_key is None else _mailbox.keyed_id(idempotency_key)
        for _ in range(_RETRIES):
            state, snap_seq = await self._require(execution_id)
            if message_id is not None and _mailbox.taken(state, message_id) is not None:
                return ExecutionHandle(self, execution_id, self._drivers.get(execution_id))
            gate = self._waiting_gate(state, event_type)
            if position is not None and gate.position != position:
                raise NotWaitingError(
                    f"execution {execution_id!r} waits for {event_type!r} at gate position "
                    f"{gate.position}, not {position}: the decision is for another gate",
                    execution_id=execution_id,
                    hint=f"Nothing was recorded; see `loom show {execution_id}`",
                    waiting_position=gate.position,
                    position=position,
                )
            flow = self.get_flow(state.flow_id, state.flow_version)
            normalized = self._validate_resume(flow, state, event_type, payload)
            validator = gate_validator(event_type)
            extra: Sequence[EventPayload] = ()
            if validator is not None:
                normalized = validator(state, gate, normalized)
                if isinstance(normalized, GateRecord):
                    normalized, extra = normalized.payload, normalized.events
            resumed = ExecutionResumed(gate.position, event_type, normalized, message_id)
            handle = await self._continue_with(state, snap_seq, holder, resumed, flow, extra=extra)
            if handle is not None:
                return handle
            # another decision or holder moved first: look again
        raise NotWaitingError(
            f"execution {execution_id!r} kept changing while resuming; try again",
            execution_id=execution_id,
        )

    # ------------------------------------------------------------------ mailbox

    async def send(
        self,
        execution_id: str,
        event_type: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
    ) -> Message:
        """Put a message in the execution's durable mailbox for its gates of ``event_type``.

        Unlike :meth:`resume`, the execution need not be waiting yet: a gate that is waiting
        now takes the message at once; otherwise the next gate of that type the flow reaches
        takes the oldest message waiting for it, and the log records which message that was
        (replay never reads the mailbox). The payload is validated against the flow's
        ``resume_schemas[event_type]`` before anything is stored. The log stays written by
        the execution's holder only; the mailbox is a separate table.

        ``idempotency_key`` makes retries safe: a key already sent stores nothing more, and a
        key a gate already took (through ``send`` or a keyed ``resume``) is never delivered
        again. Returns the stored message (the original one for a repeated key). Raises
        :class:`ExecutionNotFoundError`, :class:`ResumeValidationError`,
        :class:`NotWaitingError` (the execution ended, or ``event_type`` is a sleep's) and
        :class:`ConfigurationError` for a store without a mailbox.
        """
        return await _mailbox.send(self, execution_id, event_type, payload, idempotency_key)

    def _waiting_gate(self, state: ExecutionState, event_type: str) -> Gate:
        eid = state.execution_id
        gate = state.waiting
        _children.refuse_outside_answer(eid, event_type)
        if event_type == TIMER_EVENT:
            raise NotWaitingError(
                f"{TIMER_EVENT!r} is a durable sleep of execution {eid!r}, not a gate: only its "
                "timer ends it (never early)",
                execution_id=eid,
            )
        if (
            gate is not None
            and gate.event_type == event_type
            and state.status is ExecutionStatus.SUSPENDED
        ):
            if gate.timeout_at is not None and self.clock.now() >= gate.timeout_at:
                raise GateTimedOutError(
                    f"gate {event_type!r} of execution {eid!r} timed out; the decision is refused",
                    execution_id=eid,
                    event_type=event_type,
                )
            return gate
        # Not waiting for this event: say why as precisely as the log allows.
        refuse_superseded(state, event_type)
        if any(
            op.kind == OpKind.GATE and op.name == event_type and op.outcome is WaitOutcome.TIMED_OUT
            for op in state.ops.values()
        ):
            raise GateTimedOutError(
                f"gate {event_type!r} of execution {eid!r} already timed out; the decision "
                "is refused",
                execution_id=eid,
                event_type=event_type,
            )
        if state.is_terminal:
            raise NotWaitingError(
                f"execution {eid!r} is {state.status}; it waits for nothing",
                execution_id=eid,
                status=state.status.value,
            )
        if gate is None or state.status is not ExecutionStatus.SUSPENDED:
            raise NotWaitingError(
                f"execution {eid!r} is {state.status}, not waiting on a gate",
                execution_id=eid,
                hint=f"It may already have been decided; see `loom show {eid}`",
            )
        raise NotWaitingError(
            f"execution {eid!r} is waiting for {gate.event_type!r}, not {event_type!r}",
            execution_id=eid,
            waiting_for=gate.event_type,
        )

    def _validate_resume(
        self, flow: Flow[Any, Any], state: ExecutionState, event_type: str, payload: Any
    ) -> Any:
        codec = flow.resume_schemas.get(event_type)
        eid = state.execution_id
        try:
            if codec is None or codec.adapter is None:
                encode_json(payload, limits=self.limits, what="the resume payload")
                return payload
            value = codec.adapter.validate_python(payload)
            return json_dump(codec.adapter, value)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<payload>'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ResumeValidationError(
                f"resume payload for gate {event_type!r} of execution {eid!r} is invalid: "
                f"{problems}",
                execution_id=eid,
                hint="Nothing was recorded; send a payload that matches the gate's schema",
                event_type=event_type,
                problems=exc.errors(include_url=False, include_context=False),
            ) from exc
        except (pydantic_core.PydanticSerializationError, *_NOT_JSON) as exc:
            raise ResumeValidationError(
                f"resume payload for gate {event_type!r} of execution {eid!r} is not "
                f"storable as JSON: {exc!r}",
                execution_id=eid,
                hint="Nothing was recorded; send JSON values only (no NaN, bytes, objects, "
                "cycles or deep nesting)",
                event_type=event_type,
            ) from exc

    # ------------------------------------------------------------------ branching

    async def fork(
        self,
        parent_id: str,
        at_sequence: int | None = None,
        *,
        branch: str | None = None,
        execution_id: str | None = None,
        simulation: bool = False,
    ) -> Branch:
        """Fork ``parent_id`` at ``at_sequence`` (its head when None) into a new execution.

        The branch's log is the parent's events ``0..at_sequence`` followed by its own
        ``EXECUTION_FORKED`` (and, at a gate, the gate re-opened with a fresh deadline), written
        atomically, with a snapshot so the branch loads from there. The parent is untouched.
        ``branch`` also registers a ref of that name (see :class:`loom.storage.BranchRegistry`);
        ``simulation`` marks the branch so its steps can dry-run effects
        (``StepInfo.simulation``, ``ctx.simulation``). ``execution_id`` defaults to a new id.

        Raises :class:`ExecutionNotFoundError` (no parent here: another tenant's is not
        visible), :class:`ForkError` (past the head, inside a step, at the end),
        :class:`ExecutionAlreadyExistsError` (``execution_id`` taken) and
        :class:`RefExistsError` (``branch`` names another point); nothing is written then.
        """
        from loom.runtime import _fork

        return await _fork.fork(
            self,
            parent_id,
            at_sequence,
            branch=branch,
            execution_id=execution_id,
            simulation=simulation,
        )

    async def promote(
        self, from_ref: str, to_ref: str, *, by: str, reason: str | None = None
    ) -> BranchRef:
        """Fast-forward ref ``to_ref`` onto branch ref ``from_ref``; return the moved ref.

        When ``to_ref`` points at the parent ``from_ref`` was forked from at a gate, the ref
        moves (compare-and-swap) and then the parent's gate is closed with a recorded
        ``branches.gate_superseded`` (the parent ends cancelled, with the reason), so approving
        the parent later raises :class:`GateSupersededError`. Of two branches forked at one
        gate, only the first promoted wins: the other gets :class:`PromotionConflictError`,
        nothing changed (the parent's gate stays open). Re-running a promotion interrupted
        after the ref moved closes the gate, once.
        """
        from loom.runtime import _fork

        return await _fork.promote(self, from_ref, to_ref, by=by, reason=reason)

    async def record_outcome(
        self, execution_id: str, decision_id: str, score: float, *, key: str = "outcome"
    ) -> bool:
        """Score decision ``decision_id`` of ``execution_id`` after the fact (the execution
        may have ended). Idempotent per (decision, key): returns False, recording nothing,
        when that pair already has a score (in the flow's log or from an earlier call).

        Raises :class:`ExecutionNotFoundError` and :class:`loom.learning.DecisionError`
        (no such decision, a score that is not a finite number).
        """
        from loom.learning import _outcomes

        return await _outcomes.record_outcome_after(self, execution_id, decision_id, score, key)

    # ------------------------------------------------------------------ recover / cancel

    async def recover(
        self, execution_id: str, *, holder: Lease | None = None
    ) -> ExecutionHandle[Any]:
        """Continue an execution left running by a dead process, from its newest snapshot.

        Completed steps are not re-run; only the interrupted one may run again. A suspended or
        terminal execution is left as it is (the handle reports its state). Appends
        ``EXECUTION_RECOVERED`` under a new fence, so the dead holder can never write again.
        """
        self._check_open()
        self._first_use()
        live = self._drivers.get(execution_id)
        if holder is not None:
            _held(holder, execution_id)
        elif live is not None and not live.done.is_set():
            # Already driven here: do not fence out our own live holder. A worker that passes
            # the lease from its allocate() means to take over, so it skips this.
            return ExecutionHandle(self, execution_id, live)
        state, snap_seq = await self._require(execution_id)
        if state.status not in (ExecutionStatus.RUNNING, ExecutionStatus.PENDING):
            # A parent waiting on a child that ended without telling it is told now.
            await _children.recheck_wait(self, state)
            return ExecutionHandle(self, execution_id, self._drivers.get(execution_id))
        handle = await self._recover_from(state, snap_seq, holder=holder)
        if handle is None:
            raise ExecutionSupersededError(
                f"execution {execution_id!r} moved while it was being recovered: another "
                "holder is driving it",
                execution_id=execution_id,
            )
        return handle

    async def _recover_from(
        self,
        state: ExecutionState,
        snap_seq: int,
        *,
        holder: Lease | None = None,
        from_fence: int | None = None,
    ) -> ExecutionHandle[Any] | None:
        """Append ``EXECUTION_RECOVERED`` after exactly ``state`` and drive the flow on.

        With ``from_fence`` (the fence read before ``state`` was), the take-over is
        conditional on both: if the execution moved since (a newer fence, a newer sequence),
        nothing is written and None is returned. ``recover_abandoned`` uses this so that a
        pass acts only on the state its predicate judged, never on whatever is current.
        """
        if from_fence is not None:
            live = self._drivers.get(state.execution_id)
            if live is not None and not live.done.is_set():
                return None  # driven here since it was judged: it is not abandoned
        flow = self.get_flow(state.flow_id, state.flow_version)
        recovered = ExecutionRecovered(state.last_sequence, snap_seq)
        handle = await self._continue_with(
            state, snap_seq, holder, recovered, flow, from_fence=from_fence
        )
        if handle is not None:
            log.info(
                "recovered execution %s (flow %s) from sequence %d",
                state.execution_id,
                flow.id,
                state.last_sequence,
                extra={"execution_id": state.execution_id, "flow_id": flow.id},
            )
        return handle

    async def cancel(self, execution_id: str, reason: str | None = None) -> ExecutionState:
        """Cancel an execution: fence out its holder, append ``EXECUTION_CANCELLED``.

        The holder's next append is refused and it stops; no later step runs. A terminal
        execution is returned unchanged.

        A flow declared with ``cancel_grace`` may clean up first: the cancel is recorded as a
        request, the flow receives :class:`ExecutionCancelledError` where it is (a ``try`` /
        ``finally`` or ``except`` runs compensating steps, recorded like any others) and ends
        ``cancelled`` whatever it returns; if it has not ended within the grace period, a
        durable timer cancels it outright. That call returns the state with the request
        recorded; a second ``cancel`` while the flow cleans up stops it at once.
        """
        self._check_open()
        state, _ = await self._require(execution_id)
        if state.is_terminal:
            return state
        versions = self._flows.get(state.flow_id, {})
        flow = versions.get(state.flow_version)
        if flow is not None and flow.cancel_grace is not None and cancel_request(state) is None:
            requested = await _cancel.request_cancel(
                self, execution_id, reason, flow, flow.cancel_grace
            )
            await _children.cancel_children(self, requested, reason)
            return requested
        return await self._hard_cancel(execution_id, reason)

    async def _hard_cancel(self, execution_id: str, reason: str | None) -> ExecutionState:
        for _ in range(_RETRIES):
            state, snap_seq = await self._require(execution_id)
            if state.is_terminal:
                return state
            live = self._drivers.get(execution_id)
            if live is not None:
                live.cancel_requested = True  # its refused write is this cancel, not a takeover
            fence = await self.store.acquire_fence(execution_id)
            # Re-read under the new fence: nothing older can append after this point.
            state, snap_seq = await self._require(execution_id)
            if state.is_terminal:
                return state
            driver = self._new_driver(state, fence, last_snapshot=snap_seq)
            try:
                await driver.append([ExecutionCancelled(reason)])
            except StaleFenceError as exc:
                if exc.execution_id != execution_id:
                    raise
                continue
            if self._timer_store is not None:
                await self._timer_store.cancel_timers(execution_id)
            live = self._drivers.get(execution_id)
            if live is not None and live.task is not None and not live.done.is_set():
                live.stop_reason = "cancelled"  # its handle reports the cancellation
                live.task.cancel()
            await _children.notify_parent(self, driver.state)
            await _children.cancel_children(self, driver.state, reason)
            return driver.state
        raise StorageError(
            f"could not cancel {execution_id!r}: it kept changing", execution_id=execution_id
        )

    def stop_driving(self, execution_id: str, why: str = "stopped") -> bool:
        """Stop this process's holder of ``execution_id`` now, leaving the log as of its last
        append (the execution stays running there, resumable by a redispatch or
        ``recover_abandoned``). Returns False when nothing drives it here.

        The holder is fenced out in-process before its task is cancelled, so an effect that
        outlives the cancellation (a step that swallows it, a thread that returns later)
        records nothing and starts no further step. A worker calls this at its drain deadline.
        """
        live = self._drivers.get(execution_id)
        if live is None or live.task is None or live.done.is_set():
            return False
        if live.fenced_out is None:
            live.fenced_out = StaleFenceError(
                f"the holder of {execution_id!r} in this process was stopped ({why})",
                execution_id=execution_id,
                hint="The execution is resumable: redispatch it or run recover_abandoned",
            )
        live.stop_reason = "stopped"
        live.task.cancel()
        return True

    # ------------------------------------------------------------------ driving

    async def _continue_with(
        self,
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
            driver = self._new_driver(state, holder.fence, last_snapshot=snap_seq)
            try:
                await driver.append([event, *extra])
            except StaleFenceError as exc:
                if exc.execution_id != eid:
                    raise  # another execution's refusal: a genuine failure for this one
                raise _superseded(eid, exc) from exc
            return self._launch(driver, flow)
        current = from_fence if from_fence is not None else await self.store.current_fence(eid)
        driver = self._new_driver(state, current + 1, last_snapshot=snap_seq)
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
        return self._launch(driver, flow)

    def _new_driver(self, state: ExecutionState, fence: int, *, last_snapshot: int) -> Driver:
        driver = Driver(
            self.store,
            state,
            fence,
            self.clock,
            snapshot_every=self.snapshot_every,
            limits=self.limits,
            last_snapshot=last_snapshot,
        )
        if self._timer_store is not None:
            driver.schedule_timer = self._schedule_timer
        driver.intercept = self._intercept
        driver.resources = self.resources
        driver.runtime = self
        return driver

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` as a task this runtime owns (``close()`` stops it)."""
        self._own(asyncio.create_task(work, name=name))

    def _own(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _schedule_timer(self, timer: Timer) -> None:
        assert self._timer_store is not None
        await self._timer_store.schedule_timer(timer)
        self._first_use()
        if (
            self.timers is not None
            and self.timers.running
            and timer.fire_at <= self.clock.now() + self.timers.poll_interval
        ):
            self.timers.kick()  # due before the next poll: look now

    def _first_use(self) -> None:
        """The first-use hook, called by every entry point that uses the runtime (entering
        it, start, resume, send, recover, a wait, scheduling a timer).

        With ``timers=True`` the first call starts timer serving, and only the first: an
        explicit :meth:`stop_timers` (or ``close()``) is final for the automatic start, so a
        later use never restarts serving behind the caller's back.
        """
        if self._auto_timers:
            self._auto_timers = False
            self._start_timers()

    def _start_timers(self) -> None:
        if self.timers is not None and not self._closed:
            self.timers.start()

    def start_timers(self) -> TimerService:
        """Serve this store's due timers in the background (on the running event loop) until
        :meth:`stop_timers` or ``close()``; whatever ``timers=`` said. Idempotent.

        Raises :class:`ConfigurationError` when the store keeps no timers or the runtime is
        closed.
        """
        self._check_open()
        if self.timers is None:
            raise ConfigurationError("this runtime's store keeps no timers")
        self._start_timers()
        return self.timers

    async def stop_timers(self) -> None:
        """Stop serving timers (executions and their stored timers are untouched).

        Final until :meth:`start_timers`: with ``timers=True`` no later use (start, resume,
        recover, a wait) starts serving again.
        """
        self._auto_timers = False
        if self.timers is not None:
            await self.timers.stop()

    async def _wake_locally(self, timer: Timer) -> WakeOutcome:
        outcome, _ = await self.fire_timer(timer.execution_id, timer.position)
        return outcome

    async def fire_timer(
        self, execution_id: str, position: int, *, holder: Lease | None = None
    ) -> tuple[WakeOutcome, ExecutionHandle[Any] | None]:
        """End the timed wait at ``position`` if it is due and still open (a fenced wake).

        A sleep resumes; a gate whose timeout passed resumes with :class:`GateTimedOutError`
        raised in the flow. Never early (the runtime's clock decides) and never twice (the
        log decides). ``STALE``: the wait already ended or the execution did. ``EARLY``: not
        due yet, or the wait is not logged yet (its timer is stored just before it), so the
        timer must be tried again later.
        """
        self._check_open()
        if position == DEADLINE_POSITION:
            return await _cancel.fire_deadline(self, execution_id), None
        if position == CANCEL_GRACE_POSITION:
            return await _cancel.fire_cancel_grace(self, execution_id), None
        for attempt in range(_RETRIES):
            state, snap_seq = await self._load(execution_id)
            if state is None or state.is_terminal:
                return WakeOutcome.STALE, None
            op = state.ops.get(position)
            if op is not None and op.outcome is not None:
                return WakeOutcome.STALE, None
            gate = state.waiting
            if gate is None or gate.position != position or gate.timeout_at is None:
                return WakeOutcome.EARLY, None  # the wait is not in the log (yet)
            if self.clock.now() < gate.timeout_at:
                return WakeOutcome.EARLY, None
            flow = self.get_flow(state.flow_id, state.flow_version)
            fired = TimerFired(position, timed_out=gate.event_type != TIMER_EVENT)
            # The fence of the log's last event is nearly always the current one (the holder
            # that suspended wrote it): trying it first saves a read per wake. The take-over
            # is a compare-and-swap, so a wrong guess changes nothing and the retry reads it.
            guess = state.fence if attempt == 0 and holder is None and state.fence > 0 else None
            handle = await self._continue_with(
                state, snap_seq, holder, fired, flow, from_fence=guess
            )
            if handle is not None:
                log.info(
                    "execution %s: %s at position %d",
                    execution_id,
                    "sleep woke" if gate.event_type == TIMER_EVENT else "gate timed out",
                    position,
                    extra={"execution_id": execution_id, "flow_id": flow.id},
                )
                return WakeOutcome.FIRED, handle
        return WakeOutcome.EARLY, None

    async def serve_timers(self) -> None:
        """Fire this store's timers until cancelled (for a process that only does that)."""
        if self.timers is None:
            raise ConfigurationError("this runtime's store keeps no timers")
        await self.timers.run_forever()

    def _launch(self, driver: Driver, flow: Flow[Any, OutputT]) -> ExecutionHandle[OutputT]:
        eid = driver.state.execution_id
        replaced = self._drivers.get(eid)
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
        self._drivers[eid] = driver
        driver.task = asyncio.create_task(self._drive(driver, flow), name=f"loom:{eid}")
        self._tasks.add(driver.task)
        driver.task.add_done_callback(self._tasks.discard)
        # A task cancelled before it first ran (a cancel right after start) never enters
        # _drive, so its handle learns the end here.
        driver.task.add_done_callback(lambda _: self._finished(driver))
        return ExecutionHandle(self, eid, driver)

    def _finished(self, driver: Driver) -> None:
        if driver.done.is_set():
            return
        eid = driver.state.execution_id
        if driver.error is None and driver.stop_reason != "cancelled":
            driver.error = self._stop_error(driver)
        driver.done.set()
        if self._drivers.get(eid) is driver:
            del self._drivers[eid]

    @staticmethod
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

    async def _drive(self, driver: Driver, flow: Flow[Any, Any]) -> None:
        eid = driver.state.execution_id
        try:
            if self.heartbeat is not None:
                await self.heartbeat.begin(driver)
            outcome = await self._run_flow(driver, flow)
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
                await _children.notify_parent(self, driver.state)
        except StaleFenceError as exc:
            driver.error = await self._fenced_out_error(driver, exc)
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
                driver.error = self._stop_error(driver)
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
            current = self._drivers.get(eid) is driver
            if current:
                del self._drivers[eid]
            if self.heartbeat is not None:
                await self.heartbeat.end(driver, release=current)

    async def _run_flow(
        self, driver: Driver, flow: Flow[Any, Any]
    ) -> ExecutionCompleted | ExecutionFailed | ExecutionCancelled | None:
        """Run (or replay) the flow; return its terminal event, or None when it suspended.

        Errors that mean the execution must stay resumable (non-determinism, storage,
        fencing) propagate; anything else the flow raises is its failure, recorded.
        """
        ctx = WorkflowContext(driver, flow)
        token = _current_flow.set(ctx)
        try:
            outcome = await self._run_body(ctx, driver, flow)
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
        self, ctx: WorkflowContext, driver: Driver, flow: Flow[Any, Any]
    ) -> ExecutionCompleted | ExecutionFailed | ExecutionCancelled | None:
        outcome = await self._run_body_outcome(ctx, driver, flow)
        request = cancel_request(driver.state)
        if outcome is not None and request is not None:
            # A cancelled flow that cleaned up ends cancelled, whatever it returned or raised.
            return ExecutionCancelled(request.get("reason"))
        return outcome

    async def _run_body_outcome(
        self, ctx: WorkflowContext, driver: Driver, flow: Flow[Any, Any]
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

    async def _fenced_out_error(self, driver: Driver, exc: StaleFenceError) -> BaseException | None:
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
        latest = await self.load_state(eid)
        current = exc.details.get("current_fence")
        if (
            latest is not None
            and not latest.is_terminal
            and isinstance(current, int)
            and latest.fence < current
        ):
            # The new fence has written nothing yet. A cancel elsewhere fences first and
            # appends second: give its append a moment before calling this a supersession.
            await self.store.wait_for_append(eid, latest.last_sequence, timeout=_FENCED_GRACE)
            latest = await self.load_state(eid)
        if latest is not None and latest.status is ExecutionStatus.CANCELLED:
            return None
        return _superseded(eid, exc)

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("this WorkflowRuntime is closed")

    async def close(self, *, drain: float | None = None) -> None:
        """Stop driving executions (they stay resumable) and close the store.

        New work is refused at once. Without ``drain`` the executions in flight are stopped
        now (cancelled mid-step; the interrupted step may run again on recovery). With
        ``drain`` (seconds) they first get that long to suspend or finish; past the deadline
        each stops at its next durable boundary (right after its in-flight step's result is
        recorded, so nothing completed is lost and nothing after it starts); one that reaches
        no boundary within another ``drain`` seconds is cancelled, so close stays bounded.
        """
        if self._closed:
            return
        self._closed = True
        if self.timers is not None:
            await self.timers.stop()
        if drain is not None and self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=max(0.0, drain))
            if pending:
                self._stopping_at_boundary = True
                for driver in list(self._drivers.values()):
                    driver.stop_at_boundary = True
                await asyncio.wait(pending, timeout=max(0.0, drain))
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.heartbeat is not None:
            await self.heartbeat.stop()
        await self.store.close()

    async def __aenter__(self) -> WorkflowRuntime:
        self._first_use()  # an open runtime wakes due sleeps even if it starts nothing
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


#: How often a conditional write is retried after losing to a concurrent writer before the
#: caller is told the execution keeps changing (each retry re-reads the log first).
_RETRIES = 8
#: How long a fenced-out holder waits for the new fence's first write (a cancel elsewhere
#: fences, then appends) before it reports a supersession.
_FENCED_GRACE = 2.0


@dataclass(frozen=True, slots=True)
class Lease:
    """A fence the caller holds on one execution (from :meth:`WorkflowRuntime.acquire_lease`
    or a worker's allocation). A command given one appends under it, unconditionally; losing
    it to a newer holder is a superseded refusal. Without one, a command takes the execution
    over conditionally (only if nobody moved since it read the log)."""

    execution_id: str
    fence: int


def _held(holder: Lease, execution_id: str | None) -> str:
    if not isinstance(holder, Lease) or holder.fence < 1:
        raise ConfigurationError(f"holder must be a Lease with a fence >= 1, not {holder!r}")
    if execution_id is not None and execution_id != holder.execution_id:
        raise ConfigurationError(
            f"the lease is for execution {holder.execution_id!r}, not {execution_id!r}",
            execution_id=execution_id,
        )
    return holder.execution_id


def _check_id(execution_id: str) -> None:
    problem = execution_id_problem(execution_id)
    if problem is not None:
        raise ConfigurationError(f"{problem} (got {execution_id!r})")
