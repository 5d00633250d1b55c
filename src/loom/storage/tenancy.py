"""TenantScopedEventStore: many tenants over one physical store, each seeing only its own.

Every key a tenant passes is scoped as ``f"{tenant}:{key}"`` before it reaches the physical
store, and unscoped on the way back, so the physical store enforces fences, the sequence-0 race
and uniqueness per tenant with its own (database) guarantees; the view adds no state of its own.

* Execution ids: scoped. Reads, fences, snapshots, waits and enumeration only ever name the
  tenant's own keys; enumeration lists the tenant's executions in ascending (unscoped) order.
* Envelope ids: scoped too. The physical store keeps envelope ids globally unique, so an
  unscoped id would let one tenant learn that another tenant stored an id (and pre-claim ids
  another tenant is about to use). Scoped, a tenant's id collides only with its *own* ids: a
  duplicate within the tenant raises ``DuplicateEnvelopeIdError`` naming the tenant's
  (unscoped) execution; the same id in two tenants is two different records.
* Envelopes are rebuilt with ``dataclasses.replace``: ``payload_json`` is carried verbatim, so
  the physical store checksums (and later verifies) exactly the bytes it stores, scoped ids
  included, and the tenant reads back its envelope with its own ids and identical payload.
* Refusals are re-raised with the caller's unscoped execution id (and the tenant prefix taken
  out of the message), the same class, details and hint, and the physical store's error as
  ``__cause__`` (dispatchers match refusals by
  execution id: a scoped id would read as a genuine failure and be retried). A
  ``StorageWriteError`` caused by ``StartFencedOutError`` keeps that shape: the new
  ``StorageWriteError`` is caused by a new unscoped ``StartFencedOutError``, whose cause is the
  physical store's error. An error naming *another* tenant's execution is never shown: it
  becomes a plain ``StorageWriteError`` with no cause chain.

Use a physical store only through tenant views: a raw key ``"acme:x"`` written around them is
tenant ``acme``'s execution ``x``. ``close()`` closes only this view unless
``close_store=True``: the physical store is shared.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import AsyncIterator, Awaitable, Collection, Iterable, Mapping, Sequence
from typing import TypeVar

from loom.errors import (
    BranchError,
    ConfigurationError,
    LoomError,
    StartFencedOutError,
    StorageWriteError,
)
from loom.model import Envelope, ExecutionSummary
from loom.storage._blobs import AppendsWithBlobs, BlobStore
from loom.storage._branches import (
    BranchRef,
    BranchRegistry,
    check_ref_name,
    check_target,
    lineage,
)
from loom.storage._common import check_take_overs, take_over_each
from loom.storage._index import decode_page_cursor, encode_page_cursor
from loom.storage._spi import (
    EventStore,
    ExecutionIndex,
    ExecutionPage,
    ExecutionQuery,
    LeaseStore,
    LoadsMany,
    MailboxStore,
    Message,
    Snapshot,
    SnapshotSegments,
    SnapshotStore,
    StoredExecution,
    TakeOver,
    TakesOverMany,
    Timer,
    TimerStore,
)

__all__ = ["MAX_TENANT_LENGTH", "SEPARATOR", "TenantScopedEventStore"]

T = TypeVar("T")

SEPARATOR = ":"
MAX_TENANT_LENGTH = 64

# Every id the physical store holds for a tenant sorts after this and before any key of a
# tenant that sorts after ours: ':' follows '9', and a tenant id may not contain U+10FFFF
# (category Cn), so no scoped key of any tenant lies between it and f"{tenant}:".
_BEFORE_SEPARATOR = "9\U0010ffff"


def _check_tenant(tenant: object) -> str:
    if not isinstance(tenant, str) or not tenant:
        raise ConfigurationError(f"a tenant id must be a non-empty string, not {tenant!r}")
    if len(tenant) > MAX_TENANT_LENGTH:
        raise ConfigurationError(
            f"tenant id {tenant[:16]!r}... is {len(tenant)} characters; at most "
            f"{MAX_TENANT_LENGTH} are allowed"
        )
    if SEPARATOR in tenant:
        raise ConfigurationError(
            f"tenant id {tenant!r} contains {SEPARATOR!r}, the scope separator: it could "
            "collide with another tenant's keys"
        )
    for ch in tenant:
        # Control, format, surrogate, private-use and unassigned characters, and line/paragraph
        # separators: invisible or unstable characters make look-alike tenants.
        if unicodedata.category(ch)[0] == "C" or unicodedata.category(ch) in ("Zl", "Zp"):
            raise ConfigurationError(
                f"tenant id {tenant!r} contains the control or invisible character U+{ord(ch):04X}"
            )
    return tenant


class TenantScopedEventStore:
    """One tenant's view of a shared :class:`~loom.storage.Store` (see the module docstring).

    ``store`` may be any ``EventStore``; the snapshot methods need it to be a
    ``SnapshotStore`` too and raise ``ConfigurationError`` otherwise. ``tenant`` must be 1..64
    characters without ``":"`` or control/invisible characters (``ConfigurationError``).
    """

    def __init__(self, store: EventStore, tenant: str, *, close_store: bool = False) -> None:
        self.tenant = _check_tenant(tenant)
        self.store = store
        self.close_store = close_store
        self._prefix = tenant + SEPARATOR
        self._snapshots = store if isinstance(store, SnapshotStore) else None
        self._closed = False

    # ---------------------------------------------------------------- scoping

    def _scope(self, key: str) -> str:
        return self._prefix + key

    def _unscope(self, key: str) -> str:
        # The physical store only ever hands back keys we scoped; anything else is a bug there.
        if not key.startswith(self._prefix):
            raise AssertionError(f"the store returned a key outside tenant {self.tenant!r}")
        return key[len(self._prefix) :]

    def _scope_envelope(self, env: Envelope) -> Envelope:
        if not env.envelope_id:  # scoped it would pass; every physical store refuses it
            raise ValueError("an envelope id must be a non-empty string")
        return dataclasses.replace(
            env,
            execution_id=self._scope(env.execution_id),
            envelope_id=self._scope(env.envelope_id),
        )

    def _unscope_envelope(self, env: Envelope) -> Envelope:
        return dataclasses.replace(
            env,
            execution_id=self._unscope(env.execution_id),
            envelope_id=self._unscope(env.envelope_id),
        )

    async def _call(self, aw: Awaitable[T]) -> T:
        """Await a physical store call, re-raising its error in the tenant's terms."""
        try:
            return await aw
        except LoomError as err:
            error = self._tenant_error(err)
        # Raised outside the except block, so a hidden error is not even the __context__.
        raise error

    def _tenant_error(self, err: LoomError) -> LoomError:
        """The physical store's error as this tenant sees it (see the module docstring)."""
        scoped = err.execution_id
        if scoped is None:
            return err  # names no execution (an I/O failure): nothing to translate or hide
        if not scoped.startswith(self._prefix):
            # A coalesced batch failed on another tenant's write: for this caller it is a
            # genuine storage failure, and the other tenant's id must not leak.
            return StorageWriteError(
                "the write failed together with another writer's in a coalesced batch; "
                "nothing was written",
                hint="Retry the write",
            )
        unscoped = scoped[len(self._prefix) :]
        new = self._translate(err, unscoped)
        if isinstance(err, StorageWriteError) and isinstance(err.__cause__, StartFencedOutError):
            cause = self._translate(err.__cause__, unscoped)
            cause.__cause__ = err
            new.__cause__ = cause
        else:
            new.__cause__ = err
        return new

    def _translate(self, err: LoomError, unscoped: str) -> LoomError:
        # Every key in the message (execution and envelope ids) is one of this tenant's, quoted
        # by repr() (or in parentheses, in PostgreSQL's key details): take the tenant prefix
        # off the start of each such id, and nothing else
        # (an id may itself contain "<tenant>:"). The execution's own id is matched whole
        # first, so an id containing quotes is restored exactly.
        own = repr(self._prefix + unscoped)
        pattern = re.compile(f"{re.escape(own)}|(['\"(]){re.escape(self._prefix)}")

        def unscope(match: re.Match[str]) -> str:
            return repr(unscoped) if match.group(0) == own else match.group(1)

        return type(err)(
            pattern.sub(unscope, err.message),
            execution_id=unscoped,
            hint=err.hint,
            **err.details,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise StorageWriteError(f"the store of tenant {self.tenant!r} is closed")

    # ---------------------------------------------------------------- EventStore

    async def append(self, envelopes: Sequence[Envelope]) -> None:
        """Append the tenant's envelopes; refusals name the unscoped execution id."""
        self._check_open()
        await self._call(self.store.append([self._scope_envelope(e) for e in envelopes]))

    async def take_over(self, envelopes: Sequence[Envelope], *, from_fence: int) -> None:
        """Conditionally take over the tenant's execution; refusals name the unscoped id."""
        self._check_open()
        await self._call(
            self.store.take_over(
                [self._scope_envelope(e) for e in envelopes], from_fence=from_fence
            )
        )

    async def take_over_many(self, requests: Sequence[TakeOver]) -> list[LoomError | None]:
        """See :meth:`loom.storage.TakesOverMany.take_over_many`: one write of the physical
        store where it takes over many too, else one take-over at a time; refusals name the
        unscoped ids."""
        self._check_open()
        check_take_overs(requests)
        if not isinstance(self.store, TakesOverMany):
            return await take_over_each(self.take_over, requests)
        scoped = [([self._scope_envelope(e) for e in envs], fence) for envs, fence in requests]
        found = await self._call(self.store.take_over_many(scoped))
        return [None if err is None else self._tenant_error(err) for err in found]

    async def read(
        self, execution_id: str, *, from_sequence: int = 0, limit: int | None = None
    ) -> list[Envelope]:
        """The tenant's envelopes of ``execution_id`` with its own (unscoped) ids."""
        envelopes = await self._call(
            self.store.read(self._scope(execution_id), from_sequence=from_sequence, limit=limit)
        )
        return [self._unscope_envelope(e) for e in envelopes]

    async def last_sequence(self, execution_id: str) -> int:
        """See :meth:`loom.storage.EventStore.last_sequence`."""
        return await self._call(self.store.last_sequence(self._scope(execution_id)))

    async def acquire_fence(self, execution_id: str) -> int:
        """See :meth:`loom.storage.EventStore.acquire_fence` (fences are per tenant)."""
        self._check_open()
        return await self._call(self.store.acquire_fence(self._scope(execution_id)))

    async def current_fence(self, execution_id: str) -> int:
        """See :meth:`loom.storage.EventStore.current_fence`."""
        return await self._call(self.store.current_fence(self._scope(execution_id)))

    async def iterate_execution_ids(
        self, *, after: str | None = None, page_size: int = 256
    ) -> AsyncIterator[str]:
        """The tenant's execution ids (unscoped), ascending, paging by ``after``."""
        start = self._scope(after) if after is not None else self.tenant + _BEFORE_SEPARATOR
        ids = self.store.iterate_execution_ids(after=start, page_size=page_size)
        try:
            async for scoped in ids:
                if scoped.startswith(self._prefix):
                    yield scoped[len(self._prefix) :]
                elif scoped > self._prefix:
                    return  # past the tenant's range: every later id belongs to others
        finally:
            aclose = getattr(ids, "aclose", None)
            if aclose is not None:
                await aclose()

    async def wait_for_append(
        self, execution_id: str, after_sequence: int, *, timeout: float | None = None
    ) -> int:
        """See :meth:`loom.storage.EventStore.wait_for_append`."""
        return await self._call(
            self.store.wait_for_append(self._scope(execution_id), after_sequence, timeout=timeout)
        )

    async def close(self) -> None:
        """Close this view (and the physical store only if ``close_store``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.close_store:
            await self.store.close()

    # ---------------------------------------------------------------- ExecutionIndex

    def _index(self) -> ExecutionIndex:
        if not isinstance(self.store, ExecutionIndex):
            raise ConfigurationError(f"{self.store!r} keeps no execution index")
        return self.store

    def _unscope_summary(self, summary: ExecutionSummary) -> ExecutionSummary:
        return dataclasses.replace(summary, execution_id=self._unscope(summary.execution_id))

    def _scoped_query(self, query: ExecutionQuery) -> ExecutionQuery:
        cursor = query.cursor
        if cursor is not None:
            created, execution_id = decode_page_cursor(cursor)
            cursor = f"{created!r}|{self._scope(execution_id)}"
        return dataclasses.replace(query, id_prefix=self._scope(query.id_prefix), cursor=cursor)

    def _visible(self, query: ExecutionQuery, summary: ExecutionSummary) -> bool:
        # id_contains ran on the scoped id; a match that spans the tenant prefix is not one.
        return not query.id_contains or query.id_contains in summary.execution_id

    async def list_executions(self, query: ExecutionQuery) -> ExecutionPage:
        """The tenant's executions only (see :meth:`loom.storage.ExecutionIndex`)."""
        page = await self._call(self._index().list_executions(self._scoped_query(query)))
        items = [self._unscope_summary(s) for s in page.items]
        next_cursor = None if page.next_cursor is None else encode_page_cursor(items[-1])
        return ExecutionPage([s for s in items if self._visible(query, s)], next_cursor)

    async def count_executions(self, query: ExecutionQuery) -> int:
        """How many of the tenant's executions match ``query``."""
        if query.id_contains:
            count, cursor = 0, None
            while True:
                page = await self.list_executions(
                    dataclasses.replace(query, limit=1000, cursor=cursor)
                )
                count += len(page.items)
                if page.next_cursor is None:
                    return count
                cursor = page.next_cursor
        return await self._call(self._index().count_executions(self._scoped_query(query)))

    async def get_summary(self, execution_id: str) -> ExecutionSummary | None:
        """The summary of the tenant's execution, or None."""
        found = await self._call(self._index().get_summary(self._scope(execution_id)))
        return None if found is None else self._unscope_summary(found)

    async def changes(
        self, after: int, limit: int = 100, *, id_prefix: str = ""
    ) -> list[ExecutionSummary]:
        """The tenant's changes after the (store-wide) cursor ``after``."""
        found = await self._call(
            self._index().changes(after, limit, id_prefix=self._scope(id_prefix))
        )
        return [self._unscope_summary(s) for s in found]

    async def wait_for_changes(self, after: int, *, timeout: float | None = None) -> int:
        """Wait for a change anywhere in the store (cursors are store-wide positions): a
        feed reader re-queries :meth:`changes`, which shows only the tenant's."""
        return await self._call(self._index().wait_for_changes(after, timeout=timeout))

    # ---------------------------------------------------------------- SnapshotStore

    def _snapshot_store(self) -> SnapshotStore:
        if self._snapshots is None:
            raise ConfigurationError(
                f"{type(self.store).__name__} keeps no snapshots; wrap a Store to use them"
            )
        return self._snapshots

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Save a snapshot of the tenant's execution (its state is stored as given)."""
        self._check_open()
        store = self._snapshot_store()
        scoped = Snapshot(self._scope(snapshot.execution_id), snapshot.sequence, snapshot.state)
        await self._call(store.save_snapshot(scoped))

    async def save_snapshot_segment(self, segment: Snapshot, base: int) -> bool:
        """Save a segment of the tenant's snapshot (see
        :meth:`loom.storage.SnapshotSegments.save_snapshot_segment`); False when the wrapped
        store keeps whole snapshots only."""
        self._check_open()
        store = self._snapshot_store()
        if not isinstance(store, SnapshotSegments):
            return False
        scoped = Snapshot(self._scope(segment.execution_id), segment.sequence, segment.state)
        return bool(await self._call(store.save_snapshot_segment(scoped, base)))

    async def load_snapshot(self, execution_id: str) -> Snapshot | None:
        """The tenant's newest snapshot of ``execution_id``, or None."""
        snap = await self._call(self._snapshot_store().load_snapshot(self._scope(execution_id)))
        if snap is None:
            return None
        return Snapshot(execution_id, snap.sequence, snap.state, snap.chain)

    async def load_many(self, execution_ids: Sequence[str]) -> dict[str, StoredExecution]:
        """See :meth:`loom.storage.LoadsMany.load_many`: one read of the physical store
        where it loads many too, else one execution at a time."""
        if not isinstance(self.store, LoadsMany):
            return await self._load_one_by_one(execution_ids)
        scoped = await self._call(self.store.load_many([self._scope(i) for i in execution_ids]))
        loaded: dict[str, StoredExecution] = {}
        for key, one in scoped.items():
            eid = self._unscope(key)
            snap = one.snapshot
            loaded[eid] = StoredExecution(
                eid,
                None if snap is None else Snapshot(eid, snap.sequence, snap.state, snap.chain),
                [self._unscope_envelope(e) for e in one.events],
                one.last_sequence,
            )
        return loaded

    async def _load_one_by_one(self, execution_ids: Sequence[str]) -> dict[str, StoredExecution]:
        loaded: dict[str, StoredExecution] = {}
        for eid in dict.fromkeys(execution_ids):
            snap = None if self._snapshots is None else await self.load_snapshot(eid)
            last = await self.last_sequence(eid)
            if last < 0:
                continue
            events = await self.read(eid, from_sequence=0 if snap is None else snap.sequence + 1)
            # Read after last_sequence: events appended in between extend it.
            last = max(last, events[-1].sequence) if events else last
            loaded[eid] = StoredExecution(eid, snap, events, last)
        return loaded

    # ---------------------------------------------------------------- LeaseStore

    def _lease_store(self) -> LeaseStore:
        if not isinstance(self.store, LeaseStore):
            raise ConfigurationError(f"{type(self.store).__name__} keeps no leases")
        return self.store

    async def renew_lease(
        self, execution_id: str, *, holder: str, fence: int, expires_at: float
    ) -> bool:
        """Renew the lease of the tenant's execution."""
        self._check_open()
        return await self._call(
            self._lease_store().renew_lease(
                self._scope(execution_id), holder=holder, fence=fence, expires_at=expires_at
            )
        )

    async def release_lease(self, execution_id: str, *, holder: str) -> None:
        """Release the lease of the tenant's execution."""
        await self._call(
            self._lease_store().release_lease(self._scope(execution_id), holder=holder)
        )

    async def lease_expiry(self, execution_id: str) -> float | None:
        """When the lease of the tenant's execution expires."""
        return await self._call(self._lease_store().lease_expiry(self._scope(execution_id)))

    # ---------------------------------------------------------------- TimerStore

    def _timer_store(self) -> TimerStore:
        if not isinstance(self.store, TimerStore):
            raise ConfigurationError(
                f"{type(self.store).__name__} keeps no timers; wrap a TimerStore to use them"
            )
        return self.store

    def _scope_timer(self, timer: Timer) -> Timer:
        return dataclasses.replace(timer, execution_id=self._scope(timer.execution_id))

    async def schedule_timer(self, timer: Timer) -> None:
        """Schedule a timer of the tenant's execution."""
        self._check_open()
        await self._call(self._timer_store().schedule_timer(self._scope_timer(timer)))

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
        """Claim only this tenant's due timers (ids unscoped); ``prefix`` is the tenant's."""
        self._check_open()
        claimed = await self._call(
            self._timer_store().claim_due_timers(
                now,
                owner=owner,
                lease=lease,
                limit=limit,
                prefix=self._prefix + prefix,
                flow_ids=flow_ids,
            )
        )
        return [dataclasses.replace(t, execution_id=self._unscope(t.execution_id)) for t in claimed]

    async def complete_timer(self, timer: Timer) -> None:
        """Delete a fired timer of the tenant's execution."""
        await self._call(self._timer_store().complete_timer(self._scope_timer(timer)))

    async def complete_timers(self, timers: Sequence[Timer]) -> None:
        """Delete many fired timers of the tenant's executions in one write."""
        scoped = [self._scope_timer(t) for t in timers]
        await self._call(self._timer_store().complete_timers(scoped))

    async def cancel_timers(self, execution_id: str) -> int:
        """Delete the pending timers of the tenant's execution."""
        return await self._call(self._timer_store().cancel_timers(self._scope(execution_id)))

    async def next_timer_due(self, prefix: str = "") -> float | None:
        """The earliest due time among this tenant's timers."""
        return await self._call(self._timer_store().next_timer_due(self._prefix + prefix))

    # ---------------------------------------------------------------- BlobStore

    def _blob_store(self) -> BlobStore:
        if not isinstance(self.store, BlobStore):
            raise ConfigurationError(
                f"{type(self.store).__name__} keeps no blobs; wrap a BlobStore to use them"
            )
        return self.store

    async def append_with_blobs(
        self, envelopes: Sequence[Envelope], blobs: Mapping[str, bytes], *, namespace: str = ""
    ) -> None:
        """Append the tenant's envelopes with the blobs they name (in the tenant's namespace)."""
        self._check_open()
        scoped = [self._scope_envelope(e) for e in envelopes]
        inner = self.store
        if isinstance(inner, AppendsWithBlobs):
            await self._call(
                inner.append_with_blobs(scoped, blobs, namespace=self._prefix + namespace)
            )
            return
        await self.put_blobs(blobs, namespace=namespace)
        await self._call(inner.append(scoped))

    async def put_blobs(self, blobs: Mapping[str, bytes], *, namespace: str = "") -> None:
        """Store blobs in the tenant's own namespace (never shared with another tenant)."""
        self._check_open()
        await self._call(self._blob_store().put_blobs(blobs, namespace=self._prefix + namespace))

    async def get_blobs(self, hashes: Iterable[str], *, namespace: str = "") -> dict[str, bytes]:
        """The tenant's stored blobs among ``hashes``."""
        return await self._call(
            self._blob_store().get_blobs(hashes, namespace=self._prefix + namespace)
        )

    # ---------------------------------------------------------------- MailboxStore

    def _mailbox(self) -> MailboxStore | None:
        return self.store if isinstance(self.store, MailboxStore) else None

    async def put_message(self, message: Message) -> Message:
        self._check_open()
        mailbox = self._mailbox()
        if mailbox is None:
            raise ConfigurationError(
                f"the store under tenant {self.tenant!r} keeps no mailbox",
                execution_id=message.execution_id,
                hint="Use a store that implements MailboxStore (memory, SQLite, PostgreSQL)",
            )
        scoped = dataclasses.replace(message, execution_id=self._scope(message.execution_id))
        stored = await self._call(mailbox.put_message(scoped))
        return dataclasses.replace(stored, execution_id=self._unscope(stored.execution_id))

    async def pending_messages(
        self, execution_id: str, event_type: str, *, limit: int = 100
    ) -> list[Message]:
        mailbox = self._mailbox()
        if mailbox is None:
            return []  # a store without a mailbox holds no messages
        found = await self._call(
            mailbox.pending_messages(self._scope(execution_id), event_type, limit=limit)
        )
        return [dataclasses.replace(m, execution_id=self._unscope(m.execution_id)) for m in found]

    async def consume_message(self, execution_id: str, message_id: str) -> None:
        mailbox = self._mailbox()
        if mailbox is not None:
            await self._call(mailbox.consume_message(self._scope(execution_id), message_id))

    # ---------------------------------------------------------------- BranchRegistry

    def _registry(self) -> BranchRegistry:
        if not isinstance(self.store, BranchRegistry):
            raise ConfigurationError(f"{self.store!r} keeps no branch refs")
        return self.store

    def _scope_ref_name(self, name: str) -> str:
        check_ref_name(name, scoped=False)
        return self._scope(name)

    def _unscope_ref(self, ref: BranchRef) -> BranchRef:
        def own(key: str | None) -> str | None:
            return None if key is None else self._unscope(key)

        return dataclasses.replace(
            ref,
            name=self._unscope(ref.name),
            execution_id=self._unscope(ref.execution_id),
            forked_from=own(ref.forked_from),
            promoted_from=own(ref.promoted_from),
        )

    async def _ref_call(self, aw: Awaitable[T]) -> T:
        try:
            return await self._call(aw)
        except BranchError as err:
            # Refusals name refs and executions by their scoped keys: the tenant's own.
            message = err.message.replace(f"'{self._prefix}", "'")
            hint = None if err.hint is None else err.hint.replace(self._prefix, "")
            details = dict(err.details)
            if isinstance(details.get("ref"), str):
                details["ref"] = details["ref"].removeprefix(self._prefix)
            for key in ("expected", "actual"):
                value = details.get(key)
                if isinstance(value, list):
                    details[key] = [
                        v.removeprefix(self._prefix) if isinstance(v, str) else v for v in value
                    ]
            eid = None if err.execution_id is None else err.execution_id.removeprefix(self._prefix)
            error = type(err)(message, execution_id=eid, hint=hint, **details)
        raise error

    async def put_ref(
        self,
        name: str,
        execution_id: str,
        tip: int,
        *,
        forked_from: str | None = None,
        fork_sequence: int | None = None,
    ) -> BranchRef:
        """A ref of the tenant's, on one of its executions (see ``BranchRegistry``)."""
        self._check_open()
        check_target(execution_id)
        ref = await self._ref_call(
            self._registry().put_ref(
                self._scope_ref_name(name),
                self._scope(execution_id),
                tip,
                forked_from=None if forked_from is None else self._scope(forked_from),
                fork_sequence=fork_sequence,
            )
        )
        return self._unscope_ref(ref)

    async def get_ref(self, name: str) -> BranchRef | None:
        """The tenant's ref, or None."""
        ref = await self._ref_call(self._registry().get_ref(self._scope_ref_name(name)))
        return None if ref is None else self._unscope_ref(ref)

    async def move_tip(self, name: str, sequence: int, *, expected: int) -> BranchRef:
        """Compare-and-swap the tenant's ref's tip (see ``BranchRegistry``)."""
        self._check_open()
        ref = await self._ref_call(
            self._registry().move_tip(self._scope_ref_name(name), sequence, expected=expected)
        )
        return self._unscope_ref(ref)

    async def promote(
        self, from_ref: str, to_ref: str, *, by: str, reason: str | None = None
    ) -> BranchRef:
        """Fast-forward one of the tenant's refs onto another (see ``BranchRegistry``)."""
        self._check_open()
        ref = await self._ref_call(
            self._registry().promote(
                self._scope_ref_name(from_ref), self._scope_ref_name(to_ref), by=by, reason=reason
            )
        )
        return self._unscope_ref(ref)

    async def list_refs(self, prefix: str = "") -> list[BranchRef]:
        """The tenant's refs whose names start with ``prefix``."""
        refs = await self._ref_call(self._registry().list_refs(self._scope(prefix)))
        return [self._unscope_ref(r) for r in refs]

    async def children(self, execution_id: str) -> list[ExecutionSummary]:
        """The tenant's executions forked from ``execution_id``, recursively."""
        return await lineage(self, execution_id)

    def __repr__(self) -> str:
        return f"TenantScopedEventStore({self.store!r}, tenant={self.tenant!r})"
