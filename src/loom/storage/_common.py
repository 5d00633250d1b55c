"""Rules every store applies identically (kept out of the SQL so each dialect stays local)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence

from loom.errors import (
    CorruptEventError,
    DuplicateSequenceError,
    ExecutionAlreadyExistsError,
    LoomError,
    PayloadError,
    StaleFenceError,
    StartFencedOutError,
    StorageWriteError,
)
from loom.model import DEFAULT_LIMITS, Envelope, PayloadLimits, checksum, decode_json
from loom.model._events import as_event_type
from loom.storage._spi import Snapshot

__all__ = [
    "SNAPSHOT_LIMITS",
    "Waiters",
    "already_exists",
    "batch_head",
    "check_take_over",
    "decode_envelope",
    "decode_snapshot",
    "refusal_for",
    "snapshot_checksum",
    "take_over_refusal",
]


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
    if first.sequence < 0:
        raise ValueError("sequences start at 0")
    if first.fence < 1:
        raise ValueError("envelopes must carry a fence from acquire_fence() (fences start at 1)")
    return first.execution_id, first.sequence, first.fence


def check_take_over(envelopes: Sequence[Envelope], from_fence: int) -> tuple[str, int]:
    """Validate a take_over batch; return (execution_id, first_sequence)."""
    execution_id, first, fence = batch_head(envelopes)
    if from_fence < 0 or fence != from_fence + 1:
        raise ValueError("take_over() envelopes must carry fence from_fence + 1")
    return execution_id, first


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
    return Snapshot(execution_id, sequence, state)


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
                    await asyncio.wait_for(event.wait(), wait_for)
                except TimeoutError:
                    pass
            finally:
                self.unregister(execution_id, event)
