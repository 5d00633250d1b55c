"""The storage conformance kit: every guarantee of the EventStore/SnapshotStore SPI, as checks
any store (ours or yours) can be run against.

    from loom.testing import run_event_store_conformance
    report = await run_event_store_conformance(make_store)   # raises on the first failure

``make_store`` is an async callable returning a fresh, empty store. Pass ``reopen`` (an async
callable taking the store and returning a new instance over the same data) to also check that
fences and events survive a reopen. With pytest, parametrize over :data:`STORE_CHECKS`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from loom.errors import (
    DuplicateEnvelopeIdError,
    DuplicateSequenceError,
    ExecutionAlreadyExistsError,
    ExecutionEndedError,
    PayloadError,
    StaleFenceError,
    StartFencedOutError,
    StorageWriteError,
)
from loom.model import Envelope, EventType, ExecutionStatus
from loom.storage import (
    ExecutionIndex,
    LoadsMany,
    MailboxStore,
    Message,
    Snapshot,
    SnapshotSegments,
    Store,
    TakesOverMany,
)

__all__ = ["STORE_CHECKS", "StoreFactory", "run_event_store_conformance", "run_store_check"]

StoreFactory = Callable[[], Awaitable[Store]]
Reopen = Callable[[Store], Awaitable[Store]]
Check = Callable[[Store, "Reopen | None"], Awaitable[None]]

STORE_CHECKS: dict[str, Check] = {}


def _check(fn: Check) -> Check:
    STORE_CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def env(
    execution_id: str,
    sequence: int,
    fence: int,
    type: str = EventType.STEP_COMPLETED,
    payload: dict[str, Any] | None = None,
    envelope_id: str | None = None,
) -> Envelope:
    """An envelope for tests (sequence 0 defaults to EXECUTION_STARTED)."""
    if sequence == 0 and type is EventType.STEP_COMPLETED:
        type = EventType.EXECUTION_STARTED
        payload = payload or {"flow_id": "conformance", "flow_version": "1", "input": None}
    return Envelope.create(
        execution_id,
        sequence,
        type,
        payload if payload is not None else {"position": sequence, "step_id": "s", "output": 1},
        fence=fence,
        recorded_at=time.time(),
        envelope_id=envelope_id,
    )


async def _expect(exc_type: type[BaseException], aw: Awaitable[Any]) -> BaseException:
    try:
        await aw
    except exc_type as exc:
        return exc
    raise AssertionError(f"expected {exc_type.__name__}, nothing was raised")


async def _start(store: Store, execution_id: str, events: int = 1) -> int:
    fence = await store.acquire_fence(execution_id)
    await store.append([env(execution_id, i, fence) for i in range(events)])
    return fence


@_check
async def check_append_and_read_round_trip(store: Store, reopen: Reopen | None) -> None:
    fence = await store.acquire_fence("rt")
    payload = {"text": "héllo ✓", "nested": {"list": [1, 2.5, None, True]}, "big": 2**70}
    batch = [env("rt", 0, fence), env("rt", 1, fence, payload=payload)]
    await store.append(batch)
    got = await store.read("rt")
    assert [e.sequence for e in got] == [0, 1]
    assert [e.envelope_id for e in got] == [e.envelope_id for e in batch]
    assert got[1].payload == payload and got[1].payload_json == batch[1].payload_json
    assert got[1].fence == fence and got[1].type is EventType.STEP_COMPLETED
    assert got[1].recorded_at == batch[1].recorded_at
    assert [e.sequence for e in await store.read("rt", from_sequence=1)] == [1]
    assert await store.read("nobody") == []
    assert await store.last_sequence("rt") == 1
    assert await store.last_sequence("nobody") == -1


@_check
async def check_any_event_type_is_kept_verbatim(store: Store, reopen: Reopen | None) -> None:
    """A store does not judge the vocabulary: an event type this process cannot fold (a newer
    Loom's, an extension's) is stored and read back like any other, never called corrupt; only
    the fold refuses it (UnknownEventError)."""
    fence = await store.acquire_fence("vocab")
    payload = {"position": 1, "model": "m-1", "tokens": 42}
    batch = [env("vocab", 0, fence), env("vocab", 1, fence, "zz.not_registered", payload)]
    await store.append(batch)
    readers = [store] if reopen is None else [store, await reopen(store)]
    try:
        for reader in readers:
            got = await reader.read("vocab")
            assert [e.type for e in got] == [EventType.EXECUTION_STARTED, "zz.not_registered"]
            assert got[0].type is EventType.EXECUTION_STARTED
            assert got[1].payload == payload and got[1].payload_json == batch[1].payload_json
            assert got[1].checksum() == batch[1].checksum()
    finally:
        for reader in readers[1:]:
            await reader.close()


@_check
async def check_sequences_are_dense(store: Store, reopen: Reopen | None) -> None:
    fence = await _start(store, "dense", 2)
    gap = await _expect(DuplicateSequenceError, store.append([env("dense", 3, fence)]))
    assert getattr(gap, "execution_id", None) == "dense"
    await _expect(DuplicateSequenceError, store.append([env("dense", 1, fence)]))
    assert [e.sequence for e in await store.read("dense")] == [0, 1]
    await store.append([env("dense", 2, fence), env("dense", 3, fence)])
    assert await store.last_sequence("dense") == 3


@_check
async def check_duplicate_envelope_id(store: Store, reopen: Reopen | None) -> None:
    # An explicit id: a derived one (execution#sequence.fence) would be refused for its form
    # alone, before the store's own uniqueness is ever asked.
    fence = await store.acquire_fence("dup-a")
    taken = "dup-explicit-id"
    await store.append([env("dup-a", 0, fence, envelope_id=taken)])
    err = await _expect(
        DuplicateEnvelopeIdError, store.append([env("dup-a", 1, fence, envelope_id=taken)])
    )
    assert getattr(err, "execution_id", None) == "dup-a"
    other = await store.acquire_fence("dup-b")
    await _expect(
        DuplicateEnvelopeIdError, store.append([env("dup-b", 0, other, envelope_id=taken)])
    )
    assert await store.read("dup-b") == []


@_check
async def check_batches_are_atomic(store: Store, reopen: Reopen | None) -> None:
    fence = await store.acquire_fence("atomic")
    taken = "atomic-explicit-id"  # explicit: refused by the store's uniqueness, mid-batch
    await store.append([env("atomic", 0, fence, envelope_id=taken)])
    batch = [env("atomic", 1, fence), env("atomic", 2, fence, envelope_id=taken)]
    await _expect(DuplicateEnvelopeIdError, store.append(batch))
    assert await store.last_sequence("atomic") == 0
    await store.append([env("atomic", 1, fence), env("atomic", 2, fence)])
    assert await store.last_sequence("atomic") == 2


@_check
async def check_fences_strictly_increase(store: Store, reopen: Reopen | None) -> None:
    assert await store.current_fence("f") == 0
    seen = [await store.acquire_fence("f") for _ in range(5)]
    assert seen == sorted(set(seen)) and seen[0] >= 1
    assert await store.current_fence("f") == seen[-1]
    concurrent = await asyncio.gather(*(store.acquire_fence("f") for _ in range(20)))
    assert len(set(concurrent)) == 20 and min(concurrent) > seen[-1]
    assert await store.current_fence("g") == 0  # fences are per execution


@_check
async def check_stale_fence_is_refused(store: Store, reopen: Reopen | None) -> None:
    old = await _start(store, "zombie", 1)
    new = await store.acquire_fence("zombie")
    assert new > old
    err = await _expect(StaleFenceError, store.append([env("zombie", 1, old)]))
    assert getattr(err, "execution_id", None) == "zombie"
    await store.append([env("zombie", 1, new)])
    await _expect(StaleFenceError, store.append([env("zombie", 2, old)]))
    assert [e.fence for e in await store.read("zombie")] == [old, new]


@_check
async def check_nothing_follows_a_terminal_event(store: Store, reopen: Reopen | None) -> None:
    for i, terminal in enumerate(
        (EventType.EXECUTION_COMPLETED, EventType.EXECUTION_FAILED, EventType.EXECUTION_CANCELLED)
    ):
        eid = f"ended-{i}"
        fence = await _start(store, eid, 2)
        await store.append([env(eid, 2, fence, type=terminal, payload={})])
        err = await _expect(ExecutionEndedError, store.append([env(eid, 3, fence)]))
        assert getattr(err, "execution_id", None) == eid
        await _expect(
            ExecutionEndedError, store.take_over([env(eid, 3, fence + 1)], from_fence=fence)
        )
        assert await store.last_sequence(eid) == 2 and await store.current_fence(eid) == fence
    # A stale holder still learns it was fenced out, and a gap is still a gap.
    fence = await _start(store, "ended-x", 1)
    await store.append([env("ended-x", 1, fence, type=EventType.EXECUTION_COMPLETED, payload={})])
    newer = await store.acquire_fence("ended-x")
    await _expect(StaleFenceError, store.append([env("ended-x", 2, fence)]))
    await _expect(DuplicateSequenceError, store.append([env("ended-x", 5, newer)]))


@_check
async def check_an_end_is_final_whichever_write_made_it(
    store: Store, reopen: Reopen | None
) -> None:
    """A terminal event ends the log whether it came alone, last in a batch, with a take-over,
    with the creating take-over (from fence 0) or in a take_over_many: nothing follows it."""
    done = EventType.EXECUTION_COMPLETED
    fence = await _start(store, "end-batch")
    await store.append([env("end-batch", 1, fence), env("end-batch", 2, fence, done, {})])
    fence = await _start(store, "end-take", 2)
    await store.take_over([env("end-take", 2, fence + 1, done, {})], from_fence=fence)
    await store.take_over([env("end-made", 0, 1), env("end-made", 1, 1, done, {})], from_fence=0)
    ended = {"end-batch": (2, await store.current_fence("end-batch"))}
    ended["end-take"] = (2, fence + 1)
    ended["end-made"] = (1, 1)
    if isinstance(store, TakesOverMany):
        fence = await _start(store, "end-many", 2)
        request = ([env("end-many", 2, fence + 1, done, {})], fence)
        assert await store.take_over_many([request]) == [None]
        ended["end-many"] = (2, fence + 1)
    readers = [store] if reopen is None else [store, await reopen(store)]
    try:
        for reader in readers:
            for eid, (last, held) in ended.items():
                after = env(eid, last + 1, held)
                err = await _expect(ExecutionEndedError, reader.append([after]))
                assert getattr(err, "execution_id", None) == eid
                taking = env(eid, last + 1, held + 1)
                await _expect(ExecutionEndedError, reader.take_over([taking], from_fence=held))
                assert await reader.last_sequence(eid) == last, eid
    finally:
        for reader in readers[1:]:
            await reader.close()


@_check
async def check_mailbox(store: Store, reopen: Reopen | None) -> None:
    """Messages wait in order per execution and event type; an id is stored once."""
    if not isinstance(store, MailboxStore):
        return  # an optional capability: runtime.send refuses a store without it
    first = await store.put_message(Message("mb", "m1", "Go", {"n": 1, "s": "é"}, 1.0))
    assert first == Message("mb", "m1", "Go", {"n": 1, "s": "é"}, 1.0)
    await store.put_message(Message("mb", "m2", "Stop", None, 2.0))
    await store.put_message(Message("mb", "m3", "Go", [1, 2], 3.0))
    await store.put_message(Message("other", "m1", "Go", "not mb's", 4.0))
    again = await store.put_message(Message("mb", "m1", "Go", {"n": "changed"}, 9.0))
    assert again == first  # a repeated id stores nothing and returns the stored message
    assert [m.message_id for m in await store.pending_messages("mb", "Go")] == ["m1", "m3"]
    assert [m.payload for m in await store.pending_messages("mb", "Go", limit=1)] == [
        {"n": 1, "s": "é"}
    ]
    await store.consume_message("mb", "m1")
    await store.consume_message("mb", "m1")  # idempotent
    await store.consume_message("mb", "unknown")
    assert [m.message_id for m in await store.pending_messages("mb", "Go")] == ["m3"]
    assert [m.message_id for m in await store.pending_messages("mb", "Stop")] == ["m2"]
    assert [m.payload for m in await store.pending_messages("other", "Go")] == ["not mb's"]
    assert await store.pending_messages("nobody", "Go") == []
    assert await store.put_message(Message("mb", "m1", "Go", None, 0.0)) == first  # still known


@_check
async def check_sequence_zero_race(store: Store, reopen: Reopen | None) -> None:
    async def start_once() -> str:
        fence = await store.acquire_fence("race")
        try:
            await store.append([env("race", 0, fence)])
            return "won"
        except ExecutionAlreadyExistsError as exc:
            assert exc.execution_id == "race"
            return "exists"
        except StorageWriteError as exc:
            assert isinstance(exc.__cause__, StartFencedOutError)
            return "fenced-out"

    outcomes = await asyncio.gather(*(start_once() for _ in range(8)))
    assert outcomes.count("won") == 1, outcomes
    assert await store.last_sequence("race") == 0
    # Once sequence 0 exists, any later start loses cleanly, whatever fence it holds.
    late = await store.acquire_fence("race")
    await _expect(ExecutionAlreadyExistsError, store.append([env("race", 0, late)]))


@_check
async def check_start_fenced_out_by_silent_holder(store: Store, reopen: Reopen | None) -> None:
    first = await store.acquire_fence("silent")
    await store.acquire_fence("silent")  # a holder that takes a fence and writes nothing
    err = await _expect(StorageWriteError, store.append([env("silent", 0, first)]))
    assert isinstance(err.__cause__, StartFencedOutError), repr(err.__cause__)
    assert not isinstance(err, (StaleFenceError, ExecutionAlreadyExistsError))
    assert await store.read("silent") == []
    retry = await store.acquire_fence("silent")
    await store.append([env("silent", 0, retry)])
    assert await store.last_sequence("silent") == 0


@_check
async def check_fence_is_required(store: Store, reopen: Reopen | None) -> None:
    try:
        env("nofence", 0, 0)
    except ValueError:
        return
    try:
        await store.append([env("nofence", 0, 0)])
    except ValueError:
        return
    raise AssertionError("an append without a fence from acquire_fence() was accepted")


@_check
async def check_snapshots(store: Store, reopen: Reopen | None) -> None:
    assert await store.load_snapshot("snap") is None
    await store.save_snapshot(Snapshot("snap", 5, {"execution_id": "snap", "n": 5}))
    await store.save_snapshot(Snapshot("snap", 3, {"execution_id": "snap", "n": 3}))
    got = await store.load_snapshot("snap")
    assert got is not None and got.sequence == 5 and got.state["n"] == 5
    await store.save_snapshot(Snapshot("snap", 9, {"execution_id": "snap", "n": 9}))
    got = await store.load_snapshot("snap")
    assert got is not None and got.sequence == 9 and got.state == {"execution_id": "snap", "n": 9}


@_check
async def check_snapshot_segments(store: Store, reopen: Reopen | None) -> None:
    if not isinstance(store, SnapshotSegments):
        return  # optional: a store without segments gets whole snapshots
    whole = {"execution_id": "seg", "n": 1, "ops": {"0": {"a": 0}}}
    assert not await store.save_snapshot_segment(Snapshot("seg", 4, {"ops": {}}), 2)  # no base
    await store.save_snapshot(Snapshot("seg", 2, whole))
    assert not await store.save_snapshot_segment(Snapshot("seg", 4, {"ops": {}}), 1)
    assert await store.save_snapshot_segment(Snapshot("seg", 4, {"n": 2, "ops": {"1": {}}}), 2)
    assert await store.save_snapshot_segment(Snapshot("seg", 6, {"ops": {"0": {"a": 6}}}), 4)
    got = await store.load_snapshot("seg")
    assert got is not None and got.sequence == 6, got
    assert got.state == {"execution_id": "seg", "n": 2, "ops": {"0": {"a": 6}, "1": {}}}
    await store.save_snapshot(Snapshot("seg", 5, whole))  # below the chain's head: kept out
    got = await store.load_snapshot("seg")
    assert got is not None and got.sequence == 6, got
    await store.save_snapshot(Snapshot("seg", 8, whole))  # replaces the chain
    got = await store.load_snapshot("seg")
    assert got is not None and got.sequence == 8 and got.state == whole, got
    if reopen is not None:
        again = await reopen(store)
        try:
            assert isinstance(again, SnapshotSegments)
            assert await again.save_snapshot_segment(Snapshot("seg", 9, {"n": 9}), 8)
        finally:
            await again.close()
        got = await store.load_snapshot("seg")
        assert got is not None and got.sequence == 9 and got.state["n"] == 9, got


@_check
async def check_take_over_many(store: Store, reopen: Reopen | None) -> None:
    """TakesOverMany (optional): each request is taken over or refused as ``take_over`` would
    do it alone; a refused one writes nothing, and the others are written all the same."""
    if not isinstance(store, TakesOverMany):
        return
    ids = [f"tm-{i:03d}" for i in range(300)]
    for start in range(0, len(ids), 100):
        await asyncio.gather(*(_start(store, eid, 2) for eid in ids[start : start + 100]))
    suspended = {"position": 1, "event_type": "loom.timer", "timeout_at": None, "timer": True}
    await store.append([env("tm-000", 2, 1, EventType.EXECUTION_SUSPENDED, suspended)])
    await store.append([env("tm-001", 2, 1, EventType.EXECUTION_COMPLETED, {"output": None})])
    await store.acquire_fence("tm-002")  # fence 2: a take-over from 1 is stale
    fired = {"position": 1, "timed_out": False}

    def request(eid: str, first: int) -> tuple[list[Envelope], int]:
        return [env(eid, first, 2, EventType.TIMER_FIRED, fired), env(eid, first + 1, 2)], 1

    requests = [request("tm-000", 3), request("tm-001", 3), request("tm-002", 2)]
    requests += [request("tm-003", 5)]  # not the next sequence
    requests += [request(eid, 2) for eid in ids[4:-2]]
    # The last two carry the same envelope id: one of the two is refused, alone.
    requests += [
        ([env(eid, 2, 2, EventType.TIMER_FIRED, fired, envelope_id="tm-same")], 1)
        for eid in ids[-2:]
    ]
    outcomes = await store.take_over_many(requests)
    assert len(outcomes) == len(requests)
    assert outcomes[0] is None, outcomes[0]
    assert isinstance(outcomes[1], ExecutionEndedError), outcomes[1]
    assert isinstance(outcomes[2], StaleFenceError), outcomes[2]
    assert isinstance(outcomes[3], DuplicateSequenceError), outcomes[3]
    assert (outcomes[-2] is None) != (outcomes[-1] is None), outcomes[-2:]
    refused = outcomes[-2] or outcomes[-1]
    assert isinstance(refused, DuplicateEnvelopeIdError), refused
    assert all(o is None for o in outcomes[4:-2]), [o for o in outcomes if o is not None][:3]
    for (envelopes, _), outcome in zip(requests, outcomes, strict=True):
        eid = envelopes[0].execution_id
        stored = await store.read(eid)
        if outcome is None:
            assert _same_events(stored[-len(envelopes) :], envelopes), eid
            assert await store.current_fence(eid) == 2, eid
        else:
            assert len(stored) == (3 if eid in ("tm-000", "tm-001") else 2), (eid, stored)
            assert await store.current_fence(eid) == (1 if eid != "tm-002" else 2), eid
            assert all(e.type is not EventType.TIMER_FIRED for e in stored), eid
    if isinstance(store, ExecutionIndex):  # the index follows: running again, changed after
        before = await store.get_summary("tm-002")
        after = await store.get_summary("tm-005")
        assert after is not None and after.status is ExecutionStatus.RUNNING, after
        assert before is not None and after.cursor > before.cursor, (before, after)
        # Suspended, then taken over in the batch whose duplicate id made it go one by one.
        woken = await store.get_summary("tm-000")
        assert woken is not None and woken.status is ExecutionStatus.RUNNING, woken
    # A batch without a colliding id is checked as it is written: nothing follows an end.
    ended_again = await store.take_over_many([request("tm-001", 3), request("tm-030", 2)])
    assert isinstance(ended_again[0], ExecutionEndedError), ended_again
    assert ended_again[1] is not None  # taken over above: from fence 1 is stale now
    assert len(await store.read("tm-001")) == 3
    # Taken over: the old holder is fenced out, and a second take-over from 1 is refused.
    await _expect(StaleFenceError, store.append([env("tm-010", 4, 1)]))
    again = await store.take_over_many([request("tm-010", 4)])
    assert isinstance(again[0], StaleFenceError), again
    await _expect(ValueError, store.take_over_many([request("tm-020", 4)] * 2))
    await _expect(ValueError, store.take_over_many([([env("tm-new", 0, 1)], 0)]))


@_check
async def check_non_finite_times_are_refused(store: Store, reopen: Reopen | None) -> None:
    """A record time of NaN or an infinity has no JSON form and no order (SQLite would store
    NaN as NULL): every write path refuses it with PayloadError naming the execution, and
    writes nothing of its batch."""
    fence = await _start(store, "nf-live", 2)
    for k, bad in enumerate((float("nan"), float("inf"), float("-inf"))):

        def timed(eid: str, sequence: int, fence: int, at: float = bad) -> Envelope:
            e = env(eid, sequence, fence)
            return Envelope.create(eid, sequence, e.type, e.payload, fence=fence, recorded_at=at)

        new = f"nf-new-{k}"
        new_fence = await store.acquire_fence(new)
        err = await _expect(PayloadError, store.append([timed(new, 0, new_fence)]))
        assert getattr(err, "execution_id", None) == new, err
        err = await _expect(
            PayloadError, store.take_over([timed(f"nf-fresh-{k}", 0, 1)], from_fence=0)
        )
        assert getattr(err, "execution_id", None) == f"nf-fresh-{k}", err
        # One step's record alone (a store's fastest path, SQLite's lone append) as well.
        err = await _expect(PayloadError, store.append([timed("nf-live", 2, fence)]))
        assert getattr(err, "execution_id", None) == "nf-live", err
        # Only the batch's last record is bad: the whole batch is refused.
        batch = [env("nf-live", 2, fence), timed("nf-live", 3, fence)]
        err = await _expect(PayloadError, store.append(batch))
        assert getattr(err, "execution_id", None) == "nf-live", err
        await _expect(
            PayloadError, store.take_over([timed("nf-live", 2, fence + 1)], from_fence=fence)
        )
        if isinstance(store, TakesOverMany):
            good = ([env("nf-live", 2, fence + 1)], fence)
            await _expect(
                PayloadError, store.take_over_many([good, ([timed(new, 0, 2)], new_fence)])
            )
        for eid in (new, f"nf-fresh-{k}"):
            assert await store.read(eid) == [], eid
        assert await store.last_sequence("nf-live") == 1
        assert await store.current_fence("nf-live") == fence
    await store.append([env("nf-live", 2, fence)])  # the execution is untouched, and writable


def _same_events(got: list[Envelope], want: list[Envelope]) -> bool:
    def key(e: Envelope) -> tuple[Any, ...]:
        return (e.envelope_id, e.sequence, str(e.type), e.payload_json, e.fence, e.checksum())

    return [key(e) for e in got] == [key(e) for e in want]


@_check
async def check_load_many(store: Store, reopen: Reopen | None) -> None:
    """LoadsMany (optional): one call answers, for each id, what ``load_snapshot``, ``read``
    from just after that snapshot and ``last_sequence`` answer one at a time."""
    if not isinstance(store, LoadsMany):
        return
    await _start(store, "lm-plain", 3)  # no snapshot: every event
    await _start(store, "lm-tail", 5)  # a snapshot and the events after it
    await store.save_snapshot(Snapshot("lm-tail", 2, {"execution_id": "lm-tail", "n": 2}))
    await _start(store, "lm-top", 2)  # a snapshot of the whole log: no event after it
    await store.save_snapshot(Snapshot("lm-top", 1, {"execution_id": "lm-top"}))
    await store.save_snapshot(Snapshot("lm-nolog", 4, {"execution_id": "lm-nolog"}))
    await _start(store, "lm-beyond", 2)  # a snapshot beyond the log: reported as it is
    await store.save_snapshot(Snapshot("lm-beyond", 7, {"execution_id": "lm-beyond"}))
    await store.acquire_fence("lm-fenced")  # a fence, no events: not an execution
    ids = ["lm-plain", "lm-tail", "lm-top", "lm-nolog", "lm-beyond", "lm-fenced", "lm-unknown"]
    if isinstance(store, SnapshotSegments):
        # The chain links 1 -> 3; the segment at 6 (on base 5) does not, so the snapshot is
        # at 3 and the events from 4 on are the tail.
        await _start(store, "lm-seg", 8)
        whole = {"execution_id": "lm-seg", "n": 1, "ops": {}}
        await store.save_snapshot(Snapshot("lm-seg", 1, whole))
        assert await store.save_snapshot_segment(Snapshot("lm-seg", 3, {"n": 3, "ops": {}}), 1)
        assert not await store.save_snapshot_segment(Snapshot("lm-seg", 6, {"n": 6}), 5)
        ids.append("lm-seg")
    got = await store.load_many([*ids, "lm-tail", "lm-plain"])  # repeats add nothing
    present = []
    for eid in ids:
        last = await store.last_sequence(eid)
        if last < 0:
            assert eid not in got, (eid, got.get(eid))
            continue
        present.append(eid)
        one = got[eid]
        snap = await store.load_snapshot(eid)
        assert one.execution_id == eid and one.snapshot == snap, (eid, one.snapshot, snap)
        assert one.last_sequence == last, (eid, one.last_sequence, last)
        after = await store.read(eid, from_sequence=0 if snap is None else snap.sequence + 1)
        assert _same_events(one.events, after), (eid, one.events, after)
    assert sorted(got) == sorted(present) and "lm-tail" in got and "lm-beyond" in got
    assert [e.sequence for e in got["lm-tail"].events] == [3, 4]
    assert got["lm-beyond"].events == [] and got["lm-beyond"].last_sequence == 1
    # Many at once (more than one statement's worth of ids on some stores).
    many = [f"lm-{i:04d}" for i in range(600)]
    for start in range(0, len(many), 100):
        await asyncio.gather(*(_start(store, eid, 2) for eid in many[start : start + 100]))
    got = await store.load_many(many)
    assert sorted(got) == many
    assert all(
        g.snapshot is None and [e.sequence for e in g.events] == [0, 1] for g in got.values()
    )
    assert await store.load_many([]) == {}


@_check
async def check_enumeration(store: Store, reopen: Reopen | None) -> None:
    ids = ["e-03", "e-01", "e-05", "e-02", "e-04"]
    for execution_id in ids:
        await _start(store, execution_id, 1)
    await store.acquire_fence("e-00-fence-only")  # no events: not an execution yet
    listed = [i async for i in store.iterate_execution_ids(page_size=2)]
    assert listed == sorted(ids), listed
    after = [i async for i in store.iterate_execution_ids(after="e-02", page_size=2)]
    assert after == ["e-03", "e-04", "e-05"]


@_check
async def check_wait_for_append(store: Store, reopen: Reopen | None) -> None:
    fence = await _start(store, "waited", 1)
    assert await store.wait_for_append("waited", 0, timeout=0.01) == 0
    waiter = asyncio.ensure_future(store.wait_for_append("waited", 0, timeout=10))
    await asyncio.sleep(0)
    assert not waiter.done()
    await store.append([env("waited", 1, fence)])
    async with asyncio.timeout(10):
        assert await waiter == 1


@_check
async def check_concurrent_appends_to_many_executions(store: Store, reopen: Reopen | None) -> None:
    ids = [f"many-{i:02d}" for i in range(40)]
    fences = await asyncio.gather(*(store.acquire_fence(i) for i in ids))

    async def write(execution_id: str, fence: int) -> None:
        for seq in range(5):
            await store.append([env(execution_id, seq, fence)])

    await asyncio.gather(*(write(i, f) for i, f in zip(ids, fences, strict=True)))
    for execution_id in ids:
        assert [e.sequence for e in await store.read(execution_id)] == [0, 1, 2, 3, 4]


@_check
async def check_refusal_names_its_own_execution(store: Store, reopen: Reopen | None) -> None:
    """Writers coalesced with a refused one are unaffected; the refusal names its writer."""
    good = [f"ok-{i}" for i in range(10)]
    fences = await asyncio.gather(*(store.acquire_fence(i) for i in good))
    stale = await _start(store, "bad", 1)
    await store.acquire_fence("bad")
    results = await asyncio.gather(
        store.append([env("bad", 1, stale)]),
        *(store.append([env(i, 0, f)]) for i, f in zip(good, fences, strict=True)),
        return_exceptions=True,
    )
    assert isinstance(results[0], StaleFenceError) and results[0].execution_id == "bad"
    assert results[1:] == [None] * len(good), results[1:]


@_check
async def check_take_over_is_conditional(store: Store, reopen: Reopen | None) -> None:
    # from_fence=0 on an untouched execution creates it with fence 1, in one write.
    await store.take_over([env("t", 0, 1), env("t", 1, 1)], from_fence=0)
    assert [e.sequence for e in await store.read("t")] == [0, 1]
    assert await store.current_fence("t") == 1
    await _expect(ExecutionAlreadyExistsError, store.take_over([env("t", 0, 2)], from_fence=1))
    # Taking over a waiting execution advances the fence by exactly one...
    await store.take_over([env("t", 2, 2)], from_fence=1)
    assert await store.current_fence("t") == 2
    await _expect(StaleFenceError, store.append([env("t", 3, 1)]))  # ...fencing out fence 1
    # ...and a racer that lost changes nothing: not the fence, not the log.
    await _expect(StaleFenceError, store.take_over([env("t", 3, 2)], from_fence=1))
    await store.append([env("t", 3, 2, envelope_id="t-explicit-id")])
    await _expect(DuplicateSequenceError, store.take_over([env("t", 3, 3)], from_fence=2))
    assert await store.current_fence("t") == 2 and await store.last_sequence("t") == 3
    # A fence taken by a holder that wrote nothing is taken over from that fence.
    silent = await store.acquire_fence("s")
    await _expect(StaleFenceError, store.take_over([env("s", 0, 1)], from_fence=0))
    await store.take_over([env("s", 0, silent + 1)], from_fence=silent)
    # The silent holder's own start then loses cleanly.
    await _expect(ExecutionAlreadyExistsError, store.append([env("s", 0, silent)]))
    # A duplicate envelope id changes nothing either (an explicit one: see the duplicate check).
    taken = "t-explicit-id"
    await _expect(
        DuplicateEnvelopeIdError,
        store.take_over([env("d", 0, 1, envelope_id=taken)], from_fence=0),
    )
    assert await store.read("d") == [] and await store.current_fence("d") == 0


@_check
async def check_take_over_races(store: Store, reopen: Reopen | None) -> None:
    """Eight holders race to take over one waiting execution: exactly one wins, and the fence
    advances exactly once."""
    fence = await _start(store, "race-over", 1)

    async def attempt() -> bool:
        try:
            await store.take_over([env("race-over", 1, fence + 1)], from_fence=fence)
            return True
        except (StaleFenceError, DuplicateSequenceError):
            return False

    wins = await asyncio.gather(*(attempt() for _ in range(8)))
    assert wins.count(True) == 1, wins
    assert await store.current_fence("race-over") == fence + 1
    assert await store.last_sequence("race-over") == 1


@_check
async def check_survives_reopen(store: Store, reopen: Reopen | None) -> None:
    if reopen is None:
        return
    fence = await _start(store, "durable", 2)
    await store.save_snapshot(Snapshot("durable", 1, {"execution_id": "durable"}))
    again = await reopen(store)
    try:
        assert [e.sequence for e in await again.read("durable")] == [0, 1]
        assert await again.current_fence("durable") == fence
        assert await again.acquire_fence("durable") == fence + 1
        await _expect(StaleFenceError, again.append([env("durable", 2, fence)]))
        snap = await again.load_snapshot("durable")
        assert snap is not None and snap.sequence == 1
    finally:
        await again.close()


async def run_store_check(
    name: str, make_store: StoreFactory, *, reopen: Reopen | None = None
) -> None:
    """Run one named check of :data:`STORE_CHECKS` on a fresh store."""
    store = await make_store()
    try:
        await STORE_CHECKS[name](store, reopen)
    finally:
        await store.close()


async def run_event_store_conformance(
    make_store: StoreFactory, *, reopen: Reopen | None = None
) -> list[str]:
    """Run every check on a fresh store each; return the names that passed (raise on failure)."""
    passed = []
    for name in STORE_CHECKS:
        try:
            await run_store_check(name, make_store, reopen=reopen)
        except AssertionError as exc:
            raise AssertionError(f"store conformance check {name!r} failed: {exc}") from exc
        passed.append(name)
    return passed
