"""The single writer of one execution inside one process: sequences, fence, snapshots."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import operator
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, cast

from loom.errors import (
    ConfigurationError,
    ExecutionEndedError,
    LoomError,
    StaleFenceError,
    StorageError,
    StorageWriteError,
)
from loom.model import (
    Envelope,
    EventPayload,
    ExecutionState,
    OpRecord,
    OpStatus,
    PayloadLimits,
    UIPatched,
    apply_event,
    encode_json,
    new_envelope_id,
)
from loom.model._state import LazyOps
from loom.runtime._clock import Clock
from loom.runtime._intercept import CallNext
from loom.storage import (
    AppendsNow,
    AppendsWithBlobs,
    BlobStore,
    MailboxStore,
    Snapshot,
    SnapshotSegments,
    Store,
    Timer,
)

if TYPE_CHECKING:
    from loom.runtime._runtime import WorkflowRuntime

__all__ = ["DeferredTakeOver", "Driver", "LeavesReplay", "StopAtBoundary"]


async def _store_call(write: Awaitable[None], execution_id: str) -> None:
    """Await a store write, turning anything but a Loom error into StorageWriteError.

    A store that leaks a driver exception (a pool timeout, a socket error) must not look like
    the flow's own failure: that would record EXECUTION_FAILED for an execution that is only
    waiting for its storage, instead of leaving it resumable for a retry.
    """
    try:
        await write
    except LoomError:
        raise
    except Exception as exc:
        raise _storage_failure(execution_id, exc) from exc


def _storage_failure(execution_id: str, exc: Exception) -> StorageWriteError:
    return StorageWriteError(
        f"the store failed writing {execution_id!r}: {exc!r}",
        execution_id=execution_id,
        hint="The execution is resumable once the store is reachable again",
    )


log = logging.getLogger("loom.runtime")

#: A suspension writes a snapshot only when at least this many events were appended since the
#: last one (see Driver.snapshot_on_suspend).
SUSPEND_SNAPSHOT_MIN_EVENTS = 32


class StopAtBoundary(BaseException):
    """Raised right after a durable append once the runtime asked the driver to stop there
    (``WorkflowRuntime.close(drain=...)`` past its deadline). Internal control flow: do not
    catch it with a bare ``except:``; the execution stays resumable from that append."""


class LeavesReplay(BaseException):
    """Raised in a flow whose take-over is still deferred (:class:`DeferredTakeOver`) when it
    reaches an operation that is not a replay of a settled record: the run stops there, the
    take-over is written alone, and the flow runs again from the durable state. Internal
    control flow: nothing new (no step, wait, decision, child) ever runs while deferred. A flow
    that catches it anyway (a bare ``except:``) changes nothing: each later operation of that
    run raises it again, and whatever the run then returns or raises is discarded."""


@dataclasses.dataclass(slots=True, eq=False)
class DeferredTakeOver:
    """A take-over (a timer wake's TIMER_FIRED under the next fence) folded into the driver's
    state but not yet written: it is written with the flow's first append (its outcome, when
    the flow only replays to its end), or alone before anything else the flow does.

    ``write(envelopes, from_fence)`` writes the take-over (these envelopes and whatever
    follows) and raises its refusal; ``left_replay`` is told when the run had to stop.
    """

    envelopes: list[Envelope]
    from_fence: int
    write: Callable[[list[Envelope], int], Awaitable[None]]
    left_replay: Callable[[], None] | None = None
    #: The run reached an operation that is not a pure replay: nothing more is written in it.
    aborted: bool = False


def _retrieve(fut: asyncio.Future[None]) -> None:
    """Mark a detached write's outcome as seen (its caller was cancelled)."""
    if not fut.cancelled():
        fut.exception()


#: What each store object supports, checked once per store: a runtime-checkable protocol's
#: isinstance costs ~18 µs, three of them on every execution started, resumed or woken.
_CAPABILITIES: weakref.WeakKeyDictionary[Any, tuple[bool, bool, bool, bool]] = (
    weakref.WeakKeyDictionary()
)


def _defined_together(cls: type, fast: str, general: str) -> bool:
    """Whether ``cls`` takes ``fast`` and ``general`` from the same class: a subclass that
    overrides only ``append`` (to count or wrap the writes) must see every write there, so its
    inherited ``append_now`` is not used."""
    fast_owner, general_owner = (
        next((c for c in cls.__mro__ if name in c.__dict__), None) for name in (fast, general)
    )
    # Neither found on the class (a proxy's __getattr__ answers them): not known, not used.
    return fast_owner is not None and fast_owner is general_owner


def _capabilities(store: Store) -> tuple[bool, bool, bool, bool]:
    """(keeps a mailbox, keeps blobs, appends with blobs in one write, appends in the
    caller's frame) for ``store``."""
    try:
        known = _CAPABILITIES.get(store)
    except TypeError:  # not weak-referenceable or not hashable: just check
        known = None
    if known is None:
        known = (
            isinstance(store, MailboxStore),
            isinstance(store, BlobStore),
            isinstance(store, AppendsWithBlobs),
            isinstance(store, AppendsNow)
            and _defined_together(type(store), "append_now", "append"),
        )
        try:
            _CAPABILITIES[store] = known
        except TypeError:
            pass
    return known


class Driver:
    """Appends an execution's events under one fence and keeps the folded state current.

    Owned by one asyncio task tree; ``lock`` serialises appends from steps a flow runs
    concurrently (``asyncio.gather``), so sequences stay dense.
    """

    def __init__(
        self,
        store: Store,
        state: ExecutionState,
        fence: int,
        clock: Clock,
        *,
        snapshot_every: int,
        limits: PayloadLimits,
        last_snapshot: int,
    ) -> None:
        self.store = store
        self.state = state
        self.fence = fence
        self.clock = clock
        self.snapshot_every = snapshot_every
        self.limits = limits
        self.last_snapshot = last_snapshot
        #: What each op looked like at the last snapshot this driver wrote (None: it wrote
        #: none, so the next one is whole). The fold replaces JSON values and never mutates
        #: them in place, so comparing these tuples finds every op a segment must carry.
        #: Kept for a loaded state's ops (LazyOps); a plain dict of ops is followed by _seen.
        self._snap_marks: dict[int, tuple[Any, ...]] | None = None
        #: A plain dict of ops as the last snapshot saw it (None: no snapshot yet, or the ops
        #: are a loaded state's): what the next segment compares with.
        self._seen: _SeenOps | None = None
        self._snap_input: Any = None
        self._whole_ops = 0
        self._chain_ops = 0
        #: The ops of a state loaded from the stored snapshot at ``last_snapshot`` (when the
        #: store said what chain it is): every record they hold unchanged is the stored one,
        #: so this driver's first snapshot extends that chain too, and each one compares only
        #: the records changed since the load (see :meth:`LazyOps.changed_positions`).
        self._loaded: LazyOps | None = None
        ops = state.ops
        if type(ops) is LazyOps and ops.stored_as is not None:
            eid, seq, (whole_ops, chain_ops) = ops.stored_as
            if eid == state.execution_id and seq == last_snapshot:
                self._loaded = ops
                self._snap_marks = {}
                self._snap_input = state.input
                self._whole_ops, self._chain_ops = whole_ops, chain_ops
        self.lock = _Turns()
        self.pending_ui: list[UIPatched] = []
        #: Records that may wait for the next append (a child's start: the child exists
        #: already, and a replay that finds no record attaches to it by id).
        self.pending_records: list[EventPayload] = []
        #: Blobs (sha256 -> bytes) to store with the next append, in its transaction when the
        #: store can (AppendsWithBlobs), else just before it: never after the event naming them.
        self.pending_blobs: dict[str, bytes] = {}
        self.done = asyncio.Event()
        self.error: BaseException | None = None
        self.task: asyncio.Task[None] | None = None
        #: Set by the runtime: makes a timer durable (before the wait that needs it is logged).
        self.schedule_timer: Callable[[Timer], Awaitable[None]] | None = None
        #: The runtime's interceptor chain around each step attempt (None: call the step).
        self.intercept: CallNext | None = None
        #: The runtime's resources, handed to each step through its StepInfo.
        self.resources: Mapping[str, Any] = {}
        #: The refusal that fenced this holder out: every later write and effect stops on it,
        #: even if the flow swallows the first one with a broad ``except``.
        self.fenced_out: StaleFenceError | None = None
        #: Why the runtime cancelled this driver's task ("cancelled" or "replaced"), if it did.
        self.stop_reason: str | None = None
        #: Set by a draining close past its deadline: stop after the next durable append.
        self.stop_at_boundary = False
        #: Set by a cancel in this process before it fences the holder out, so the refused
        #: write that follows is reported as the cancellation, not as a supersession.
        self.cancel_requested = False
        #: The runtime driving this execution (children are started through it).
        self.runtime: WorkflowRuntime | None = None
        #: A take-over folded into ``state`` but not written yet (a timer batch's wake).
        self.deferred: DeferredTakeOver | None = None
        #: That take-over was refused (or not known to be written): this driver never held it.
        self.lost_take_over = False
        is_mailbox, is_blob_store, appends_with_blobs, appends_now = _capabilities(store)
        #: Where early messages wait (None: the store keeps no mailbox).
        self.mailbox = cast("MailboxStore", store) if is_mailbox else None
        # Checked once: an agent stores blobs on nearly every write.
        self.blob_store = cast("BlobStore", store) if is_blob_store else None
        self._with_blobs = cast("AppendsWithBlobs", store) if appends_with_blobs else None
        self._store_now = cast("AppendsNow", store).append_now if appends_now else None

    def consumed_messages(self) -> set[str]:
        """The ids of every message (or keyed resume) a gate of this execution has taken."""
        return {
            str(op.output["message_id"])
            for op in self.state.ops.values()
            if op.kind == "gate" and isinstance(op.output, dict) and "message_id" in op.output
        }

    def build(self, events: Sequence[EventPayload]) -> list[Envelope]:
        now = self.clock.now()
        base = self.state.last_sequence + 1
        eid = self.state.execution_id
        fence, limits = self.fence, self.limits
        if len(events) == 1:
            return [Envelope.of(eid, base, events[0], fence=fence, recorded_at=now, limits=limits)]
        return [
            Envelope.of(eid, base + i, e, fence=fence, recorded_at=now, limits=limits)
            for i, e in enumerate(events)
        ]

    async def append(self, events: Sequence[EventPayload]) -> None:
        """Append ``events`` (after any buffered UI patches) in one atomic batch.

        Refused with :class:`ExecutionEndedError` once the execution is terminal. A write from
        one of the flow's own concurrent tasks (``asyncio.gather``) is finished even if that
        task is cancelled meanwhile, so the state here never lags what the store holds.
        """
        if self.task is None or asyncio.current_task() is self.task:
            await self._append(events)
            return
        await self.append_elsewhere(events)

    def append_now(self, event: EventPayload) -> Awaitable[None] | None:
        """:meth:`append` of one record from the driver's own task (a new step's), committed
        here and now when nothing else is under way and the store can commit it in this frame
        (:class:`~loom.storage.AppendsNow`): then None, with the state folded. Otherwise an
        awaitable that does the rest (the whole append, or the store's wait and the fold),
        which the caller awaits at once. The same checks, refusals and errors as ``append``.
        """
        store_now = self._store_now
        turns = self.lock
        if (
            store_now is None
            or turns.held
            or turns.waiting
            or self.fenced_out is not None
            or self.deferred is not None
            or self.pending_records
            or self.pending_ui
            or self.pending_blobs
            or self.stop_at_boundary
        ):
            return self._append([event])
        state = self.state
        if state.is_terminal:
            return self._append([event])  # which refuses it, word for word
        # Driver.build for one record, inline.
        env = Envelope.of(
            state.execution_id,
            state.last_sequence + 1,
            event,
            fence=self.fence,
            recorded_at=self.clock.now(),
            limits=self.limits,
        )
        try:
            done = store_now(env)
        except Exception as exc:
            self._write_failed(exc)
        if done is False:
            return self._append([event])  # nothing was done: the general path
        if done is not True:
            return self._append_under_way(env, done)
        apply_event(state, env)
        if state.last_sequence - self.last_snapshot >= self.snapshot_every:
            return self.try_snapshot()
        return None

    def _write_failed(self, exc: Exception) -> NoReturn:
        """Raise what a failed write of this driver's means: a refusal of its fence fences it
        out for good (every later write and effect stops on it), a Loom error goes as it is,
        anything else is a storage failure (the execution stays resumable)."""
        if isinstance(exc, StaleFenceError) and exc.execution_id == self.state.execution_id:
            self.fenced_out = exc
        if isinstance(exc, LoomError):
            raise exc
        raise _storage_failure(self.state.execution_id, exc) from exc

    async def _append_under_way(self, env: Envelope, write: Awaitable[None]) -> None:
        """The rest of :meth:`append_now` when the store's write had to wait: awaited with the
        append lock held (nothing of this driver ran since the write began), then folded."""
        turns = self.lock
        turns.held = True
        try:
            try:
                await write
            except Exception as exc:
                self._write_failed(exc)
            apply_event(self.state, env)
            if self.state.last_sequence - self.last_snapshot >= self.snapshot_every:
                await self.try_snapshot()
        finally:
            turns.give()
        if self.stop_at_boundary:
            raise StopAtBoundary

    async def append_elsewhere(self, events: Sequence[EventPayload]) -> None:
        """:meth:`append` from a task other than the driver's own (one of the flow's
        ``asyncio.gather`` children): finished even if that task is cancelled meanwhile."""
        write = asyncio.ensure_future(self._append(events))
        write.add_done_callback(_retrieve)
        await asyncio.shield(write)

    async def _append(self, events: Sequence[EventPayload]) -> None:
        turns = self.lock
        if turns.held or turns.waiting:
            await turns.take()
        else:
            turns.held = True
        try:
            if self.fenced_out is not None:
                raise self.fenced_out
            state = self.state
            if state.is_terminal:
                raise ExecutionEndedError(
                    f"execution {state.execution_id!r} is already {state.status}; "
                    "nothing can be appended after its terminal event",
                    execution_id=state.execution_id,
                    status=state.status.value,
                )
            if self.deferred is not None:
                envelopes = await self._append_deferred(self.deferred, events)
            elif self.pending_records or self.pending_ui or self.pending_blobs:
                envelopes = await self._append_pending(events)
            else:
                # Nothing buffered (a plain step): nothing to merge, nor to put back on failure.
                envelopes = self.build(events)
                try:
                    await self.store.append(envelopes)
                except Exception as exc:
                    self._write_failed(exc)
            for env in envelopes:
                apply_event(state, env)
            if state.last_sequence - self.last_snapshot >= self.snapshot_every:
                await self.try_snapshot()
        finally:
            turns.give()
        if self.stop_at_boundary:
            raise StopAtBoundary

    async def _append_deferred(
        self, deferred: DeferredTakeOver, events: Sequence[EventPayload]
    ) -> list[Envelope]:
        """The first append after a deferred take-over: written with it, in one write."""
        if deferred.aborted:
            raise LeavesReplay  # the run is stopping: it writes nothing more
        if self.pending_records or self.pending_ui or self.pending_blobs:
            await self.flush_deferred()
            return await self._append_pending(events)
        envelopes = self._build_random(events)
        await self._write_deferred(deferred, [*deferred.envelopes, *envelopes])
        return envelopes

    async def flush_deferred(self) -> None:
        """Write the deferred take-over alone (if there is one) before anything else runs."""
        deferred = self.deferred
        if deferred is not None:
            await self._write_deferred(deferred, deferred.envelopes)

    async def _write_deferred(self, deferred: DeferredTakeOver, envelopes: list[Envelope]) -> None:
        self.deferred = None  # written once, whatever comes of it
        try:
            await deferred.write(envelopes, deferred.from_fence)
        except BaseException as exc:
            # Refused (another holder moved first) or not known to be written: this holder
            # never became one, so it must not go on; every later write or effect stops here.
            eid = self.state.execution_id
            lost = StaleFenceError(
                f"execution {eid!r}: the take-over of its timer wake was not written ({exc!r})",
                execution_id=eid,
                fence=self.fence,
            )
            lost.__cause__ = exc
            self.fenced_out = lost
            self.lost_take_over = True
            if isinstance(exc, Exception):
                raise lost from exc
            raise

    async def _append_pending(self, events: Sequence[EventPayload]) -> list[Envelope]:
        """Write ``events`` after the buffered records, UI patches and blobs; on failure put
        back what was taken (and not written)."""
        pending: list[EventPayload] = [*self.pending_records, *self.pending_ui]
        self.pending_records, self.pending_ui = [], []
        blobs, self.pending_blobs = self.pending_blobs, {}
        try:
            envelopes = self.build([*pending, *events] if pending else events)
            try:
                await self._write(envelopes, blobs)
            except LoomError:
                raise
            except Exception as exc:
                raise _storage_failure(self.state.execution_id, exc) from exc
        except StaleFenceError as exc:
            if exc.execution_id == self.state.execution_id:
                self.fenced_out = exc
            raise
        except BaseException:
            # Not written: keep them.
            self.pending_records = [
                *(e for e in pending if not isinstance(e, UIPatched)),
                *self.pending_records,
            ]
            self.pending_ui = [
                *(e for e in pending if isinstance(e, UIPatched)),
                *self.pending_ui,
            ]
            self.pending_blobs = {**blobs, **self.pending_blobs}
            raise
        return envelopes

    def defer(self, event: EventPayload) -> None:
        """Record ``event`` with the next append instead of a commit of its own.

        Encoded now, so a value that cannot be stored fails here (PayloadError) rather than
        with the unrelated write that would carry it. Not durable, and not folded into the
        state, until that append: a crash before it loses the event (its step runs again).
        """
        if self.fenced_out is not None:
            raise self.fenced_out
        encode_json(event.to_wire(), limits=self.limits, what=f"{type(event).__name__} record")
        self.pending_records.append(event)

    async def _write(self, envelopes: list[Envelope], blobs: dict[str, bytes]) -> None:
        if not blobs:
            await self.store.append(envelopes)
            return
        if self._with_blobs is not None:
            await self._with_blobs.append_with_blobs(envelopes, blobs)
            return
        if self.blob_store is None:
            raise ConfigurationError(
                f"execution {self.state.execution_id!r} stores blobs, but "
                f"{type(self.store).__name__} keeps none",
                execution_id=self.state.execution_id,
            )
        await self.blob_store.put_blobs(blobs)
        await self.store.append(envelopes)

    async def take_over(self, events: Sequence[EventPayload], *, from_fence: int) -> None:
        """Become the holder: advance the fence from ``from_fence`` and append ``events`` in
        one atomic write, or change nothing (StaleFenceError / DuplicateSequenceError /
        ExecutionAlreadyExistsError) when another holder moved first."""
        async with self.lock:
            self.fence = from_fence + 1
            # Every racer builds fence from_fence + 1 at the same sequence, so their derived
            # ids would match: random ones keep their records distinct, and a lost COMMIT's
            # check (PostgreSQL: is MY record there?) never takes the winner's for its own.
            envelopes = [
                dataclasses.replace(e, envelope_id=new_envelope_id()) for e in self.build(events)
            ]
            await _store_call(
                self.store.take_over(envelopes, from_fence=from_fence), self.state.execution_id
            )
            self._applied(envelopes)

    def take_over_envelopes(
        self, events: Sequence[EventPayload], *, from_fence: int
    ) -> list[Envelope]:
        """What :meth:`take_over` writes, for a caller that writes it with others' take-overs
        (``TakesOverMany``) and then calls :meth:`taken_over`. Not yet the holder: the fence
        changes here, and nothing else until then."""
        self.fence = from_fence + 1
        return self._build_random(events)

    def _build_random(self, events: Sequence[EventPayload]) -> list[Envelope]:
        """:meth:`build` with random envelope ids, as every take-over's (see take_over)."""
        now = self.clock.now()
        base = self.state.last_sequence + 1
        eid = self.state.execution_id
        fence, limits = self.fence, self.limits
        return [
            Envelope.of(
                eid,
                base + i,
                e,
                fence=fence,
                recorded_at=now,
                envelope_id=new_envelope_id(),
                limits=limits,
            )
            for i, e in enumerate(events)
        ]

    def taken_over(self, envelopes: list[Envelope]) -> None:
        """The take-over built by :meth:`take_over_envelopes` is durable: fold it in."""
        self._applied(envelopes)

    def _applied(self, envelopes: list[Envelope]) -> None:
        for env in envelopes:
            apply_event(self.state, env)

    async def snapshot_on_suspend(self) -> None:
        """Snapshot a suspending execution unless its log since the last snapshot is short.

        A wake folds the events after the snapshot it loads; a few of them fold for less than
        a snapshot costs to write, read back, decode and validate (most suspended executions
        are short: a start, a timer and the suspension)."""
        if self.state.last_sequence - self.last_snapshot >= SUSPEND_SNAPSHOT_MIN_EVENTS:
            await self.try_snapshot()

    async def try_snapshot(self) -> None:
        """Snapshot now. A failed snapshot costs only speed (loading reads a longer tail), so
        it is logged, not raised: the events it would summarise are already durable."""
        try:
            await self.snapshot()
        except StorageError as exc:
            log.warning("snapshot of %s failed: %r", self.state.execution_id, exc)

    async def snapshot(self) -> None:
        """Write what changed since this driver's last snapshot as a segment on top of it, or
        the whole state when there is no such chain to extend (this driver wrote none yet, the
        store keeps whole snapshots only, an op vanished, or the store refused the segment).

        The chain is compacted into one whole snapshot once the op records it holds outnumber
        the whole one's: whole writes then come at (about) doubling sizes, so the bytes every
        snapshot of a log writes stay linear in the log, and a load reads at most about twice
        the state.
        """
        state = self.state
        seq = state.last_sequence
        if seq <= self.last_snapshot or self.deferred is not None:
            return  # (never a snapshot beyond what is written)
        ops = state.ops
        if type(ops) is dict:
            await self._snapshot_dict(state, seq, ops)
            return
        prev = self._snap_marks
        loaded = self._loaded
        since_load = None if loaded is None or ops is not loaded else loaded.changed_positions()
        if since_load is not None and prev is not None and all(map(ops.__contains__, prev)):
            # Marks of the records that differ from the loaded chain, and of those that did
            # at the last snapshot (changed back since): every other one is as stored.
            marks = {pos: _mark(ops[pos]) for pos in (*since_load, *prev)}
        else:
            if loaded is not None:
                # An op vanished, or the state was replaced: the loaded chain is no baseline
                # any more (the marks so far cover only what changed since it): whole.
                self._loaded = None
                prev = None
            marks = {pos: _mark(op) for pos, op in ops.items()}
        store = self.store
        if prev is not None and isinstance(store, SnapshotSegments) and prev.keys() <= marks.keys():
            changed = [pos for pos, m in marks.items() if prev.get(pos) != m]
            if self._chain_ops + len(changed) <= max(self._whole_ops, self.snapshot_every):
                segment = self._segment(state, seq, changed)
                if await store.save_snapshot_segment(segment, self.last_snapshot):
                    self._chain_ops += len(changed) + 1
                    self._snap_marks = marks
                    self.last_snapshot = seq
                    return
        whole = Snapshot(state.execution_id, seq, state.to_stored())
        if self._loaded is not None:  # the marks cover only the changed records: all now
            # (taken before the write: a sibling task may fold a record while it is awaited)
            marks = {pos: _mark(op) for pos, op in ops.items()}
        await store.save_snapshot(whole)
        self._loaded = None
        self._snap_marks = marks
        self._snap_input = state.input
        self._whole_ops = len(marks)
        self._chain_ops = 0
        self.last_snapshot = seq

    def _segment(self, state: ExecutionState, seq: int, changed: list[int]) -> Snapshot:
        """A segment at ``seq`` holding the op records at ``changed``."""
        part = state.to_stored(only_ops=changed)
        if state.input is self._snap_input:  # set once at the start: never repeated
            del part["input"]
        return Snapshot(state.execution_id, seq, part)

    async def _snapshot_dict(
        self, state: ExecutionState, seq: int, ops: dict[int, OpRecord]
    ) -> None:
        """:meth:`snapshot` of a state whose ops are a plain dict (a flow run from its start,
        the common case): the segment's ops are found without a pass of Python over them all
        (see :class:`_SeenOps`), so a snapshot of a long log costs what changed, not its
        length."""
        if self._loaded is not None:  # the state was replaced: the loaded chain is no base
            self._loaded = None
            self._seen = None
        store = self.store
        seen = self._seen
        if seen is not None and isinstance(store, SnapshotSegments):
            changed = seen.changed(ops)
            if changed is not None and self._chain_ops + len(changed) <= max(
                self._whole_ops, self.snapshot_every
            ):
                segment = self._segment(state, seq, changed)
                # The baseline is what this segment holds, taken before the write: a sibling
                # task (``asyncio.gather``) may fold a record while it is awaited, and that one
                # is for the next segment to carry.
                after = seen.advanced(ops, changed)
                if await store.save_snapshot_segment(segment, self.last_snapshot):
                    self._chain_ops += len(changed) + 1
                    self._seen = after
                    self.last_snapshot = seq
                    return
        whole = Snapshot(state.execution_id, seq, state.to_stored())
        after, count = _SeenOps(ops), len(ops)  # before the write, as above
        await store.save_snapshot(whole)
        self._seen = after
        self._snap_input = state.input
        self._whole_ops = count
        self._chain_ops = 0
        self.last_snapshot = seq


_COMPLETED = OpStatus.COMPLETED


class _SeenOps:
    """A plain dict of ops as the last snapshot saw it: its positions and record objects in
    order, and the marks of the records that were not completed then.

    The next segment carries the positions added since (a dict keeps new keys at its end),
    the records replaced since (found by identity, in C: ``map(is_not, ...)``), and the open
    records that changed in place. A completed record is never changed in place: every
    reducer replaces it (Loom's own do; :func:`loom.register_event` asks the same of an
    extension's), so it needs no mark. A position gone, or moved, leaves no baseline (None:
    the snapshot is whole)."""

    __slots__ = ("keys", "objs", "open")

    def __init__(self, ops: dict[int, OpRecord]) -> None:
        self.keys = list(ops)
        self.objs = list(ops.values())
        self.open = {p: _mark(op) for p, op in ops.items() if op.status is not _COMPLETED}

    def changed(self, ops: dict[int, OpRecord]) -> list[int] | None:
        """The positions a segment on top of the last snapshot must carry, or None."""
        n = len(self.keys)
        keys = list(ops)
        if keys[:n] != self.keys:
            return None
        replaced = itertools.compress(keys, map(operator.is_not, ops.values(), self.objs))
        changed = list(replaced)
        carried = set(changed)
        for pos, mark in self.open.items():
            if pos not in carried and _mark(ops[pos]) != mark:
                changed.append(pos)
        changed += keys[n:]
        return changed

    def advanced(self, ops: dict[int, OpRecord], changed: list[int]) -> _SeenOps:
        """The baseline once ``ops`` is written as a segment carrying ``changed``."""
        after = _SeenOps.__new__(_SeenOps)
        after.keys = list(ops)
        after.objs = list(ops.values())
        still_open = {*self.open, *changed}
        after.open = {p: _mark(op) for p in still_open if (op := ops[p]).status is not _COMPLETED}
        return after


class _Turns:
    """The driver's append lock: asyncio.Lock's first-come order, with an uncontended take that
    is two attribute checks in the caller (asyncio.Lock's costs three coroutines per append)."""

    __slots__ = ("held", "waiting")

    def __init__(self) -> None:
        self.held = False
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    async def take(self) -> None:
        if not self.held and not self.waiting:
            self.held = True
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(turn)
        try:
            await turn  # give() hands the lock over: ``held`` stays set
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.give()  # handed over, then cancelled before running: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self.waiting.remove(turn)
            raise

    def give(self) -> None:
        waiting = self.waiting
        while waiting:
            turn = waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.held = False

    async def __aenter__(self) -> None:
        await self.take()

    async def __aexit__(self, *exc: object) -> None:
        self.give()


def _mark(op: OpRecord) -> tuple[Any, ...]:
    return (op.kind, op.name, op.status, op.attempts, op.output, op.error, op.annotations)
