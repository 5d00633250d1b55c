"""The storage SPI: small Protocols with a written contract per method."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from loom.errors import LoomError
from loom.model import Envelope, ExecutionStatus, ExecutionSummary

__all__ = [
    "AppendsNow",
    "EventStore",
    "ExecutionIndex",
    "ExecutionPage",
    "ExecutionQuery",
    "LoadsMany",
    "MailboxStore",
    "Message",
    "Snapshot",
    "SnapshotSegments",
    "SnapshotStore",
    "Store",
    "StoredExecution",
    "TakeOver",
    "TakesOverMany",
    "Timer",
    "TimerStore",
]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A folded ``ExecutionState`` (as its ``to_dict``) covering sequences ``0..sequence``."""

    execution_id: str
    sequence: int
    state: dict[str, Any]
    #: For a loaded chain (a whole snapshot with segments merged in): how many op records its
    #: whole snapshot holds and how many its segments carried (plus one per segment), so that
    #: a driver extending the chain knows when to compact it. None: the store does not say
    #: (a driver then writes a whole snapshot first).
    chain: tuple[int, int] | None = field(default=None, compare=False)


@runtime_checkable
class EventStore(Protocol):
    """The append-only log of every execution.

    Concurrency contract: any number of callers, threads or processes (where the store spans
    processes) may call any method at once; the guarantees below hold across all of them.
    """

    async def append(self, envelopes: Sequence[Envelope]) -> None:
        """Atomically append ``envelopes`` (one execution, dense sequences, one fence).

        All or nothing. The batch's first sequence must be the execution's next one and every
        envelope must carry the execution's *current* fence (see :meth:`acquire_fence`).

        Raises, with nothing written:
          * ``ExecutionAlreadyExistsError`` - the batch starts at 0 and sequence 0 exists;
          * ``StorageWriteError`` caused by ``StartFencedOutError`` - the batch starts at 0,
            nothing exists, and a newer fence was taken by a holder that has not written;
          * ``StaleFenceError`` - the fence is not the current one (a newer holder exists);
          * ``DuplicateSequenceError`` - the first sequence is not the next one (gap/repeat);
          * ``DuplicateEnvelopeIdError`` - an envelope id is already stored, or an explicit
            one has the derived form (``execution#sequence.fence``) of another record's id
            (see ``loom.model.derived_envelope_id``; refused before anything else is checked);
          * ``ValueError`` - a malformed batch (mixed executions or fences, a gap inside it,
            an empty envelope id);
          * ``StorageWriteError`` - the store could not commit (I/O, connection); its
            ``__cause__`` is the underlying error. Nothing was written, unless its
            ``outcome`` is ``WriteOutcome.UNKNOWN`` (a network store lost the answer to its
            COMMIT and could not find out) or ``WriteOutcome.COMMITTED`` (the write is durable
            but the acknowledgement failed): then re-read the execution before acting again.
        """
        ...

    async def take_over(self, envelopes: Sequence[Envelope], *, from_fence: int) -> None:
        """Atomically advance the execution's fence from ``from_fence`` to ``from_fence + 1``
        and append ``envelopes`` (which carry fence ``from_fence + 1``), only if the current
        fence is still ``from_fence`` and the batch starts at the next sequence.

        This is how a holder takes over a waiting or orphaned execution without ever fencing
        out a live holder that moved first: when it loses, nothing changes (the fence is not
        advanced). ``from_fence=0`` on an execution nobody touched creates it (fence 1).

        Raises, with nothing changed:
          * ``ExecutionAlreadyExistsError`` - the batch starts at 0 and sequence 0 exists;
          * ``StaleFenceError`` - the current fence is no longer ``from_fence``;
          * ``DuplicateSequenceError`` - the first sequence is not the next one;
          * ``DuplicateEnvelopeIdError`` and ``StorageWriteError`` as :meth:`append` does.
        """
        ...

    async def read(
        self, execution_id: str, *, from_sequence: int = 0, limit: int | None = None
    ) -> list[Envelope]:
        """Envelopes with ``sequence >= from_sequence`` in order, at most ``limit`` of them
        (all when None); ``[]`` for an unknown id.

        Raises ``CorruptEventError`` if a record fails its checksum or cannot be decoded.
        """
        ...

    async def last_sequence(self, execution_id: str) -> int:
        """Highest stored sequence, or -1 when the execution has no events."""
        ...

    async def acquire_fence(self, execution_id: str) -> int:
        """Take a new durable fence: strictly greater than every fence issued before for this
        execution (across restarts and processes). Appends with older fences are refused."""
        ...

    async def current_fence(self, execution_id: str) -> int:
        """The newest fence issued for the execution (0 if none)."""
        ...

    def iterate_execution_ids(
        self, *, after: str | None = None, page_size: int = 256
    ) -> AsyncIterator[str]:
        """Every execution id with at least one event, ascending, paging by ``after``."""
        ...

    async def wait_for_append(
        self, execution_id: str, after_sequence: int, *, timeout: float | None = None
    ) -> int:
        """Wait until an event with sequence > ``after_sequence`` exists (or ``timeout``);
        return the highest stored sequence either way."""
        ...

    async def close(self) -> None:
        """Release connections and threads. Idempotent."""
        ...


@runtime_checkable
class SnapshotStore(Protocol):
    """Folded states that let loading read a snapshot plus the tail of the log."""

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` unless one with a higher or equal sequence is already stored."""
        ...

    async def load_snapshot(self, execution_id: str) -> Snapshot | None:
        """The newest snapshot, or None. Raises ``CorruptEventError`` if it fails its checksum."""
        ...


@runtime_checkable
class SnapshotSegments(Protocol):
    """A snapshot store that also keeps snapshots as a chain of segments, so that writing one
    costs what changed since the last, not the whole state (optional: a store without this
    gets whole snapshots). ``save_snapshot`` replaces the chain with one whole snapshot;
    ``load_snapshot`` returns the whole stored state with every linked segment merged in."""

    async def save_snapshot_segment(self, segment: Snapshot, base: int) -> bool:
        """Keep ``segment`` on top of the newest stored snapshot if that is at ``base``
        (``base < segment.sequence``) and return True; otherwise write nothing and return
        False (the caller then writes a whole snapshot).

        ``segment.state`` holds the top-level keys of the state that changed since ``base``,
        its ``ops`` only the op records added or changed; merging is ``dict.update`` of the
        top level and of ``ops``. A segment cannot remove an op: write a whole snapshot.
        """
        ...


@dataclass(frozen=True, slots=True)
class StoredExecution:
    """What loading one execution reads: its newest snapshot (segments merged, as
    :meth:`SnapshotStore.load_snapshot` returns it) or None, the events after it in order
    (every event when there is no snapshot), and the log's last sequence."""

    execution_id: str
    snapshot: Snapshot | None
    events: list[Envelope]
    last_sequence: int


@runtime_checkable
class LoadsMany(Protocol):
    """A store that reads what loading many executions needs in one round trip (optional: a
    timer service waking a claimed batch uses it; without it each execution is read alone)."""

    async def load_many(self, execution_ids: Sequence[str]) -> dict[str, StoredExecution]:
        """For each id that has at least one event, what ``load_snapshot``, ``read`` from
        just after that snapshot and ``last_sequence`` would return, keyed by id; ids without
        events (and repeated ids beyond the first) add nothing.

        The snapshot is read before the events, so ``events`` reaches at least as far as the
        snapshot's sequence and is dense up to ``last_sequence``, unless the snapshot itself
        is beyond the log (which the caller's validation then refuses). Raises
        ``CorruptEventError`` when any record read fails its checksum or cannot be decoded:
        the caller then loads the executions one at a time.
        """
        ...


@runtime_checkable
class AppendsNow(Protocol):
    """A store that can commit one record in the caller's own frame (optional: the runtime
    records a new step through it, one coroutine and a few checks fewer than ``append``).

    Without it, every record goes through ``append``; with it, nothing changes but where the
    commit runs: the same statements, refusals, fault points and errors as ``append([env])``.
    """

    def append_now(self, envelope: Envelope) -> bool | Awaitable[None]:
        """Append ``envelope`` as ``append([envelope])`` would, without awaiting if it can.

        True: committed here (or refused: the refusal is raised here). False: nothing was
        done, not even a fault point crossed; the caller awaits ``append``. An awaitable: the
        write is under way (it waits for another process's lock, say) and the caller awaits
        it, which then returns or raises as ``append`` would.
        """
        ...


#: One take-over of :meth:`TakesOverMany.take_over_many`: the envelopes (fence ``from_fence +
#: 1``) and ``from_fence``, as :meth:`EventStore.take_over` takes them.
TakeOver = tuple[Sequence[Envelope], int]


@runtime_checkable
class TakesOverMany(Protocol):
    """A store that takes over many executions in one write (optional: a timer service firing
    a claimed batch uses it; without it each wake takes its execution over alone)."""

    async def take_over_many(self, requests: Sequence[TakeOver]) -> list[LoomError | None]:
        """Do each request as :meth:`EventStore.take_over` would, all in one transaction (one
        durable commit) where the store can; return, per request in order, None when it was
        written or its refusal (``StaleFenceError``, ``DuplicateSequenceError``,
        ``ExecutionEndedError``, ``DuplicateEnvelopeIdError``, ...), which wrote nothing of
        it and nothing of the others' outcome depends on.

        The requests name distinct executions and none starts one (``from_fence >= 1``),
        else ``ValueError`` before anything is written. Raises ``StorageWriteError`` when the
        write as a whole failed, as :meth:`EventStore.append` describes (nothing written,
        unless its ``outcome`` says otherwise).
        """
        ...


@dataclass(frozen=True, slots=True)
class Timer:
    """A durable wake-up: at ``fire_at`` (epoch seconds) the execution's wait at ``position``
    ends. ``kind`` is ``"sleep"`` (ctx.sleep) or ``"gate_timeout"`` (ctx.suspend's timeout)."""

    execution_id: str
    position: int
    fire_at: float
    kind: str = "sleep"
    flow_id: str = ""


@runtime_checkable
class TimerStore(Protocol):
    """Durable timers, claimed with a database lock so that many services can poll one store.

    Claiming is an optimisation against duplicate work, not the exactly-once guarantee: a wake
    checks the log (the wait must still be open at that position) under a fresh fence, so a
    timer whose claim expired and is fired twice still resolves its wait once.
    """

    async def schedule_timer(self, timer: Timer) -> None:
        """Store ``timer``; idempotent per (execution_id, position) (the later call wins)."""
        ...

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
        """Claim up to ``limit`` timers due at ``now`` that nobody holds (or whose claim
        expired), for ``lease`` seconds. Two concurrent callers never claim the same timer.
        ``prefix`` restricts the claim to execution ids that start with it (a tenant's);
        ``flow_ids``, when given, to timers of those flows (a runtime that lacks a flow's code
        must not claim, and so hold for a whole lease, the timers it cannot fire)."""
        ...

    async def complete_timer(self, timer: Timer) -> None:
        """Delete a fired timer (only that position's row)."""
        ...

    async def complete_timers(self, timers: Sequence[Timer]) -> None:
        """Delete many fired timers in one write (each only at its position's row): a timer
        service settles a batch of wakes with one commit, not one per timer."""
        ...

    async def cancel_timers(self, execution_id: str) -> int:
        """Delete every pending timer of an execution; return how many."""
        ...

    async def next_timer_due(self, prefix: str = "") -> float | None:
        """The earliest ``fire_at`` among pending timers (claimed or not) whose execution id
        starts with ``prefix``, or None."""
        ...


@dataclass(frozen=True, slots=True)
class Message:
    """A message in one execution's mailbox (``runtime.send``).

    It waits outside the log until a gate of ``event_type`` consumes it; the log then records
    which message the gate consumed (its ``message_id``), so replay never reads the mailbox.
    ``payload`` is JSON, already validated against the flow's schema for ``event_type``.
    """

    execution_id: str
    message_id: str
    event_type: str
    payload: Any = None
    sent_at: float = 0.0


@runtime_checkable
class MailboxStore(Protocol):
    """A durable mailbox per execution: messages that arrive before the flow's gate does.

    Only the mailbox lives here; consumption is decided by the log (a message is consumed once
    a gate's record names its id), so a store need not be atomic with the log.
    """

    async def put_message(self, message: Message) -> Message:
        """Store ``message`` at the end of its execution's mailbox and return it; if a message
        with the same ``message_id`` is already stored for that execution, store nothing and
        return the stored one (a repeated idempotency key)."""
        ...

    async def pending_messages(
        self, execution_id: str, event_type: str, *, limit: int = 100
    ) -> list[Message]:
        """Up to ``limit`` messages of ``event_type`` not marked consumed, oldest first."""
        ...

    async def consume_message(self, execution_id: str, message_id: str) -> None:
        """Mark a message consumed (after the log recorded it); idempotent."""
        ...


@runtime_checkable
class LeaseStore(Protocol):
    """Liveness leases: a runtime renews one for every execution it is driving.

    A lease says "a live process drives this execution, under this fence, until
    ``expires_at``". It is advisory (fencing, not the lease, keeps writes safe): it only answers
    "is anybody alive holding it?" for :func:`loom.lease_expired`. A holder that froze (SIGSTOP,
    a GC pause, a partition) stops renewing, so its lease runs out even though its process
    still exists.
    """

    async def renew_lease(
        self, execution_id: str, *, holder: str, fence: int, expires_at: float
    ) -> bool:
        """Create or extend the lease unless a holder with a newer fence holds it (a zombie
        with an older fence never takes a lease back). True if the lease is now ``holder``'s."""
        ...

    async def release_lease(self, execution_id: str, *, holder: str) -> None:
        """Drop the lease if ``holder`` still holds it (a holder that stopped driving)."""
        ...

    async def lease_expiry(self, execution_id: str) -> float | None:
        """When the execution's lease expires (epoch seconds), or None if nobody holds one."""
        ...


@runtime_checkable
class Store(EventStore, SnapshotStore, Protocol):
    """An event store that also keeps snapshots: what ``WorkflowRuntime`` needs."""


@dataclass(frozen=True, slots=True)
class ExecutionQuery:
    """Filters of an index listing (all optional; they combine with AND).

    ``statuses``: any of these; ``created_after``/``created_before``: exclusive bounds on the
    start time (epoch seconds); ``id_contains``: a substring of the execution id; ``id_prefix``:
    ids that start with it (the tenant view uses it). ``limit`` rows per page; ``cursor`` is
    the ``next_cursor`` of the previous page (None: the first page).
    """

    statuses: Collection[ExecutionStatus | str] | None = None
    flow_id: str | None = None
    parent_id: str | None = None
    forked_from: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    id_contains: str | None = None
    id_prefix: str = ""
    limit: int = 50
    cursor: str | None = None


@dataclass(frozen=True, slots=True)
class ExecutionPage:
    """One page of a listing, newest first; ``next_cursor`` is None on the last page."""

    items: list[ExecutionSummary]
    next_cursor: str | None


@runtime_checkable
class ExecutionIndex(Protocol):
    """The store-maintained summary of every execution, and a global change feed.

    A summary row is written in the same transaction as the append that changes it (see
    :func:`loom.model.summarize`), so the index never disagrees with a committed log. Every
    write of a row gives it the next *change cursor*: cursors grow in commit order across the
    whole store (every process), so a reader that has seen every change up to cursor ``c``
    never later finds a new change below ``c``.
    """

    async def list_executions(self, query: ExecutionQuery) -> ExecutionPage:
        """One page of the executions matching ``query``, newest first (keyset paging)."""
        ...

    async def count_executions(self, query: ExecutionQuery) -> int:
        """How many executions match ``query`` (its ``limit`` and ``cursor`` are ignored)."""
        ...

    async def get_summary(self, execution_id: str) -> ExecutionSummary | None:
        """The summary of one execution, or None."""
        ...

    async def changes(
        self, after: int, limit: int = 100, *, id_prefix: str = ""
    ) -> list[ExecutionSummary]:
        """Summaries whose last change has a cursor > ``after``, ascending by cursor (at most
        ``limit``; ids starting with ``id_prefix``). An execution that changed several times
        since ``after`` appears once, as it is now."""
        ...

    async def wait_for_changes(self, after: int, *, timeout: float | None = None) -> int:
        """Wait until some change has a cursor > ``after`` (or ``timeout``); return the highest
        committed cursor either way (0 when the index is empty)."""
        ...
