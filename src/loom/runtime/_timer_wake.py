"""Timers seen from the runtime: storing one for a wait (and kicking the service when it is
due before its next poll), and the fenced wake that ends a due wait (alone, or as one of a
claimed batch whose states were read together)."""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from loom.errors import LoomError, StorageWriteError
from loom.model import Envelope, ExecutionState, TimerFired, apply_event
from loom.runtime import _cancel
from loom.runtime._cancel import CANCEL_GRACE_POSITION, DEADLINE_POSITION
from loom.runtime._context import TIMER_EVENT
from loom.runtime._driver import DeferredTakeOver, Driver
from loom.runtime._driving import continue_with, launch, new_driver
from loom.runtime._fence import RETRIES, Lease
from loom.runtime._handle import ExecutionHandle
from loom.runtime._sdk import Flow
from loom.runtime.timers import WakeOutcome
from loom.storage import EventStore, LoadsMany, StoredExecution, TakesOverMany, Timer
from loom.storage._common import validate_snapshot

if TYPE_CHECKING:
    from loom.runtime._runtime import WorkflowRuntime

log = logging.getLogger("loom.runtime")


async def schedule_timer(runtime: WorkflowRuntime, timer: Timer) -> None:
    assert runtime._timer_store is not None
    await runtime._timer_store.schedule_timer(timer)
    runtime._first_use()
    if (
        runtime.timers is not None
        and runtime.timers.running
        and timer.fire_at <= runtime.clock.now() + runtime.timers.poll_interval
    ):
        runtime.timers.kick()  # due before the next poll: look now


Loaded = tuple[ExecutionState, int]


@dataclass(slots=True)
class _Taken:
    """A wake whose take-over (TIMER_FIRED under the next fence) was committed with its
    batch's: the wake starts its driver, or only reports it (``launched``: its flow ran on
    already, the take-over written with the flow's outcome or before anything else)."""

    position: int
    driver: Driver
    flow: Flow[Any, Any]
    woke: str
    launched: bool


#: What :func:`prepare_wakes` did for the claimed batch a wake belongs to, by execution id: the
#: state read with the batch, or the take-over committed with it (set in the context the
#: batch's wakes run in; None outside a batch).
_BATCH: ContextVar[dict[str, Loaded | _Taken] | None] = ContextVar("loom_timer_batch", default=None)

#: Where a wake's flow left the replay (see ``DeferredTakeOver``) last time, per runtime, by
#: (flow id, version, position): those wakes take over first and run after, as a lone wake
#: does, instead of running the flow twice.
_LEFT_REPLAY: weakref.WeakKeyDictionary[WorkflowRuntime, set[tuple[str, str, int]]] = (
    weakref.WeakKeyDictionary()
)

#: How long a batch's take-overs wait for the flows run on ahead of them to reach their first
#: write; a flow that is slower (it awaits something that is not the store) writes alone.
_GATHER_TIMEOUT = 1.0


async def wake_locally(runtime: WorkflowRuntime, timer: Timer) -> WakeOutcome:
    runtime._check_open()
    batch = _BATCH.get()
    # Popped: a second timer of the same execution in the batch reads afresh.
    entry = None if batch is None else batch.pop(timer.execution_id, None)
    if isinstance(entry, _Taken):
        if entry.position == timer.position:
            if not entry.launched:
                launch(runtime, entry.driver, entry.flow)
            _log_fired(timer.execution_id, entry.woke, timer.position, entry.flow)
            return WakeOutcome.FIRED
        assert batch is not None
        batch[timer.execution_id] = entry  # its own timer's wake reports it
        entry = None
    outcome, _ = await fire_timer(runtime, timer.execution_id, timer.position, preloaded=entry)
    return outcome


async def prepare_wakes(
    runtime: WorkflowRuntime, timers: Sequence[Timer]
) -> dict[tuple[str, int], WakeOutcome]:
    """Read the states of a claimed batch's executions at once (one query where the store
    :class:`LoadsMany`), and take over every execution whose wait they show due in one write
    (where the store :class:`TakesOverMany`), for the batch's wakes (run in this context).

    A state read with the batch is trusted only to *fire*: the take-over that ends the wait
    is a compare-and-swap on the fence and the log's end, so it is refused (and the wake
    reads again) if anything moved since. Any other verdict (stale, early) is decided again
    on a fresh read, exactly as a lone wake decides it.

    The flows run on before that write, as far as replaying what their logs settled: a flow
    that gets to its end that way has its outcome written in the same write as its
    take-over, and one that gets to anything else (a step, a wait, a decision, a child)
    stops there until its take-over is written, then runs again from the durable state
    (see ``DeferredTakeOver``). Nothing new ever runs before its take-over is durable.
    Returns the wakes that are over already (those fired here), which get no wake task.
    """
    states: dict[str, Loaded | _Taken] = {}
    states.update(await load_states(runtime, [t.execution_id for t in timers if t.position >= 0]))
    _BATCH.set(states)
    store = runtime.store
    decided: dict[tuple[str, int], WakeOutcome] = {}
    if states and isinstance(store, TakesOverMany):
        await _take_over_batch(runtime, store, timers, states)
        for eid, entry in list(states.items()):
            if isinstance(entry, _Taken) and entry.launched:
                del states[eid]
                _log_fired(eid, entry.woke, entry.position, entry.flow)
                decided[eid, entry.position] = WakeOutcome.FIRED
    return decided


class _TakeOvers:
    """The take-overs of one batch, written together in one ``take_over_many`` once every
    flow run on ahead has handed in its first write (or the gathering timed out: what comes
    later is written alone)."""

    def __init__(self, store: TakesOverMany, ahead: int) -> None:
        self.store = store
        self.requests: list[tuple[list[Envelope], int]] = []
        self.waiters: list[asyncio.Future[LoomError | None]] = []
        self.ahead = ahead  # flows run on ahead whose first write is not handed in yet
        self.complete = asyncio.Event()
        self.closed = False
        if ahead == 0:
            self.complete.set()

    def add(self, envelopes: list[Envelope], from_fence: int) -> asyncio.Future[LoomError | None]:
        future = asyncio.get_running_loop().create_future()
        self.requests.append((envelopes, from_fence))
        self.waiters.append(future)
        return future

    async def write(self, envelopes: list[Envelope], from_fence: int) -> None:
        """A flow run on ahead hands in its take-over (and what follows it): raises its
        refusal, as ``take_over`` would."""
        if self.closed:
            await cast("EventStore", self.store).take_over(envelopes, from_fence=from_fence)
            return
        future = self.add(envelopes, from_fence)
        self.arrived()
        refusal = await future
        if refusal is not None:
            raise refusal

    def arrived(self) -> None:
        self.ahead -= 1
        if self.ahead <= 0:
            self.complete.set()

    async def run(self) -> list[LoomError | None] | None:
        """Write them all; the outcome of each (None: written), or None when the write failed
        as a whole (nothing written, or not known: every wake then reads afresh)."""
        try:
            async with asyncio.timeout(_GATHER_TIMEOUT):
                await self.complete.wait()
        except TimeoutError:
            pass
        self.closed = True
        requests, waiters = self.requests, self.waiters
        try:
            outcomes = await self.store.take_over_many(requests)
        except BaseException as exc:
            failed = exc if isinstance(exc, Exception) else StorageWriteError(repr(exc))
            for future in waiters:
                if not future.done():
                    future.set_exception(failed)
            if isinstance(exc, Exception):
                log.debug("taking over %d executions at once failed: %r", len(requests), exc)
                return None
            raise
        for future, outcome in zip(waiters, outcomes, strict=True):
            if not future.done():
                future.set_result(outcome)
        return outcomes


async def _take_over_batch(
    runtime: WorkflowRuntime,
    store: TakesOverMany,
    timers: Sequence[Timer],
    states: dict[str, Loaded | _Taken],
) -> None:
    wakes: list[tuple[Timer, Driver, Flow[Any, Any], str, bool]] = []
    left = _LEFT_REPLAY.setdefault(runtime, set())
    for timer in timers:
        loaded = states.get(timer.execution_id)
        if not isinstance(loaded, tuple) or _verdict(runtime, loaded[0], timer.position):
            continue
        state, snap_seq = loaded
        gate = state.waiting
        if gate is None or state.fence < 1:
            continue
        try:
            flow = runtime.get_flow(state.flow_id, state.flow_version)
        except LoomError:
            continue  # its wake reports it
        driver = new_driver(runtime, state, state.fence + 1, last_snapshot=snap_seq)
        woke = "sleep woke" if gate.event_type == TIMER_EVENT else "gate timed out"
        # Run on ahead only where nothing else in this process drives it (starting a driver
        # stops the one it replaces).
        live = runtime._drivers.get(timer.execution_id)
        ahead = (live is None or live.done.is_set()) and (
            flow.id,
            flow.version,
            timer.position,
        ) not in left
        wakes.append((timer, driver, flow, woke, ahead))
        # Its state is the driver's now: no wake may start from it again.
        del states[timer.execution_id]
    if not wakes:
        return
    takeovers = _TakeOvers(store, sum(1 for w in wakes if w[4]))
    pending: list[tuple[Timer, Driver, Flow[Any, Any], str, list[Envelope] | None]] = []
    for timer, driver, flow, woke, ahead in wakes:
        gate = driver.state.waiting
        assert gate is not None
        fired = TimerFired(timer.position, timed_out=gate.event_type != TIMER_EVENT)
        from_fence = driver.fence - 1
        try:
            envelopes = driver.take_over_envelopes([fired], from_fence=from_fence)
        except LoomError:
            if ahead:
                takeovers.arrived()
            continue  # its wake reports it
        if not ahead:
            takeovers.add(envelopes, from_fence)
            pending.append((timer, driver, flow, woke, envelopes))
            continue
        driver.taken_over(envelopes)  # folded now; written with the flow's first write
        key = (flow.id, flow.version, timer.position)
        driver.deferred = DeferredTakeOver(
            envelopes, from_fence, takeovers.write, left_replay=functools.partial(left.add, key)
        )
        launch(runtime, driver, flow)
        pending.append((timer, driver, flow, woke, None))
    outcomes = await takeovers.run()
    if outcomes is None:
        return
    # Each request's outcome, in the order they were handed in, by execution id.
    written = {
        envs[0].execution_id: outcome
        for (envs, _), outcome in zip(takeovers.requests, outcomes, strict=True)
    }
    for timer, driver, flow, woke, built in pending:
        eid = timer.execution_id
        if eid in written and written[eid] is None:
            if built is not None:  # not run on ahead: its wake starts it
                driver.taken_over(built)
            states[eid] = _Taken(timer.position, driver, flow, woke, built is None)


def _log_fired(execution_id: str, woke: str, position: int, flow: Flow[Any, Any]) -> None:
    log.info(
        "execution %s: %s at position %d",
        execution_id,
        woke,
        position,
        extra={"execution_id": execution_id, "flow_id": flow.id},
    )


async def load_states(runtime: WorkflowRuntime, execution_ids: Sequence[str]) -> dict[str, Loaded]:
    """The folded states (and snapshot sequences) of the executions the store reads in one
    go; empty when it cannot (each wake then loads its own). An execution whose records do
    not fold cleanly is left out: its own load reports why."""
    store = runtime.store
    if not execution_ids or not isinstance(store, LoadsMany):
        return {}
    try:
        stored = await store.load_many(execution_ids)
    except LoomError as exc:
        log.debug(
            "reading %d executions at once failed; each is read alone: %r", len(execution_ids), exc
        )
        return {}
    states: dict[str, Loaded] = {}
    for eid, one in stored.items():
        try:
            states[eid] = _fold(one)
        except LoomError:
            continue
    return states


def _fold(stored: StoredExecution) -> Loaded:
    """The state ``stored`` describes (as ``WorkflowRuntime._load`` folds it)."""
    state, snap_seq = ExecutionState(stored.execution_id), -1
    if stored.snapshot is not None:
        state = validate_snapshot(
            stored.snapshot, stored.execution_id, last_sequence=stored.last_sequence
        )
        snap_seq = stored.snapshot.sequence
    for env in stored.events:
        apply_event(state, env)
    return state, snap_seq


def _verdict(
    runtime: WorkflowRuntime, state: ExecutionState | None, position: int
) -> WakeOutcome | None:
    """What a wake of the wait at ``position`` does given ``state``: None to fire it."""
    if state is None or state.is_terminal:
        return WakeOutcome.STALE
    op = state.ops.get(position)
    if op is not None and op.outcome is not None:
        return WakeOutcome.STALE
    gate = state.waiting
    if gate is None or gate.position != position or gate.timeout_at is None:
        return WakeOutcome.EARLY  # the wait is not in the log (yet)
    if runtime.clock.now() < gate.timeout_at:
        return WakeOutcome.EARLY
    return None


async def fire_timer(
    runtime: WorkflowRuntime,
    execution_id: str,
    position: int,
    *,
    holder: Lease | None = None,
    preloaded: Loaded | None = None,
) -> tuple[WakeOutcome, ExecutionHandle[Any] | None]:
    if position == DEADLINE_POSITION:
        return await _cancel.fire_deadline(runtime, execution_id), None
    if position == CANCEL_GRACE_POSITION:
        return await _cancel.fire_cancel_grace(runtime, execution_id), None
    for attempt in range(RETRIES):
        if preloaded is not None and _verdict(runtime, preloaded[0], position) is None:
            state, snap_seq = preloaded
        else:
            loaded, snap_seq = await runtime._load(execution_id)
            verdict = _verdict(runtime, loaded, position)
            if verdict is not None or loaded is None:
                return verdict or WakeOutcome.STALE, None
            state = loaded
        preloaded = None
        gate = state.waiting
        assert gate is not None  # _verdict saw it
        flow = runtime.get_flow(state.flow_id, state.flow_version)
        fired = TimerFired(position, timed_out=gate.event_type != TIMER_EVENT)
        # The fence of the log's last event is nearly always the current one (the holder
        # that suspended wrote it): trying it first saves a read per wake. The take-over
        # is a compare-and-swap, so a wrong guess changes nothing and the retry reads it.
        guess = state.fence if attempt == 0 and holder is None and state.fence > 0 else None
        handle = await continue_with(
            runtime, state, snap_seq, holder, fired, flow, from_fence=guess
        )
        if handle is not None:
            woke = "sleep woke" if gate.event_type == TIMER_EVENT else "gate timed out"
            _log_fired(execution_id, woke, position, flow)
            return WakeOutcome.FIRED, handle
    return WakeOutcome.EARLY, None
