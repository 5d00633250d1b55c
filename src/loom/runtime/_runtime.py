"""WorkflowRuntime: registers flows and starts, resumes, recovers and cancels executions.

This module holds the runtime object, its registry and its read side; the commands live in
``_commands`` (start, resume, recover, an outright cancel), driving a flow in ``_driving``,
timer wakes in ``_timer_wake``, and the caller's :class:`Lease` in ``_fence``."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from datetime import datetime, timedelta
from types import MappingProxyType, TracebackType
from typing import Any, Literal, TypeVar

from loom._settings import seconds_setting
from loom.errors import (
    ConfigurationError,
    CorruptEventError,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    FlowNotFoundError,
    StaleFenceError,
)
from loom.model import (
    DEFAULT_LIMITS,
    Envelope,
    EventPayload,
    ExecutionState,
    ExecutionSummary,
    Gate,
    PayloadLimits,
    apply_event,
)
from loom.runtime import _await, _cancel, _children, _commands, _driving, _mailbox, _timer_wake
from loom.runtime._cancel import (
    cancel_request,
)
from loom.runtime._clock import Clock, SystemClock
from loom.runtime._driver import Driver
from loom.runtime._fence import Lease, check_id
from loom.runtime._fork import Branch
from loom.runtime._handle import ExecutionHandle
from loom.runtime._intercept import StepInterceptor, build_chain
from loom.runtime._lease import Heartbeat
from loom.runtime._sdk import Flow
from loom.runtime.timers import TimerService, WakeOutcome
from loom.storage import BranchRef, ExecutionQuery, LeaseStore, Message, Store, Timer, TimerStore
from loom.storage._common import validate_snapshot

__all__ = ["ExecutionHandle", "Lease", "WorkflowRuntime"]  # ExecutionHandle is re-exported here

log = logging.getLogger("loom.runtime")

OutputT = TypeVar("OutputT")


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
                self._timer_store,
                self._wake_locally,
                clock=self.clock,
                flow_ids=self._flows.keys,
                prepare=self._prepare_wakes,
            )
        #: whether the first use still has to start timer serving (``timers=True``, not
        #: stopped explicitly yet)
        self._auto_timers = timers
        self.interceptors: tuple[StepInterceptor, ...] = tuple(interceptors)
        self._intercept = build_chain(self.interceptors)
        self.resources: Mapping[str, Any] = MappingProxyType(dict(resources or {}))
        lease_ttl = seconds_setting(lease_ttl, "lease_ttl")
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
        check_id(execution_id)
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
        check_id(execution_id)
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
        check_id(execution_id)
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
        check_id(execution_id)
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
                return await _commands.start(
                    self, flow, input, execution_id, holder, metadata, flow_version, deadline
                )
            except ExecutionAlreadyExistsError:
                return await _commands.attach(self, flow, execution_id)
        return await _commands.start(
            self, flow, input, execution_id, holder, metadata, flow_version, deadline
        )

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
        return await _commands.resume(
            self,
            execution_id,
            event_type,
            payload,
            holder=holder,
            position=position,
            idempotency_key=idempotency_key,
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
        return _commands.waiting_gate(self, state, event_type)

    def _validate_resume(
        self, flow: Flow[Any, Any], state: ExecutionState, event_type: str, payload: Any
    ) -> Any:
        return _commands.validate_resume(self, flow, state, event_type, payload)

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
        return await _commands.recover(self, execution_id, holder=holder)

    async def _recover_from(
        self,
        state: ExecutionState,
        snap_seq: int,
        *,
        holder: Lease | None = None,
        from_fence: int | None = None,
    ) -> ExecutionHandle[Any] | None:
        return await _commands.recover_from(
            self, state, snap_seq, holder=holder, from_fence=from_fence
        )

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
        return await _commands.hard_cancel(self, execution_id, reason)

    async def _hard_cancel(self, execution_id: str, reason: str | None) -> ExecutionState:
        return await _commands.hard_cancel(self, execution_id, reason)

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

    # The work is in ``_driving`` / ``_commands`` / ``_timer_wake``; these methods stay because
    # the sibling modules (cancel, fork, mailbox, recovery), the CLI and the placement reach
    # them through the runtime they are given.

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
        return await _driving.continue_with(
            self, state, snap_seq, holder, event, flow, from_fence=from_fence, extra=extra
        )

    def _new_driver(self, state: ExecutionState, fence: int, *, last_snapshot: int) -> Driver:
        return _driving.new_driver(self, state, fence, last_snapshot=last_snapshot)

    def _launch(self, driver: Driver, flow: Flow[Any, OutputT]) -> ExecutionHandle[OutputT]:
        return _driving.launch(self, driver, flow)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` as a task this runtime owns (``close()`` stops it)."""
        self._own(asyncio.create_task(work, name=name))

    def _own(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _schedule_timer(self, timer: Timer) -> None:
        await _timer_wake.schedule_timer(self, timer)

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
        return await _timer_wake.wake_locally(self, timer)

    async def _prepare_wakes(self, timers: Sequence[Timer]) -> dict[tuple[str, int], WakeOutcome]:
        return await _timer_wake.prepare_wakes(self, timers)

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
        return await _timer_wake.fire_timer(self, execution_id, position, holder=holder)

    async def serve_timers(self) -> None:
        """Fire this store's timers until cancelled (for a process that only does that)."""
        if self.timers is None:
            raise ConfigurationError("this runtime's store keeps no timers")
        await self.timers.run_forever()

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
