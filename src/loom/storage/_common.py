"""Rules every store applies identically (kept out of the SQL so each dialect stays local)."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from loom.errors import (
    CorruptEventError,
    DuplicateEnvelopeIdError,
    DuplicateSequenceError,
    ExecutionAlreadyExistsError,
    ExecutionEndedError,
    LoomError,
    PayloadError,
    StaleFenceError,
    StartFencedOutError,
    StorageWriteError,
)
from loom.model import (
    DEFAULT_LIMITS,
    Envelope,
    EventType,
    ExecutionState,
    PayloadLimits,
    checksum,
    decode_json,
)
from loom.model._events import as_event_type, has_derived_form
from loom.model._state import LazyOps, merge_stored_ops, state_from_stored
from loom.model._summary import SUMMARY_EVENT_TYPES
from loom.storage._spi import Snapshot, Timer

__all__ = [
    "SNAPSHOT_LIMITS",
    "TERMINAL_TYPES",
    "Waiters",
    "already_exists",
    "batch_head",
    "check_explicit_id",
    "check_reserved",
    "check_snapshot",
    "check_take_over",
    "check_timer",
    "decode_envelope",
    "decode_snapshot",
    "ended",
    "merge_segments",
    "plain_record",
    "refusal_for",
    "reserved_ids",
    "segment_checksum",
    "snapshot_checksum",
    "take_over_refusal",
    "validate_snapshot",
]

#: Sequences and fences are 64-bit signed integers in every store.
MAX_SEQUENCE = 2**63 - 1


#: Snapshots hold a whole folded state, so they get a far larger allowance than one event.
#: Their depth is bounded by the events folded into them (each checked on the way in), so the
#: depth limit here only guards the decoder.
SNAPSHOT_LIMITS = PayloadLimits(max_bytes=1 << 30, max_depth=900)


def batch_head(envelopes: Sequence[Envelope]) -> tuple[str, int, int]:
    """Validate the shape of an append batch; return (execution_id, first_sequence, fence)."""
    if not envelopes:
        raise ValueError("append() needs at least one envelope")
    first = envelopes[0]
    for offset, env in enumerate(envelopes):
        if env.execution_id != first.execution_id:
            raise ValueError("one append batch must hold one execution's envelopes")
        if env.sequence != first.sequence + offset:
            raise ValueError("an append batch's sequences must be dense and ascending")
        if env.fence != first.fence:
            raise ValueError("an append batch must carry one fence")
        if not env.payload_json:
            raise ValueError("envelopes must be built with Envelope.create (payload not encoded)")
        if not math.isfinite(env.recorded_at):
            raise _not_finite(
                f"envelope {env.envelope_id!r} at sequence {env.sequence} has recorded_at "
                f"{env.recorded_at!r}",
                env.execution_id,
            )
        if env.envelope_id != f"{env.execution_id}#{env.sequence}.{env.fence}":
            check_explicit_id(env)
    if first.sequence < 0:
        raise ValueError("sequences start at 0")
    if first.fence < 1:
        raise ValueError("envelopes must carry a fence from acquire_fence() (fences start at 1)")
    return first.execution_id, first.sequence, first.fence


def plain_record(env: Envelope) -> bool:
    """Whether ``env`` may skip :func:`batch_head` on a store's lone-record fast path.

    True only for a record ``batch_head([env])`` accepts (the two are kept in step by a test
    over every shape either refuses) that moves no summary and carries its derived id, after
    sequence 0: a step's record. A fast path that made this judgement itself would silently
    miss the next check added to ``batch_head`` (one such path once stored NaN as NULL).
    """
    execution_id, sequence, fence = env.execution_id, env.sequence, env.fence
    return (
        sequence >= 1
        and fence >= 1
        and env.type not in SUMMARY_EVENT_TYPES
        and bool(env.payload_json)
        and (env.id_derived or env.envelope_id == f"{execution_id}#{sequence}.{fence}")
        and math.isfinite(env.recorded_at)
    )


def _not_finite(what: str, execution_id: str) -> PayloadError:
    # NaN and the infinities have no JSON form and no order a timer or a feed can use (SQLite
    # stores NaN as NULL, which its NOT NULL column then refuses under another name).
    return PayloadError(
        f"{what}: a stored time must be a finite number of epoch seconds; nothing was written",
        execution_id=execution_id,
        hint="Pass a finite time (time.time(), a clock's now())",
    )


def check_timer(timer: Timer) -> None:
    """Refuse a timer that could never fire (or would fire at once, forever) before storing it."""
    if not math.isfinite(timer.fire_at):
        raise _not_finite(
            f"the timer at position {timer.position} fires at {timer.fire_at!r}",
            timer.execution_id,
        )


def check_explicit_id(env: Envelope) -> None:
    """Refuse an explicit envelope id that stores cannot keep unique cheaply.

    Stores index only explicit ids; a derived id (``derived_envelope_id``) is unique through
    the log's (execution, sequence) key and is stored empty. So an explicit id must never have
    the derived form (it could name a record not yet written, whose own id would then collide
    unseen): it is refused whatever the store's state, before anything is written, as the
    duplicate it would be. An empty id is malformed (it is how a derived id is stored)."""
    if not isinstance(env.envelope_id, str) or not env.envelope_id:
        raise ValueError("an envelope id must be a non-empty string")
    if has_derived_form(env.envelope_id):
        raise DuplicateEnvelopeIdError(
            f"envelope id {env.envelope_id!r} has the derived form (execution#sequence.fence) "
            "of another record's id; only that record may carry it",
            execution_id=env.execution_id,
            hint="Leave envelope_id unset to get the record's own derived id",
        )


#: The meta key under which schema rung 10 kept the ids it found reserved (see reserved_ids).
RESERVED_KEY = "reserved_envelope_ids"


def reserved_ids(rows: Iterable[tuple[str, str, int, int]]) -> list[str]:
    """Of stored (envelope_id, execution_id, sequence, fence) rows, the explicit ids that have
    the derived form of ANOTHER record's id. Only a log written before schema rung 10 can hold
    one (since then such an id is refused on the way in), so rung 10 lists them once and the
    list never changes; a derived id on it is a duplicate the uniqueness index cannot see."""
    return sorted(
        i
        for i, e, s, f in rows
        if isinstance(i, str) and has_derived_form(i) and i != f"{e}#{s}.{f}"
    )


def check_reserved(envelopes: Sequence[Envelope], reserved: frozenset[str]) -> None:
    """Refuse a derived id that a record written before schema rung 10 already carries."""
    for env in envelopes:
        if env.envelope_id in reserved:
            raise DuplicateEnvelopeIdError(
                f"envelope id {env.envelope_id!r} is already stored",
                execution_id=env.execution_id,
            )


def check_take_over(envelopes: Sequence[Envelope], from_fence: int) -> tuple[str, int]:
    """Validate a take_over batch; return (execution_id, first_sequence)."""
    execution_id, first, fence = batch_head(envelopes)
    if from_fence < 0 or fence != from_fence + 1:
        raise ValueError("take_over() envelopes must carry fence from_fence + 1")
    return execution_id, first


def check_take_overs(requests: Sequence[tuple[Sequence[Envelope], int]]) -> list[tuple[str, int]]:
    """Validate a take_over_many call; return (execution_id, first_sequence) per request."""
    heads = [check_take_over(envelopes, from_fence) for envelopes, from_fence in requests]
    if any(from_fence < 1 for _, from_fence in requests):
        raise ValueError("take_over_many() takes over existing executions only (from_fence >= 1)")
    if len({eid for eid, _ in heads}) != len(heads):
        raise ValueError("take_over_many() requests must name distinct executions")
    return heads


async def take_over_each(
    take_over: Callable[..., Awaitable[None]],
    requests: Sequence[tuple[Sequence[Envelope], int]],
) -> list[LoomError | None]:
    """take_over_many for a store without a batched write: each request its own take-over
    (atomic alone), its refusal reported in its place instead of ending the batch."""
    outcomes: list[LoomError | None] = []
    for envelopes, from_fence in requests:
        try:
            await take_over(envelopes, from_fence=from_fence)
        except LoomError as refusal:
            outcomes.append(refusal)
        else:
            outcomes.append(None)
    return outcomes


def take_over_refusal(
    execution_id: str, first: int, from_fence: int, current_fence: int, next_sequence: int
) -> LoomError | None:
    """The refusal (if any) for taking over from ``from_fence`` at ``first``."""
    if first == 0 and next_sequence > 0:
        return already_exists(execution_id)
    if current_fence != from_fence:
        return StaleFenceError(
            f"execution {execution_id!r} was taken over meanwhile: its fence is "
            f"{current_fence}, not {from_fence}",
            execution_id=execution_id,
            fence=from_fence,
            current_fence=current_fence,
        )
    if first != next_sequence:
        return DuplicateSequenceError(
            f"execution {execution_id!r} moved on meanwhile: take-over at sequence {first}, "
            f"but the next sequence is {next_sequence}",
            execution_id=execution_id,
            expected=next_sequence,
            got=first,
        )
    return None


#: The event types that end a log: a store refuses any append after one of them.
TERMINAL_TYPES: frozenset[str] = frozenset(
    t.value
    for t in (
        EventType.EXECUTION_COMPLETED,
        EventType.EXECUTION_FAILED,
        EventType.EXECUTION_CANCELLED,
    )
)
#: The same, as the SQL list the stores' fence-guarded head updates test against.
TERMINAL_SQL = ", ".join(f"'{t}'" for t in sorted(TERMINAL_TYPES))


def ended(execution_id: str, last_type: str) -> ExecutionEndedError:
    return ExecutionEndedError(
        f"execution {execution_id!r} already ended ({last_type}); nothing can be appended "
        "after its terminal event",
        execution_id=execution_id,
        terminal_event=last_type,
    )


def already_exists(execution_id: str) -> ExecutionAlreadyExistsError:
    return ExecutionAlreadyExistsError(
        f"execution {execution_id!r} already exists", execution_id=execution_id
    )


def refusal_for(
    execution_id: str, first: int, fence: int, current_fence: int, next_sequence: int
) -> LoomError | None:
    """The refusal (if any) for appending at ``first`` with ``fence`` onto a head.

    The order matters: a start that finds sequence 0 present lost the race cleanly, whatever its
    fence; a start fenced out with nothing written is retryable; everything else checks the
    fence before the sequence so that a zombie learns it was superseded.
    """
    if first == 0 and next_sequence > 0:
        return already_exists(execution_id)
    if fence != current_fence:
        if first == 0:
            cause = StartFencedOutError(
                f"start of {execution_id!r} fenced out: fence {fence} is not the current "
                f"fence {current_fence}, and sequence 0 has not been written",
                execution_id=execution_id,
                fence=fence,
                current_fence=current_fence,
            )
            err = StorageWriteError(
                f"start of {execution_id!r} was fenced out before sequence 0 existed",
                execution_id=execution_id,
                hint="Retry the start: nothing ran",
            )
            err.__cause__ = cause
            return err
        why = "was never issued" if fence > current_fence else "is stale"
        return StaleFenceError(
            f"fence {fence} {why} for execution {execution_id!r} (current fence "
            f"{current_fence}); another holder owns it",
            execution_id=execution_id,
            fence=fence,
            current_fence=current_fence,
        )
    if first != next_sequence:
        return DuplicateSequenceError(
            f"append to {execution_id!r} at sequence {first}, but the next sequence is "
            f"{next_sequence}",
            execution_id=execution_id,
            expected=next_sequence,
            got=first,
        )
    return None


def decode_envelope(
    execution_id: str,
    envelope_id: str,
    sequence: int,
    type_name: str,
    payload_json: str,
    recorded_at: float,
    fence: int,
    stored_checksum: str,
    limits: PayloadLimits = DEFAULT_LIMITS,
) -> Envelope:
    """Rebuild a stored envelope, verifying its checksum first.

    The store does not judge the event's type: one this process cannot fold (written by a newer
    Loom or an extension not imported here) is read like any other, and the fold refuses it
    with ``UnknownEventError``. Only a failed checksum or undecodable payload is corruption.
    """
    if not (
        isinstance(envelope_id, str)
        and isinstance(type_name, str)
        and isinstance(payload_json, str)
        and isinstance(stored_checksum, str)
        and isinstance(recorded_at, (int, float))
        and isinstance(fence, int)
    ):
        # A value of the wrong storage class (a BLOB where text belongs): altered outside Loom.
        raise CorruptEventError(
            f"event {sequence} of execution {execution_id!r} has a column of the wrong type",
            execution_id=execution_id,
            sequence=sequence,
        )
    if not envelope_id:  # stored empty: the record's derived id, which the checksum covers
        envelope_id = f"{execution_id}#{sequence}.{fence}"
    env = Envelope(
        envelope_id,
        execution_id,
        sequence,
        as_event_type(type_name),
        {},
        recorded_at,
        fence,
        payload_json,
    )
    if env.checksum() != stored_checksum:
        raise CorruptEventError(
            f"event {sequence} of execution {execution_id!r} failed its checksum",
            execution_id=execution_id,
            sequence=sequence,
        )
    try:
        payload = decode_json(payload_json, limits=limits)
    except PayloadError as exc:
        raise CorruptEventError(
            f"event {sequence} of {execution_id!r} is not decodable: {exc.message}",
            execution_id=execution_id,
            sequence=sequence,
        ) from exc
    if not isinstance(payload, dict):
        raise CorruptEventError(
            f"event {sequence} of {execution_id!r} has a non-object payload",
            execution_id=execution_id,
            sequence=sequence,
        )
    object.__setattr__(env, "payload", payload)
    return env


def snapshot_checksum(execution_id: str, sequence: int, state_json: str) -> str:
    return checksum("snapshot", execution_id, str(sequence), state_json)


def decode_snapshot(
    execution_id: str, sequence: int, state_json: str, stored_checksum: str
) -> Snapshot:
    if not (
        isinstance(sequence, int)
        and isinstance(state_json, str)
        and isinstance(stored_checksum, str)
    ):
        raise CorruptEventError(
            f"the snapshot of {execution_id!r} has a column of the wrong type",
            execution_id=execution_id,
        )
    if snapshot_checksum(execution_id, sequence, state_json) != stored_checksum:
        raise CorruptEventError(
            f"the snapshot of {execution_id!r} at sequence {sequence} failed its checksum",
            execution_id=execution_id,
            sequence=sequence,
        )
    try:
        state = decode_json(state_json, limits=SNAPSHOT_LIMITS)
    except PayloadError as exc:
        raise CorruptEventError(
            f"the snapshot of {execution_id!r} is not decodable", execution_id=execution_id
        ) from exc
    ops = state.get("ops") if isinstance(state, dict) else None
    return Snapshot(execution_id, sequence, state, (_op_count(ops), 0))


def segment_checksum(execution_id: str, sequence: int, base: int, state_json: str) -> str:
    return checksum("snapshot-segment", execution_id, str(sequence), str(base), state_json)


def merge_segments(whole: Snapshot, segments: Iterable[tuple[int, int, str, str]]) -> Snapshot:
    """``whole`` with the stored segments ``(sequence, base, state_json, checksum)`` laid on
    top, in sequence order, as far as they link (each one's base is the sequence before it).

    A segment that does not link (left by a chain a full snapshot replaced) ends the chain:
    what is merged so far is still a true snapshot at its own sequence. A segment failing its
    checksum or malformed raises CorruptEventError, so the caller folds the log instead.
    """
    eid = whole.execution_id
    state = whole.state
    sequence = whole.sequence
    pieces: list[Any] = []
    carried = 0
    for seg_seq, base, state_json, stored in segments:
        if not isinstance(seg_seq, int) or seg_seq <= sequence:
            continue
        if base != sequence:
            break
        if not (isinstance(state_json, str) and isinstance(stored, str)) or (
            segment_checksum(eid, seg_seq, base, state_json) != stored
        ):
            raise CorruptEventError(
                f"the snapshot segment of {eid!r} at sequence {seg_seq} failed its checksum",
                execution_id=eid,
                sequence=seg_seq,
            )
        try:
            part = decode_json(state_json, limits=SNAPSHOT_LIMITS)
        except PayloadError as exc:
            raise CorruptEventError(
                f"the snapshot segment of {eid!r} at sequence {seg_seq} is not decodable",
                execution_id=eid,
            ) from exc
        ops = part.get("ops", {}) if isinstance(part, dict) else None
        if not isinstance(ops, dict | list) or not isinstance(state.get("ops"), dict | list):
            raise CorruptEventError(
                f"the snapshot segment of {eid!r} at sequence {seg_seq} is malformed",
                execution_id=eid,
                sequence=seg_seq,
            )
        if not pieces:  # the whole row's dict may be a cached decode: never change it
            state = dict(state)
            pieces.append(state["ops"])
        state.update(part)
        if ops != {}:  # none changed (or an old segment without the key): nothing to merge
            pieces.append(ops)
        carried += _op_count(ops) + 1
        sequence = seg_seq
    if pieces:
        # All ops at once: merging a compact chain piece by piece would re-copy the growing
        # columns at every segment.
        try:
            state["ops"] = merge_stored_ops(pieces)
        except ValueError as exc:
            raise CorruptEventError(
                f"the snapshot chain of {eid!r} up to sequence {sequence} is malformed: {exc}",
                execution_id=eid,
                sequence=sequence,
            ) from exc
    chain = (_op_count(whole.state.get("ops")) if isinstance(whole.state, dict) else 0, carried)
    return Snapshot(eid, sequence, state, chain)


def _op_count(ops: Any) -> int:
    """How many op records stored ``ops`` hold (0 for a malformed piece: it is refused where
    the state is read)."""
    if type(ops) is dict:
        return len(ops)
    if type(ops) is list and len(ops) == 6 and type(ops[4]) is list:
        return len(ops[4])
    return 0


def check_snapshot(snapshot: Snapshot) -> None:
    """Refuse (PayloadError, nothing written) a snapshot no store can key: every store calls
    this in ``save_snapshot`` before writing, so a bad one never reaches the database."""
    eid, seq = snapshot.execution_id, snapshot.sequence
    if not isinstance(eid, str) or not eid:
        raise PayloadError(f"a snapshot needs an execution id, not {eid!r}")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_SEQUENCE:
        raise PayloadError(
            f"the snapshot of {eid!r} has sequence {seq!r}, not an integer in 0..2**63-1",
            execution_id=eid,
        )
    if not isinstance(snapshot.state, dict):
        raise PayloadError(f"the snapshot of {eid!r} is not an object", execution_id=eid)


def validate_snapshot(
    snapshot: Snapshot, execution_id: str, *, last_sequence: int | None = None
) -> ExecutionState:
    """The state a loaded snapshot describes, or CorruptEventError saying why it cannot be used.

    A snapshot is a cache of the fold, so it is trusted only as far as it checks out: it must
    be a well-formed state, of ``execution_id`` (a snapshot stored under one id must never
    serve another's state), at exactly the sequence it was stored under, and within the log
    (``last_sequence``, the log's last sequence, when the caller knows it). The caller then
    ignores it and folds from the log. Keep this on every path that loads a snapshot.
    """

    def bad(why: str) -> CorruptEventError:
        return CorruptEventError(
            f"the snapshot of {execution_id!r} at sequence {snapshot.sequence!r} is unusable: "
            f"{why}",
            execution_id=execution_id,
            hint="It is ignored and the state folded from the log; nothing was lost",
        )

    if snapshot.execution_id != execution_id:
        raise bad(f"it was stored for {snapshot.execution_id!r}")
    d = snapshot.state
    if not isinstance(d, dict):
        raise bad("it is not an object")
    if d.get("execution_id") != execution_id:
        raise bad(f"it describes execution {d.get('execution_id')!r}")
    seq = d.get("last_sequence")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq != snapshot.sequence:
        raise bad(f"it describes sequence {seq!r}")
    if not 0 <= seq <= MAX_SEQUENCE or (last_sequence is not None and seq > last_sequence):
        raise bad(f"sequence {seq} is beyond the log (which ends at {last_sequence})")
    try:
        # One pass, checking each field as it builds the state: the snapshot must be exactly
        # what ExecutionState.to_dict writes (anything else was written by someone else).
        state = state_from_stored(d)
    except ValueError as exc:
        raise bad(str(exc)) from exc
    if type(state.ops) is LazyOps and snapshot.chain is not None:
        state.ops.stored_as = (execution_id, snapshot.sequence, snapshot.chain)
    return state


class Waiters:
    """Wakes ``wait_for_append`` callers on any thread's event loop when an execution grows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_execution: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    def register(self, execution_id: str) -> asyncio.Event:
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            self._by_execution.setdefault(execution_id, []).append(entry)
        return event

    def unregister(self, execution_id: str, event: asyncio.Event) -> None:
        with self._lock:
            entries = self._by_execution.get(execution_id)
            if entries:
                entries[:] = [e for e in entries if e[1] is not event]
                if not entries:
                    del self._by_execution[execution_id]

    def notify_all(self) -> None:
        """Wake every waiter (something changed that may concern any of them)."""
        with self._lock:
            keys = list(self._by_execution)
        self.notify(keys)

    def notify(self, execution_ids: Sequence[str]) -> None:
        if not self._by_execution:
            return
        with self._lock:
            targets = [e for eid in execution_ids for e in self._by_execution.get(eid, ())]
        for loop, event in targets:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed; its waiter is gone
                pass

    async def wait(
        self,
        execution_id: str,
        after_sequence: int,
        timeout: float | None,
        read_last: Callable[[str], Awaitable[int]],
        poll_interval: float | None,
    ) -> int:
        """Shared loop: register first (no lost wake-up), then check, then sleep on the event."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            event = self.register(execution_id)
            try:
                last = await read_last(execution_id)
                if last > after_sequence:
                    return last
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return last
                wait_for = remaining
                if poll_interval is not None:
                    wait_for = poll_interval if wait_for is None else min(wait_for, poll_interval)
                try:
                    # Not asyncio.wait_for: on 3.11 it swallows a cancel landing as the
                    # event is set, and the waiter's caller could never stop it.
                    async with asyncio.timeout(wait_for):
                        await event.wait()
                except TimeoutError:
                    pass
            finally:
                self.unregister(execution_id, event)
