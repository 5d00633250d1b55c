"""InMemoryStore: the reference store. Nothing is durable; use it to test flows."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from loom import faults
from loom._aio import LoopShare
from loom.errors import (
    DuplicateEnvelopeIdError,
    LoomError,
    RefNotFoundError,
    StorageWriteError,
)
from loom.model import (
    Envelope,
    ExecutionSummary,
    SummaryChange,
    decode_json,
    encode_json,
    summary_change,
)
from loom.storage._blobs import check_blobs, check_hashes
from loom.storage._branches import (
    BranchRef,
    check_move,
    check_new_ref,
    check_ref_name,
    check_tip,
    lineage,
    promoted,
    put_conflict,
)
from loom.storage._common import (
    SNAPSHOT_LIMITS,
    TERMINAL_TYPES,
    Waiters,
    batch_head,
    check_snapshot,
    check_take_over,
    check_take_overs,
    check_timer,
    ended,
    merge_segments,
    refusal_for,
    segment_checksum,
    take_over_each,
    take_over_refusal,
)
from loom.storage._index import FEED_KEY, encode_page_cursor, matches
from loom.storage._spi import (
    ExecutionPage,
    ExecutionQuery,
    Message,
    Snapshot,
    TakeOver,
    Timer,
)

__all__ = ["InMemoryStore"]


@dataclass
class _Head:
    fence: int = 0
    events: list[Envelope] = field(default_factory=list)


def _loaded(stored: tuple[Message, str, bool]) -> Message:
    """A fresh copy of a stored message (nothing aliases the stored payload)."""
    m = stored[0]
    return Message(m.execution_id, m.message_id, m.event_type, decode_json(stored[1]), m.sent_at)


class InMemoryStore:
    """Event, snapshot and fence storage in process memory (thread-safe, any event loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heads: dict[str, _Head] = {}
        self._envelope_ids: set[str] = set()
        self._snapshots: dict[str, tuple[int, str]] = {}
        #: Segments on top of the whole snapshot: (sequence, base, state JSON, checksum).
        self._segments: dict[str, list[tuple[int, int, str, str]]] = {}
        #: execution id -> (holder, fence, expires_at)
        self._leases: dict[str, tuple[str, int, float]] = {}
        self._waiters = Waiters()
        self._closed = False
        self._timers: dict[tuple[str, int], tuple[Timer, str | None, float]] = {}
        self._summaries: dict[str, ExecutionSummary] = {}
        self._cursor = 0
        self._blobs: dict[tuple[str, str], bytes] = {}
        # Per execution, in arrival order: message id -> (message with JSON text, consumed).
        self._mailbox: dict[str, dict[str, tuple[Message, str, bool]]] = {}
        self._refs: dict[str, BranchRef] = {}
        self._loop_share = LoopShare()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageWriteError("the store is closed")

    async def append(self, envelopes: Sequence[Envelope]) -> None:
        batch_head(envelopes)  # refused before the turn, as before
        if self._loop_share.due():  # it awaits nothing else: see LoopShare
            await self._loop_share.turn()
        self._append_here(envelopes)

    def append_now(self, envelope: Envelope) -> bool:
        """See :class:`loom.storage.AppendsNow` (False only when the loop is due a turn)."""
        if self._loop_share.due():
            return False
        self._append_here([envelope])
        return True

    def _append_here(self, envelopes: Sequence[Envelope]) -> None:
        execution_id, first, fence = batch_head(envelopes)
        self._check_open()
        faults.hit("before_append")
        with self._lock:
            head = self._heads.get(execution_id) or _Head()
            refusal = refusal_for(execution_id, first, fence, head.fence, len(head.events))
            if refusal is not None:
                raise refusal
            self._check_not_ended(execution_id, head)
            self._check_ids(execution_id, envelopes)
            faults.hit("before_commit")
            self._heads[execution_id] = head
            head.events.extend(envelopes)
            self._envelope_ids.update(e.envelope_id for e in envelopes)
            changed = self._index(execution_id, envelopes)
        faults.hit("after_append_before_ack")
        self._waiters.notify([execution_id, FEED_KEY] if changed else [execution_id])

    async def take_over(self, envelopes: Sequence[Envelope], *, from_fence: int) -> None:
        execution_id, first = check_take_over(envelopes, from_fence)
        self._check_open()
        faults.hit("before_append")
        with self._lock:
            head = self._heads.get(execution_id) or _Head()
            refusal = take_over_refusal(
                execution_id, first, from_fence, head.fence, len(head.events)
            )
            if refusal is not None:
                raise refusal
            self._check_not_ended(execution_id, head)
            self._check_ids(execution_id, envelopes)
            faults.hit("before_commit")
            head.fence = from_fence + 1
            head.events.extend(envelopes)
            self._heads[execution_id] = head
            self._envelope_ids.update(e.envelope_id for e in envelopes)
            changed = self._index(execution_id, envelopes)
        faults.hit("after_append_before_ack")
        self._waiters.notify([execution_id, FEED_KEY] if changed else [execution_id])

    async def take_over_many(self, requests: Sequence[TakeOver]) -> list[LoomError | None]:
        """See :meth:`loom.storage.TakesOverMany.take_over_many` (each request atomic)."""
        check_take_overs(requests)
        return await take_over_each(self.take_over, requests)

    def _index(self, execution_id: str, envelopes: Sequence[Envelope]) -> bool:
        """Update the summary under the store's lock (one commit order for the cursor)."""
        change: SummaryChange | None = summary_change(envelopes)
        if change is None:
            return False
        self._cursor += 1
        new = change.apply(self._summaries.get(execution_id))
        self._summaries[execution_id] = dataclasses.replace(new, cursor=self._cursor)
        return True

    @staticmethod
    def _check_not_ended(execution_id: str, head: _Head) -> None:
        if head.events and head.events[-1].type in TERMINAL_TYPES:
            raise ended(execution_id, str(head.events[-1].type))

    def _check_ids(self, execution_id: str, envelopes: Sequence[Envelope]) -> None:
        ids = [e.envelope_id for e in envelopes]
        taken = [i for i in ids if i in self._envelope_ids]
        if taken or len(set(ids)) != len(ids):
            dup = taken[0] if taken else ids[0]
            raise DuplicateEnvelopeIdError(
                f"envelope id {dup!r} is already stored", execution_id=execution_id
            )

    async def read(
        self, execution_id: str, *, from_sequence: int = 0, limit: int | None = None
    ) -> list[Envelope]:
        with self._lock:
            head = self._heads.get(execution_id)
            if head is None:
                return []
            start = max(from_sequence, 0)
            end = None if limit is None else start + max(limit, 0)
            return list(head.events[start:end])

    async def last_sequence(self, execution_id: str) -> int:
        with self._lock:
            head = self._heads.get(execution_id)
            return len(head.events) - 1 if head else -1

    async def acquire_fence(self, execution_id: str) -> int:
        self._check_open()
        with self._lock:
            head = self._heads.setdefault(execution_id, _Head())
            head.fence += 1
            return head.fence

    async def current_fence(self, execution_id: str) -> int:
        with self._lock:
            head = self._heads.get(execution_id)
            return head.fence if head else 0

    async def iterate_execution_ids(
        self, *, after: str | None = None, page_size: int = 256
    ) -> AsyncIterator[str]:
        cursor = after
        while True:
            with self._lock:
                ids = sorted(
                    k for k, h in self._heads.items() if h.events and (cursor is None or k > cursor)
                )[:page_size]
            for execution_id in ids:
                yield execution_id
            if len(ids) < page_size:
                return
            cursor = ids[-1]

    async def wait_for_append(
        self, execution_id: str, after_sequence: int, *, timeout: float | None = None
    ) -> int:
        return await self._waiters.wait(
            execution_id, after_sequence, timeout, self.last_sequence, None
        )

    async def list_executions(self, query: ExecutionQuery) -> ExecutionPage:
        with self._lock:
            found = [s for s in self._summaries.values() if matches(query, s, paged=True)]
        found.sort(key=lambda s: (s.created_at, s.execution_id), reverse=True)
        limit = max(query.limit, 1)
        items = found[:limit]
        return ExecutionPage(items, encode_page_cursor(items[-1]) if len(found) > limit else None)

    async def count_executions(self, query: ExecutionQuery) -> int:
        with self._lock:
            return sum(1 for s in self._summaries.values() if matches(query, s, paged=False))

    async def get_summary(self, execution_id: str) -> ExecutionSummary | None:
        with self._lock:
            return self._summaries.get(execution_id)

    async def changes(
        self, after: int, limit: int = 100, *, id_prefix: str = ""
    ) -> list[ExecutionSummary]:
        with self._lock:
            found = [
                s
                for s in self._summaries.values()
                if s.cursor > after and s.execution_id.startswith(id_prefix)
            ]
        found.sort(key=lambda s: s.cursor)
        return found[: max(limit, 1)]

    async def _last_cursor(self, _key: str = "") -> int:
        with self._lock:
            return self._cursor

    async def wait_for_changes(self, after: int, *, timeout: float | None = None) -> int:
        return await self._waiters.wait(FEED_KEY, after, timeout, self._last_cursor, None)

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        self._check_open()
        check_snapshot(snapshot)
        with self._lock:
            old = self._snapshots.get(snapshot.execution_id)
            segments = self._segments.get(snapshot.execution_id)
            head = max([old[0]] + [s[0] for s in segments or ()]) if old is not None else -1
            if head < snapshot.sequence:
                # Stored as JSON text like every other store, so nothing aliases caller state.
                self._snapshots[snapshot.execution_id] = (
                    snapshot.sequence,
                    encode_json(snapshot.state, limits=SNAPSHOT_LIMITS, what="snapshot"),
                )
                if segments:
                    segments.clear()  # all below it: the whole state replaces the chain

    async def save_snapshot_segment(self, segment: Snapshot, base: int) -> bool:
        """See :meth:`loom.storage.SnapshotSegments.save_snapshot_segment`."""
        self._check_open()
        check_snapshot(segment)
        eid, seq = segment.execution_id, segment.sequence
        state_json = encode_json(segment.state, limits=SNAPSHOT_LIMITS, what="snapshot")
        with self._lock:
            whole = self._snapshots.get(eid)
            segments = self._segments.setdefault(eid, [])
            head = max([whole[0]] + [s[0] for s in segments]) if whole is not None else None
            if head != base or not base < seq:
                return False
            segments.append((seq, base, state_json, segment_checksum(eid, seq, base, state_json)))
            return True

    async def load_snapshot(self, execution_id: str) -> Snapshot | None:
        with self._lock:
            stored = self._snapshots.get(execution_id)
            segments = list(self._segments.get(execution_id, ()))
        if stored is None:
            return None
        whole = Snapshot(execution_id, stored[0], decode_json(stored[1], limits=SNAPSHOT_LIMITS))
        return merge_segments(whole, segments)

    async def schedule_timer(self, timer: Timer) -> None:
        self._check_open()
        check_timer(timer)
        with self._lock:
            self._timers[(timer.execution_id, timer.position)] = (timer, None, 0.0)

    async def claim_due_timers(
        self,
        now: float,
        *,
        owner: str,
        lease: float,
        limit: int = 100,
        prefix: str = "",
        flow_ids: Collection[str] | None = None,
    ) -> list[Timer]:
        with self._lock:
            due = sorted(
                (
                    t
                    for t, _, until in self._timers.values()
                    if t.fire_at <= now
                    and until <= now
                    and t.execution_id.startswith(prefix)
                    and (flow_ids is None or t.flow_id in flow_ids)
                ),
                key=lambda t: (t.fire_at, t.execution_id, t.position),
            )[:limit]
            for t in due:
                self._timers[(t.execution_id, t.position)] = (t, owner, now + lease)
            return due

    async def complete_timer(self, timer: Timer) -> None:
        with self._lock:
            self._timers.pop((timer.execution_id, timer.position), None)

    async def complete_timers(self, timers: Sequence[Timer]) -> None:
        with self._lock:
            for timer in timers:
                self._timers.pop((timer.execution_id, timer.position), None)

    async def cancel_timers(self, execution_id: str) -> int:
        with self._lock:
            keys = [k for k in self._timers if k[0] == execution_id]
            for k in keys:
                del self._timers[k]
            return len(keys)

    async def next_timer_due(self, prefix: str = "") -> float | None:
        with self._lock:
            return min(
                (
                    t.fire_at
                    for t, _, _ in self._timers.values()
                    if t.execution_id.startswith(prefix)
                ),
                default=None,
            )

    async def append_with_blobs(
        self, envelopes: Sequence[Envelope], blobs: Mapping[str, bytes], *, namespace: str = ""
    ) -> None:
        await self.put_blobs(blobs, namespace=namespace)
        await self.append(envelopes)

    async def put_blobs(self, blobs: Mapping[str, bytes], *, namespace: str = "") -> None:
        check_blobs(blobs)
        self._check_open()
        with self._lock:
            for key, data in blobs.items():
                self._blobs.setdefault((namespace, key), bytes(data))

    async def get_blobs(self, hashes: Iterable[str], *, namespace: str = "") -> dict[str, bytes]:
        wanted = check_hashes(hashes)
        with self._lock:
            return {h: self._blobs[(namespace, h)] for h in wanted if (namespace, h) in self._blobs}

    # ---------------------------------------------------------------- LeaseStore

    async def renew_lease(
        self, execution_id: str, *, holder: str, fence: int, expires_at: float
    ) -> bool:
        self._check_open()
        with self._lock:
            held = self._leases.get(execution_id)
            if held is not None and held[1] > fence:
                return False
            self._leases[execution_id] = (holder, fence, expires_at)
            return True

    async def release_lease(self, execution_id: str, *, holder: str) -> None:
        with self._lock:
            held = self._leases.get(execution_id)
            if held is not None and held[0] == holder:
                del self._leases[execution_id]

    async def lease_expiry(self, execution_id: str) -> float | None:
        with self._lock:
            held = self._leases.get(execution_id)
        return None if held is None else held[2]

    async def put_message(self, message: Message) -> Message:
        self._check_open()
        text = encode_json(message.payload, what="message payload")
        with self._lock:
            box = self._mailbox.setdefault(message.execution_id, {})
            stored = box.get(message.message_id)
            if stored is not None:
                return _loaded(stored)
            box[message.message_id] = (message, text, False)
        return _loaded((message, text, False))

    async def pending_messages(
        self, execution_id: str, event_type: str, *, limit: int = 100
    ) -> list[Message]:
        with self._lock:
            box = list(self._mailbox.get(execution_id, {}).values())
        return [_loaded(m) for m in box if not m[2] and m[0].event_type == event_type][:limit]

    async def consume_message(self, execution_id: str, message_id: str) -> None:
        with self._lock:
            box = self._mailbox.get(execution_id, {})
            stored = box.get(message_id)
            if stored is not None:
                box[message_id] = (stored[0], stored[1], True)

    # ---------------------------------------------------------------- BranchRegistry

    def _ref(self, name: str) -> BranchRef:
        ref = self._refs.get(name)
        if ref is None:
            raise RefNotFoundError(f"no ref {name!r}", ref=name)
        return ref

    async def put_ref(
        self,
        name: str,
        execution_id: str,
        tip: int,
        *,
        forked_from: str | None = None,
        fork_sequence: int | None = None,
    ) -> BranchRef:
        check_new_ref(name, execution_id, tip, fork_sequence)
        self._check_open()
        with self._lock:
            existing = self._refs.get(name)
            if existing is not None:
                return put_conflict(existing, execution_id, tip)
            ref = BranchRef(
                name, execution_id, tip, forked_from, fork_sequence, updated_at=time.time()
            )
            self._refs[name] = ref
            return ref

    async def get_ref(self, name: str) -> BranchRef | None:
        check_ref_name(name)
        with self._lock:
            return self._refs.get(name)

    async def move_tip(self, name: str, sequence: int, *, expected: int) -> BranchRef:
        check_ref_name(name)
        check_tip(sequence)
        self._check_open()
        with self._lock:
            ref = self._ref(name)
            head = self._heads.get(ref.execution_id)
            check_move(ref, sequence, expected=expected, head=len(head.events) - 1 if head else -1)
            moved = dataclasses.replace(
                ref, tip=sequence, version=ref.version + 1, updated_at=time.time()
            )
            self._refs[name] = moved
            return moved

    async def promote(
        self, from_ref: str, to_ref: str, *, by: str, reason: str | None = None
    ) -> BranchRef:
        check_ref_name(from_ref)
        check_ref_name(to_ref)
        self._check_open()
        with self._lock:
            moved = promoted(
                self._ref(from_ref), self._ref(to_ref), by=by, reason=reason, now=time.time()
            )
            self._refs[to_ref] = moved
            return moved

    async def list_refs(self, prefix: str = "") -> list[BranchRef]:
        with self._lock:
            return sorted(
                (r for r in self._refs.values() if r.name.startswith(prefix)),
                key=lambda r: r.name,
            )

    async def children(self, execution_id: str) -> list[ExecutionSummary]:
        return await lineage(self, execution_id)

    async def close(self) -> None:
        self._closed = True
