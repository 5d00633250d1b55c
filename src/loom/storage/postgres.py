"""PostgresStore: the multi-node store (several processes and hosts over one database).

* Every invariant is enforced by the database, never by process memory: an append is one
  fence-guarded ``UPDATE heads ... WHERE fence = %s AND next_sequence = %s`` (0 rows -> the head
  is read and :func:`refusal_for` names the exact refusal), explicit envelope ids are a
  partial ``UNIQUE`` index (a derived id is stored empty: the primary key makes it unique),
  fences are an atomic ``INSERT ... ON CONFLICT DO UPDATE SET fence = fence + 1``.
* Writes are group-committed in pipeline mode; a connection lost while committing is resolved
  by asking the database (``loom.storage._postgres_commit``).
* ``wait_for_append`` is woken by ``pg_notify`` inside the append transaction, received on a
  dedicated ``LISTEN`` connection that reconnects by itself; a slow poll is only a safety net
  (``loom.storage._postgres_listen``). An append notifies only when its head is marked watched
  or when it starts an execution: the first ``wait_for_append`` of an execution from any
  store (another process's, or this one's) marks it for good, so the steps of an execution
  that no one ever waited for through the store pay no notify.
* Timers (the ``TimerStore`` side) are rows claimed with one ``UPDATE ... WHERE (id, position)
  IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING``: many timer services over one database
  never claim the same timer at once, and a claim expires after its lease.
* The schema lives in its own PostgreSQL schema (``schema="loom"``), versioned in a ``meta``
  table and created or migrated in one transaction under an advisory lock, so several processes
  may open it at once. A database written by a newer Loom is refused (``SchemaVersionError``);
  the statements and migrations are in ``loom.storage._postgres_sql``.

A store is bound to the event loop that opened it (its pool is an asyncio pool).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from loom import faults
from loom._settings import seconds_setting
from loom.errors import (
    ConfigurationError,
    LoomError,
    PayloadError,
    StorageError,
    StorageWriteError,
)
from loom.model import (
    DEFAULT_LIMITS,
    Envelope,
    EventType,
    ExecutionSummary,
    PayloadLimits,
    decode_json,
    encode_json,
    summary_change,
)
from loom.storage._blobs import check_blobs, check_hashes
from loom.storage._common import (
    SNAPSHOT_LIMITS,
    TERMINAL_TYPES,
    Waiters,
    batch_head,
    check_reserved,
    check_snapshot,
    check_take_over,
    check_take_overs,
    check_timer,
    decode_envelope,
    decode_snapshot,
    ended,
    merge_segments,
    plain_record,
    segment_checksum,
    snapshot_checksum,
    take_over_refusal,
)
from loom.storage._index import (
    FEED_KEY,
    SUMMARY_COLUMNS,
    encode_page_cursor,
    summary_from_row,
    where_clause,
)
from loom.storage._loads import add_beyond, assemble, chunks, postgres_load_many
from loom.storage._postgres_branches import PostgresBranches
from loom.storage._postgres_commit import PostgresWrite, PostgresWriter, WriteKind
from loom.storage._postgres_lean import LONE_WAIT, PlainAppend, forget_prepared
from loom.storage._postgres_listen import NotifyListener
from loom.storage._postgres_sql import (
    MAX_NOTE_BYTES,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    Conn,
    EventWriteKind,
    IndexWrite,
    check_schema,
    cursor_lock_key,
    load_reserved,
    migrate,
    notify_channel,
    statements,
)
from loom.storage._spi import (
    ExecutionPage,
    ExecutionQuery,
    Message,
    Snapshot,
    StoredExecution,
    TakeOver,
    Timer,
)

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

T = TypeVar("T")

#: How many executions a store remembers having marked watched (see _watch_last).
_WATCHED_KEPT = 100_000
#: Seconds a waiter's mark waits at most for the head's row lock (see _watch_last).
_MARK_LOCK_WAIT = 1.0


def _storable(value: str, what: str) -> None:
    # PostgreSQL text cannot hold NUL, and a lone surrogate cannot be sent as UTF-8: refuse
    # both before the write is queued, so one bad request never reaches a shared batch.
    if "\x00" in value:
        raise PayloadError(f"{what} contains a NUL character, which PostgreSQL cannot store")
    if value.isascii():  # O(1) in CPython, and ASCII text always encodes: the usual case
        return
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise PayloadError(f"{what} is not valid UTF-8 text: {exc}") from exc


_json_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _json_rows(rows: Iterable[list[Any]]) -> str:
    """``rows`` as one JSON array of arrays: a statement's rows as a single text parameter
    (see ``_TAKE_OVER_MANY``). Every text in them passed ``_storable``, so it is valid UTF-8
    without NUL, which ``jsonb`` refuses."""
    return _json_encoder.encode(list(rows))


def _storable_text(value: str) -> bool:
    """Whether PostgreSQL text can hold ``value`` (a value it cannot hold was never stored)."""
    try:
        _storable(value, "value")
    except PayloadError:
        return False
    return True


class PostgresStore(PostgresBranches):
    """The event, snapshot, fence and timer store over PostgreSQL (psycopg 3, an asyncio pool).

    The constructor only records settings; the pool opens (and the schema is created or
    checked) on first use, or eagerly with ``await PostgresStore.open(dsn)``, which also fails
    fast when the server is unreachable. Close it with ``await store.close()`` or use
    ``async with``.

    ``group_commit=False`` gives every write its own transaction (one connection each, up to
    ``pool_max`` at once). ``schema`` isolates one Loom database from another in the same
    PostgreSQL database (tests use a fresh schema each and :meth:`drop_schema` afterwards).

    ``notify=False`` leaves ``pg_notify`` out of appends: PostgreSQL serialises the commits of
    all notifying transactions in a database (a lock held through the commit's WAL flush),
    which caps many *uncoalesced* writers; ``wait_for_append`` then polls every
    ``poll_interval``. With group commit one notification covers a whole batch.

    ``spin_wait`` (seconds, at most 0.002; default 0: off) lets a lone write (one execution
    stepping, nothing else ready on the event loop) spin on its socket for its answer that
    long before it sleeps in ``poll()``. It trades a busy core for the process's wake-up after
    each commit: on a 2-core VM a step took ~25% less wall time (``python -m bench.pg_step``,
    its ``spinning`` rows), at about twice the client CPU. A batch's round trip never spins.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "loom",
        pool_min: int = 1,
        pool_max: int = 10,
        group_commit: bool = True,
        max_batch: int = 512,
        max_inflight_batches: int = 2,
        connect_timeout: float = 10.0,
        resolve_timeout: float = 15.0,
        poll_interval: float = 0.05,
        safety_poll_interval: float = 1.0,
        notify: bool = True,
        limits: PayloadLimits = DEFAULT_LIMITS,
        read_only: bool = False,
        spin_wait: float = 0.0,
    ) -> None:
        if not SCHEMA_NAME.fullmatch(schema):
            raise ConfigurationError(
                f"schema must be a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most 63 "
                f"characters), not {schema!r}"
            )
        if pool_min < 0 or pool_max < max(1, pool_min):
            raise ConfigurationError(
                f"need 0 <= pool_min <= pool_max >= 1 (got {pool_min}, {pool_max})"
            )
        if max_batch < 1 or max_inflight_batches < 1:
            raise ConfigurationError("max_batch and max_inflight_batches must be at least 1")
        connect_timeout = seconds_setting(connect_timeout, "PostgresStore connect_timeout")
        resolve_timeout = seconds_setting(resolve_timeout, "PostgresStore resolve_timeout")
        poll_interval = seconds_setting(poll_interval, "PostgresStore poll_interval")
        safety_poll_interval = seconds_setting(
            safety_poll_interval, "PostgresStore safety_poll_interval"
        )
        spin_wait = seconds_setting(spin_wait, "PostgresStore spin_wait", zero_ok=True)
        if spin_wait > LONE_WAIT:
            raise ConfigurationError(
                f"PostgresStore spin_wait must be at most {LONE_WAIT} s (got {spin_wait}): a "
                "lone write holds the event loop no longer than that",
                hint="Use spin_wait=0.001, or leave it at 0 (no spinning)",
            )
        self.spin_wait = spin_wait
        self.dsn = dsn
        self.schema = schema
        self.pool_min = pool_min
        self.pool_max = pool_max
        self.group_commit = group_commit
        self.max_batch = max_batch if group_commit else 1
        # Without coalescing every write is its own transaction: as many at once as connections.
        self.max_inflight_batches = max_inflight_batches if group_commit else pool_max
        self.connect_timeout = connect_timeout
        self.resolve_timeout = resolve_timeout
        self.poll_interval = poll_interval
        self.safety_poll_interval = safety_poll_interval
        self.limits = limits
        self.notify = notify
        self.read_only = read_only
        self._sql = statements(schema, notify=notify)
        self._plain_sql = self._sql.events("append", one=True)
        self._plain_lean = PlainAppend(self._plain_sql, notify_channel(schema))
        #: Derived ids a log written before schema rung 10 already holds (nearly always none).
        self._reserved: frozenset[str] = frozenset()
        self._load_many_sql = postgres_load_many(f'"{schema}"')
        self._channel = notify_channel(schema)
        self._cursor_lock = cursor_lock_key(schema)
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open_lock = asyncio.Lock()
        self._closed = False
        self._waiters = Waiters()
        self._writer = PostgresWriter(
            dsn=dsn,
            schema=schema,
            sql=self._sql,
            pool=lambda: self._pool,
            closed=lambda: self._closed,
            waiters=self._waiters,
            where=self._where(),
            group_commit=group_commit,
            max_batch=self.max_batch,
            max_inflight=self.max_inflight_batches,
            resolve_timeout=resolve_timeout,
            spin_wait=spin_wait,
        )
        self._waiting: Counter[str] = Counter()
        self._listener = NotifyListener(
            dsn,
            self._channel,
            connect_timeout=connect_timeout,
            waiters=self._waiters,
            waiting=self._waiting,
        )
        self._listening = self._listener.listening
        #: Executions this store has marked watched (rung 11): the mark is never cleared, so
        #: a later wait of the same execution reads its tail plainly (see _watch_last).
        self._watched: set[str] = set()

    # ---------------------------------------------------------------- opening

    @classmethod
    async def open(cls, dsn: str, **options: Any) -> PostgresStore:
        """Build a store, connect its pool and create or check its schema now.

        Raises ``StorageError`` if the server is unreachable within ``connect_timeout`` and
        ``SchemaVersionError`` if the schema was written by a newer Loom.
        """
        store = cls(dsn, **options)
        try:
            await store._ensure_open()
        except BaseException:
            await store.close()
            raise
        return store

    async def __aenter__(self) -> PostgresStore:
        await self._ensure_open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _where(self) -> str:
        """The server and database for messages (never the password)."""
        try:
            info = conninfo_to_dict(self.dsn)
        except psycopg.Error:
            return f"schema {self.schema!r}"
        host = info.get("host", "localhost")
        return f"{host}:{info.get('port', 5432)}/{info.get('dbname', '')} schema {self.schema!r}"

    async def _ensure_open(self) -> AsyncConnectionPool[Conn]:
        pool = self._pool
        if pool is not None:
            if asyncio.get_running_loop() is not self._loop:
                raise ConfigurationError(
                    "this PostgresStore is bound to the event loop that opened it; open one "
                    "store per event loop"
                )
            return pool
        if self._closed:
            raise StorageWriteError(f"the PostgreSQL store ({self._where()}) is closed")
        async with self._open_lock:
            if self._pool is None:
                self._pool = await self._connect()
                self._loop = asyncio.get_running_loop()
        return self._pool

    async def _connect(self) -> AsyncConnectionPool[Conn]:
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self.dsn,
            min_size=self.pool_min,
            max_size=self.pool_max,
            kwargs={"autocommit": True, "connect_timeout": max(1, round(self.connect_timeout))},
            open=False,
            timeout=self.connect_timeout,
            name=f"loom-{self.schema}",
        )
        try:
            await pool.open(wait=self.pool_min > 0, timeout=self.connect_timeout)
            async with pool.connection(timeout=self.connect_timeout) as conn:
                if self.read_only:
                    await check_schema(conn, self.schema, self._where())
                else:
                    await migrate(conn, self.schema, self._where())
                    self._reserved = await load_reserved(conn, self.schema)
        except psycopg.Error as exc:
            await pool.close()
            raise StorageError(
                f"cannot open the PostgreSQL store at {self._where()}: {exc}",
                hint="Check that the server is running and the DSN is right",
            ) from exc
        except BaseException:
            await pool.close()
            raise
        return pool

    @classmethod
    async def drop_schema(cls, dsn: str, schema: str = "loom") -> None:
        """Drop a store's schema and everything in it (tests; decommissioning). Idempotent."""
        if not SCHEMA_NAME.fullmatch(schema):
            raise ConfigurationError(f"not a Loom schema name: {schema!r}")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    def _writable(self) -> None:
        if self.read_only:
            raise StorageWriteError(
                f"the PostgreSQL store ({self._where()}) was opened read-only; nothing was written",
                hint="Open it without read_only=True to write",
            )

    # ---------------------------------------------------------------- reads

    async def _fetch(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        async def read(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            try:
                cur = await conn.execute(sql, params)
            except psycopg.errors.InvalidSqlStatementName:
                # Its prepared statements were dropped behind psycopg's back (a pooler's
                # DISCARD ALL): psycopg would keep naming them on this connection. Reads are
                # idempotent; this one runs again, prepared again when it is due.
                await forget_prepared(conn)
                cur = await conn.execute(sql, params)
            return await cur.fetchall()

        return await self._retried(read, "read failed")

    async def _retried(
        self,
        run: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        what: str,
        execution_id: str | None = None,
    ) -> T:
        """``run`` on a pooled connection, once more if that connection turns out dead: for
        work that may safely run twice (a read; a waiter's mark). Once the pool has replaced
        the connections that died while idle (server restart, terminated sessions), one retry
        hides the loss. Any other failure is a :class:`StorageError` saying ``what``."""
        pool = await self._ensure_open()
        for attempt in (1, 2):
            try:
                async with pool.connection() as conn:
                    return await run(conn)
            except psycopg.OperationalError as exc:
                check = self._writer.check_pool()
                if attempt == 2 or isinstance(exc, PoolTimeout | psycopg.errors.QueryCanceled):
                    raise StorageError(
                        f"PostgreSQL store ({self.schema}): {what}: {exc}",
                        execution_id=execution_id,
                    ) from exc
                if check is not None:
                    await asyncio.shield(check)
            except psycopg.Error as exc:
                raise StorageError(
                    f"PostgreSQL store ({self.schema}): {what}: {exc}", execution_id=execution_id
                ) from exc
        raise AssertionError("unreachable")

    # ---------------------------------------------------------------- EventStore

    async def append(self, envelopes: Sequence[Envelope]) -> None:
        """See :meth:`loom.storage.EventStore.append`."""
        if len(envelopes) == 1 and not self._reserved and plain_record(envelopes[0]):
            env = envelopes[0]
            lean = self._plain_values(env)  # checked (and refused) before anything is sent
            if (
                lean is not None
                and self._pool is not None
                and asyncio.get_running_loop() is self._loop
                and await self._writer.append_alone(
                    env.execution_id, lean, lambda: self._plain_append(env, lean), self._loop
                )
            ):
                return
            await self._submit(self._plain_append(env, lean))
            return
        _, first, fence = batch_head(envelopes)
        await self._write_events("append", envelopes, first, fence)

    def _plain_values(
        self, env: Envelope
    ) -> tuple[bytes, list[bytes | None], tuple[int, ...]] | None:
        """The checks of one plain record's write (see :meth:`_plain_append`), then its
        statement's lean values (None: a text holds a NUL, for psycopg to refuse)."""
        self._writable()
        execution_id = env.execution_id
        _storable(execution_id, "execution id")  # its derived envelope id holds nothing else
        payload = env.payload_json
        _storable(payload, "payload")
        kind = env.type
        if type(kind) is not EventType:  # an extension's name: any text
            _storable(kind, "event type")
        return self._plain_lean.values(
            execution_id,
            env.sequence,
            env.fence,
            kind in TERMINAL_TYPES,
            kind,
            payload,
            env.recorded_at,
            env.checksum(),
        )

    def _plain_append(
        self, env: Envelope, lean: tuple[bytes, list[bytes | None], tuple[int, ...]] | None
    ) -> PostgresWrite:
        """The write of one plain record (see ``plain_record``: a step's, say), as
        :meth:`_write_events` builds it, without the cases a plain record cannot have (an id
        of its own, several rows, an index row, blobs, reserved ids): what one execution
        stepping pays on every step. ``lean``: what :meth:`_plain_values` made of it (which
        checked it)."""
        execution_id = env.execution_id
        payload = env.payload_json
        kind = env.type
        first = env.sequence
        checksum = env.checksum()
        ends = kind in TERMINAL_TYPES
        return PostgresWrite(
            kind="append",
            execution_id=execution_id,
            sql=self._plain_sql,
            params={
                "eid": execution_id,
                "fence": env.fence,
                "first": first,
                "end": first + 1,
                "ends": ends,
                "channel": self._channel,
                "note": execution_id if len(execution_id.encode()) <= MAX_NOTE_BYTES else "",
                "id": "",  # its derived id, stored empty (schema rung 10)
                "type": str(kind),
                "payload": payload,
                "at": env.recorded_at,
                "sum": checksum,
            },
            first=first,
            fence=env.fence,
            count=1,
            probe=(first, [""], [checksum]),
            lean=lean,
        )

    async def take_over(self, envelopes: Sequence[Envelope], *, from_fence: int) -> None:
        """See :meth:`loom.storage.EventStore.take_over`.

        One statement, like an append: ``UPDATE heads SET fence = from_fence + 1 ... WHERE
        fence = from_fence AND next_sequence = first`` (from fence 0: an ``INSERT ... ON
        CONFLICT DO NOTHING`` of the head), the events inserted from its returned row; a racer
        that lost moves nothing and writes nothing.
        """
        _, first = check_take_over(envelopes, from_fence)
        await self._write_events("take_over", envelopes, first, from_fence)

    async def take_over_many(self, requests: Sequence[TakeOver]) -> list[LoomError | None]:
        """See :meth:`loom.storage.TakesOverMany.take_over_many`: one statement (so one
        transaction, coalesced with whatever else is being written) for every request whose
        index row changes a status or nothing; any other (rare) is taken over on its own."""
        self._writable()
        heads = check_take_overs(requests)
        outcomes: list[LoomError | None] = [None] * len(requests)
        batched: list[int] = []
        alone: list[int] = []
        changes = []
        for i, (envelopes, _) in enumerate(requests):
            _storable(heads[i][0], "execution id")
            if self._reserved:
                check_reserved(envelopes, self._reserved)
            for e in envelopes:
                _storable(e.envelope_id, "envelope id")
                _storable(e.payload_json, "payload")
                if type(e.type) is not EventType:  # an extension's name: any text
                    _storable(e.type, "event type")
            change = summary_change(envelopes)
            if change is not None and (change.started or change.status is None):
                alone.append(i)
            else:
                if change is not None:
                    _storable(change.waiting_for or "", "summary field")
                    _storable(change.forked_from or "", "summary field")
                batched.append(i)
                changes.append(change)
        if alone:
            await asyncio.gather(*(self._take_over_alone(requests[i], outcomes, i) for i in alone))
        if not batched:
            return outcomes
        # In id order: the statement locks the heads in that order (see _TAKE_OVER_MANY).
        order = sorted(range(len(batched)), key=lambda k: heads[batched[k]][0])
        batched = [batched[k] for k in order]
        changes = [changes[k] for k in order]
        eids = [heads[i][0] for i in batched]
        probes: list[tuple[str, int, list[str], list[str]]] = []
        rows: list[list[Any]] = []
        for i in batched:
            envelopes = requests[i][0]
            eid, first = heads[i]
            # A derived id is stored empty (schema rung 10), as on every other write path.
            ids = [
                "" if e.envelope_id == f"{eid}#{e.sequence}.{e.fence}" else e.envelope_id
                for e in envelopes
            ]
            sums = [e.checksum() for e in envelopes]
            probes.append((eid, first, ids, sums))
            rows.extend(
                [eid, e.sequence, i, str(e.type), e.payload_json, e.recorded_at, e.fence, c]
                for e, i, c in zip(envelopes, ids, sums, strict=True)
            )
        indexed = [c for c in changes if c is not None]
        params: dict[str, Any] = {
            "heads": _json_rows(
                [
                    eid,
                    requests[i][1],
                    first,
                    first + len(requests[i][0]),
                    requests[i][0][-1].type in TERMINAL_TYPES,
                ]
                for (eid, first, _, _), i in zip(probes, batched, strict=True)
            ),
            "events": _json_rows(rows),
            "index": _json_rows(
                [
                    c.execution_id,
                    c.status.value if c.status is not None else None,
                    c.waiting_for,
                    c.forked_from,
                    c.updated_at,
                ]
                for c in indexed
            ),
            "indexed": bool(indexed),
            "lock": self._cursor_lock,
            "channel": self._channel,
            "feed": FEED_KEY,
            "note_max": MAX_NOTE_BYTES,
        }
        req = PostgresWrite(
            kind="take_over_many",
            execution_id=eids[0],
            sql=self._sql.take_over_many,
            params=params,
            cursor_lock=self._cursor_lock if indexed else None,
            # The ids as stored: a lost COMMIT's probe matches the rows themselves.
            probe_many=probes,
        )
        try:
            moved = set(await self._submit(req))
        except StorageWriteError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                raise
            # An envelope id already stored: the statement wrote nothing. One at a time, so
            # that only the request carrying it is refused.
            await asyncio.gather(
                *(self._take_over_alone(requests[i], outcomes, i) for i in batched)
            )
            return outcomes
        if moved:
            self._waiters.notify(sorted(moved))
        refused = [i for i in batched if heads[i][0] not in moved]
        if refused:
            await self._name_refusals(requests, heads, refused, outcomes)
        return outcomes

    async def _take_over_alone(
        self, request: TakeOver, outcomes: list[LoomError | None], i: int
    ) -> None:
        try:
            await self.take_over(request[0], from_fence=request[1])
        except LoomError as refusal:
            outcomes[i] = refusal

    async def _name_refusals(
        self,
        requests: Sequence[TakeOver],
        heads: list[tuple[str, int]],
        refused: list[int],
        outcomes: list[LoomError | None],
    ) -> None:
        """Why each of ``refused`` (whose head did not move, so nothing of it was written)
        was refused, read after the fact: a head only moves forward, so what stopped it then
        still shows."""
        for i in refused:
            eid, first = heads[i]
            rows = await self._fetch(self._sql.head, (eid,))
            current_fence, next_sequence = rows[0] if rows else (0, 0)
            refusal = take_over_refusal(eid, first, requests[i][1], current_fence, next_sequence)
            if refusal is None:
                last = await self._fetch(self._sql.ended, (eid, first - 1))
                if last:
                    refusal = ended(eid, str(last[0][0]))
                else:
                    refusal = StorageWriteError(
                        f"take-over of {eid!r} at {first} was not written", execution_id=eid
                    )
            outcomes[i] = refusal

    async def append_with_blobs(
        self, envelopes: Sequence[Envelope], blobs: Mapping[str, bytes], *, namespace: str = ""
    ) -> None:
        """See :class:`loom.storage.AppendsWithBlobs`: the blobs go in the append's own
        statement (one transaction, no commit of their own); a refused append stores none."""
        check_blobs(blobs)
        _storable(namespace, "blob namespace")
        _, first, fence = batch_head(envelopes)
        await self._write_events("append", envelopes, first, fence, blobs, namespace)

    async def _write_events(
        self,
        kind: WriteKind,
        envelopes: Sequence[Envelope],
        first: int,
        fence: int,
        blobs: Mapping[str, bytes] | None = None,
        namespace: str = "",
    ) -> None:
        """Queue one event write (``fence``: see :attr:`PostgresWrite.fence`) and await it."""
        self._writable()
        execution_id = envelopes[0].execution_id
        _storable(execution_id, "execution id")
        if self._reserved:
            check_reserved(envelopes, self._reserved)
        # A derived id is stored empty (schema rung 10): the partial index skips it.
        ids = [
            "" if e.envelope_id == f"{execution_id}#{e.sequence}.{e.fence}" else e.envelope_id
            for e in envelopes
        ]
        for e in envelopes:
            _storable(e.envelope_id, "envelope id")
            _storable(e.payload_json, "payload")
            if type(e.type) is not EventType:  # an extension's name: any text
                _storable(e.type, "event type")
        note = execution_id if len(execution_id.encode()) <= MAX_NOTE_BYTES else ""
        sums = [e.checksum() for e in envelopes]
        params: dict[str, Any] = {
            "eid": execution_id,
            "fence": envelopes[0].fence,
            "first": first,
            "end": first + len(envelopes),
            "ends": envelopes[-1].type in TERMINAL_TYPES,  # the head's ended (see _MOVE_APPEND)
            "channel": self._channel,
            "note": note,
        }
        statement: EventWriteKind = "append"
        if kind == "take_over":
            params["from"] = fence
            statement = "create" if fence == 0 else "take_over"
        change = summary_change(envelopes)
        index: IndexWrite = ""
        if change is not None:
            summary = change.apply(None)
            index = "start" if change.started else "mark" if change.status is None else "change"
            params.update(
                lock=self._cursor_lock,
                feed=FEED_KEY,
                x_eid=execution_id,
                x_flow=summary.flow_id,
                x_version=summary.flow_version,
                x_status=summary.status.value,
                x_waiting=summary.waiting_for,
                x_parent=summary.parent_id,
                x_forked=summary.forked_from,
                x_created=summary.created_at,
                x_updated=summary.updated_at,
            )
            for text in (
                summary.flow_id,
                summary.flow_version,
                summary.waiting_for or "",
                summary.parent_id or "",  # from the payload's JSON, which may escape a NUL
                summary.forked_from or "",
            ):
                _storable(text, "summary field")
        if len(envelopes) == 1:
            e = envelopes[0]
            params.update(id=ids[0], type=str(e.type), payload=e.payload_json, at=e.recorded_at)
            params["sum"] = sums[0]
            sql = self._sql.events(statement, one=True, index=index, blobs=bool(blobs))
        else:
            params.update(
                seqs=[e.sequence for e in envelopes],
                ids=ids,
                types=[str(e.type) for e in envelopes],
                payloads=[e.payload_json for e in envelopes],
                ats=[e.recorded_at for e in envelopes],
                sums=sums,
            )
            sql = self._sql.events(statement, one=False, index=index, blobs=bool(blobs))
        if blobs:
            keys = list(blobs)
            params.update(b_ns=namespace, b_hashes=keys, b_data=[bytes(blobs[k]) for k in keys])
        req = PostgresWrite(
            kind=kind,
            execution_id=execution_id,
            sql=sql,
            params=params,
            first=first,
            fence=fence,
            count=len(envelopes),
            # The ids as stored: a lost COMMIT's probe matches the rows themselves.
            probe=(first, ids, sums),
            cursor_lock=None if change is None else self._cursor_lock,
        )
        await self._submit(req)

    async def read(
        self, execution_id: str, *, from_sequence: int = 0, limit: int | None = None
    ) -> list[Envelope]:
        """See :meth:`loom.storage.EventStore.read`."""
        if "\x00" in execution_id:
            return []  # nothing can be stored under it
        if limit is None:
            rows = await self._fetch(self._sql.read, (execution_id, from_sequence))
        else:
            sql = self._sql.read + " LIMIT %s"
            rows = await self._fetch(sql, (execution_id, from_sequence, max(limit, 0)))
        limits = self.limits
        return [
            decode_envelope(execution_id, r[0], r[1], r[2], r[3], r[4], r[5], r[6], limits)
            for r in rows
        ]

    async def last_sequence(self, execution_id: str) -> int:
        """See :meth:`loom.storage.EventStore.last_sequence`."""
        if "\x00" in execution_id:
            return -1
        rows = await self._fetch(self._sql.last, (execution_id,))
        return int(rows[0][0]) - 1 if rows else -1

    async def _watch_last(self, execution_id: str, deadline: float | None) -> int:
        """:meth:`last_sequence` for a waiter listening for appends: the first time, it also
        marks the head watched, so that every append from then on notifies.

        The mark is an ``UPDATE`` that takes the head's row lock, which every append takes
        too: an append in flight commits first and the mark returns the tail it left; an append
        that locks the head after the mark committed sees the flag and notifies. Neither can
        slip between the waiter's read and its sleep. An execution with no head yet stays
        unmarked (its start always notifies) and is marked on the next read. The lock is
        waited for until the wait's deadline, and at most :data:`_MARK_LOCK_WAIT`: a head
        held longer (a writer stuck in its commit, which no append can pass either) is read
        plainly and marked on a later read (the safety poll's, at the latest).
        """
        if execution_id in self._watched or "\x00" in execution_id:
            return await self.last_sequence(execution_id)
        left = _MARK_LOCK_WAIT
        if deadline is not None:
            left = min(left, deadline - asyncio.get_running_loop().time())
        rows = await self._mark_watched(execution_id, max(1, round(left * 1000)))
        if rows is None:
            return await self.last_sequence(execution_id)
        if not rows:
            return -1
        if len(self._watched) >= _WATCHED_KEPT:
            self._watched.clear()  # marking again costs one UPDATE; forgetting costs nothing
        self._watched.add(execution_id)
        return int(rows[0][0]) - 1

    async def _mark_watched(self, execution_id: str, lock_ms: int) -> list[tuple[Any, ...]] | None:
        """Run the mark waiting at most ``lock_ms`` for the head's lock: its rows (none: no
        head yet), or None if the lock was not had in time (nothing was written). Like a read,
        it is tried once more when the pool's connection turns out dead (a server restart)."""

        async def mark(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]] | None:
            try:
                async with conn.transaction():
                    await conn.execute(
                        "SELECT set_config('lock_timeout', %s, true)",
                        (f"{lock_ms}ms",),
                        prepare=False,
                    )
                    cur = await conn.execute(self._sql.watch, (execution_id,), prepare=False)
                    return await cur.fetchall()
            except psycopg.errors.LockNotAvailable:
                return None

        what = f"could not mark {execution_id!r} watched for wait_for_append"
        return await self._retried(mark, what, execution_id)

    async def acquire_fence(self, execution_id: str) -> int:
        """See :meth:`loom.storage.EventStore.acquire_fence`."""
        self._writable()
        _storable(execution_id, "execution id")
        req = PostgresWrite(
            kind="fence",
            execution_id=execution_id,
            sql=self._sql.fence,
            params=(execution_id,),
        )
        result: int = await self._submit(req)
        return result

    async def current_fence(self, execution_id: str) -> int:
        """See :meth:`loom.storage.EventStore.current_fence`."""
        if "\x00" in execution_id:
            return 0
        rows = await self._fetch(self._sql.current_fence, (execution_id,))
        return int(rows[0][0]) if rows else 0

    async def iterate_execution_ids(
        self, *, after: str | None = None, page_size: int = 256
    ) -> AsyncIterator[str]:
        """See :meth:`loom.storage.EventStore.iterate_execution_ids`."""
        # No stored id holds NUL, so the ids after "ab\x00..." are exactly the ids after "ab".
        cursor = None if after is None else after.split("\x00", 1)[0]
        while True:
            if cursor is None:
                rows = await self._fetch(self._sql.ids_first, (page_size,))
            else:
                rows = await self._fetch(self._sql.ids_after, (cursor, page_size))
            for (execution_id,) in rows:
                yield execution_id
            if len(rows) < page_size:
                return
            cursor = rows[-1][0]

    async def wait_for_append(
        self, execution_id: str, after_sequence: int, *, timeout: float | None = None
    ) -> int:
        """See :meth:`loom.storage.EventStore.wait_for_append`.

        Appends anywhere (any process) wake the waiter through LISTEN/NOTIFY, and appends of
        this store object at once. A wait that starts while the listener cannot connect polls
        every ``poll_interval``; one under way when the listener drops re-checks when it
        drops and when it is back, and every ``safety_poll_interval`` in any case.

        The first wait of an execution marks its head watched (one ``UPDATE``; appends notify
        only watched heads, and starts). A read-only store cannot mark it, so its waits poll
        every ``poll_interval``.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        await self._ensure_open()
        if self.notify:
            self._listener.ensure()
        if self.notify and not self._listening.is_set():
            # Let LISTEN take effect first so that no other process's append is missed; if the
            # listener cannot connect, polling covers the wait.
            budget = self.connect_timeout if deadline is None else deadline - loop.time()
            try:
                async with asyncio.timeout(max(0.0, budget)):  # not wait_for (3.11 cancels)
                    await self._listening.wait()
            except TimeoutError:
                pass
        remaining = None if deadline is None else max(0.0, deadline - loop.time())
        listening = self._listening.is_set() and not self.read_only
        poll = self.safety_poll_interval if listening else self.poll_interval

        async def read_last(eid: str) -> int:
            if listening:
                return await self._watch_last(eid, deadline)
            return await self.last_sequence(eid)

        self._waiting[execution_id] += 1
        try:
            return await self._waiters.wait(
                execution_id, after_sequence, remaining, read_last, poll
            )
        finally:
            self._waiting[execution_id] -= 1
            if self._waiting[execution_id] <= 0:
                del self._waiting[execution_id]

    # ---------------------------------------------------------------- ExecutionIndex

    async def list_executions(self, query: ExecutionQuery) -> ExecutionPage:
        """See :meth:`loom.storage.ExecutionIndex.list_executions`."""
        where, params = where_clause(query, "%s", paged=True, instr="strpos")
        limit = max(query.limit, 1)
        rows = await self._fetch(
            f'SELECT {SUMMARY_COLUMNS} FROM "{self.schema}".executions{where} '
            "ORDER BY created_at DESC, execution_id DESC LIMIT %s",
            (*params, limit + 1),
        )
        items = [summary_from_row(r) for r in rows[:limit]]
        return ExecutionPage(items, encode_page_cursor(items[-1]) if len(rows) > limit else None)

    async def count_executions(self, query: ExecutionQuery) -> int:
        """See :meth:`loom.storage.ExecutionIndex.count_executions`."""
        where, params = where_clause(query, "%s", paged=False, instr="strpos")
        rows = await self._fetch(f'SELECT count(*) FROM "{self.schema}".executions{where}', params)
        return int(rows[0][0])

    async def get_summary(self, execution_id: str) -> ExecutionSummary | None:
        """See :meth:`loom.storage.ExecutionIndex.get_summary`."""
        if not _storable_text(execution_id):
            return None
        rows = await self._fetch(self._sql.summary, (execution_id,))
        return summary_from_row(rows[0]) if rows else None

    async def changes(
        self, after: int, limit: int = 100, *, id_prefix: str = ""
    ) -> list[ExecutionSummary]:
        """See :meth:`loom.storage.ExecutionIndex.changes`."""
        rows = await self._fetch(self._sql.changes, (after, id_prefix, max(limit, 1)))
        return [summary_from_row(r) for r in rows]

    async def _last_cursor(self, _key: str = "") -> int:
        rows = await self._fetch(self._sql.last_cursor, ())
        return int(rows[0][0])

    async def wait_for_changes(self, after: int, *, timeout: float | None = None) -> int:
        """See :meth:`loom.storage.ExecutionIndex.wait_for_changes`.

        Woken by a notification that summary-changing appends send on commit (any process),
        then re-queried by cursor; polls as :meth:`wait_for_append` does when not listening.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        await self._ensure_open()
        if self.notify:
            self._listener.ensure()
            if not self._listening.is_set():
                budget = self.connect_timeout if deadline is None else deadline - loop.time()
                try:
                    async with asyncio.timeout(max(0.0, budget)):  # not wait_for (3.11 cancels)
                        await self._listening.wait()
                except TimeoutError:
                    pass
        remaining = None if deadline is None else max(0.0, deadline - loop.time())
        poll = self.safety_poll_interval if self._listening.is_set() else self.poll_interval
        self._waiting[FEED_KEY] += 1
        try:
            return await self._waiters.wait(FEED_KEY, after, remaining, self._last_cursor, poll)
        finally:
            self._waiting[FEED_KEY] -= 1
            if self._waiting[FEED_KEY] <= 0:
                del self._waiting[FEED_KEY]

    # ---------------------------------------------------------------- SnapshotStore

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """See :meth:`loom.storage.SnapshotStore.save_snapshot`."""
        self._writable()
        check_snapshot(snapshot)
        _storable(snapshot.execution_id, "execution id")
        state_json = encode_json(snapshot.state, limits=SNAPSHOT_LIMITS, what="snapshot")
        _storable(state_json, "snapshot")
        checksum = snapshot_checksum(snapshot.execution_id, snapshot.sequence, state_json)
        faults.hit("before_snapshot")
        params = {
            "eid": snapshot.execution_id,
            "seq": snapshot.sequence,
            "state": state_json,
            "sum": checksum,
        }
        await self._write("snapshot", snapshot.execution_id, self._sql.snapshot, params)

    async def save_snapshot_segment(self, segment: Snapshot, base: int) -> bool:
        """See :meth:`loom.storage.SnapshotSegments.save_snapshot_segment`."""
        self._writable()
        check_snapshot(segment)
        eid, seq = segment.execution_id, segment.sequence
        _storable(eid, "execution id")
        state_json = encode_json(segment.state, limits=SNAPSHOT_LIMITS, what="snapshot")
        _storable(state_json, "snapshot")
        faults.hit("before_snapshot")
        params = {
            "eid": eid,
            "seq": seq,
            "base": base,
            "state": state_json,
            "sum": segment_checksum(eid, seq, base, state_json),
        }
        kept = await self._write("snapshot", eid, self._sql.snapshot_segment, params)
        return bool(kept)

    async def load_snapshot(self, execution_id: str) -> Snapshot | None:
        """See :meth:`loom.storage.SnapshotStore.load_snapshot`."""
        if "\x00" in execution_id:
            return None
        rows = await self._fetch(self._sql.snapshot_load, {"eid": execution_id})
        if not rows or rows[0][0] != 0:
            return None
        _, sequence, _, state, checksum = rows[0]
        whole = decode_snapshot(execution_id, sequence, state, checksum)
        if len(rows) == 1:
            return whole
        return merge_segments(whole, [(r[1], r[2], r[3], r[4]) for r in rows[1:]])

    async def load_many(self, execution_ids: Sequence[str]) -> dict[str, StoredExecution]:
        """See :meth:`loom.storage.LoadsMany.load_many`: one query per 1,024 ids."""
        loaded: dict[str, StoredExecution] = {}
        storable = (i for i in execution_ids if "\x00" not in i)  # nothing is stored under those
        for chunk in chunks(storable, 1024):
            rows = await self._fetch(self._load_many_sql, {"ids": chunk})
            found, beyond = assemble(rows, self.limits)
            loaded.update(found)
            await add_beyond(loaded, beyond, self.last_sequence)
        return loaded

    # ---------------------------------------------------------------- BlobStore

    async def put_blobs(self, blobs: Mapping[str, bytes], *, namespace: str = "") -> None:
        """See :meth:`loom.storage.BlobStore.put_blobs` (group-committed like appends)."""
        check_blobs(blobs)
        _storable(namespace, "blob namespace")
        if not blobs:
            return
        keys = list(blobs)
        params = (namespace, keys, [bytes(blobs[k]) for k in keys])
        await self._write("blob", namespace, self._sql.blob_put, params)

    async def get_blobs(self, hashes: Iterable[str], *, namespace: str = "") -> dict[str, bytes]:
        """See :meth:`loom.storage.BlobStore.get_blobs`."""
        wanted = check_hashes(hashes)
        if not wanted or "\x00" in namespace:
            return {}
        rows = await self._fetch(self._sql.blob_get, (namespace, wanted))
        return {str(h): bytes(d) for h, d in rows}

    # ---------------------------------------------------------------- TimerStore

    async def schedule_timer(self, timer: Timer) -> None:
        """See :meth:`loom.storage.TimerStore.schedule_timer`."""
        check_timer(timer)
        _storable(timer.execution_id, "execution id")
        _storable(timer.kind, "timer kind")
        _storable(timer.flow_id, "flow id")
        params = (timer.execution_id, timer.position, timer.fire_at, timer.kind, timer.flow_id)
        await self._write("timer", timer.execution_id, self._sql.timer_schedule, params)

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
        """See :meth:`loom.storage.TimerStore.claim_due_timers`.

        One autocommit statement that row-locks the first due, unclaimed timers with
        ``FOR UPDATE SKIP LOCKED`` and marks them ``claimed_until = now + lease``. It is not
        coalesced with other writes and never retried: if the answer is lost, the timers it may
        have claimed are handed out again when the lease expires.
        """
        _storable(owner, "timer owner")
        self._writable()
        if limit < 1:
            return []
        pool = await self._ensure_open()
        _storable(prefix, "timer prefix")
        params = {
            "owner": owner,
            "until": now + lease,
            "now": now,
            "limit": limit,
            "prefix": prefix,
            "any_flow": flow_ids is None,
            "flow_ids": sorted(set(flow_ids or ())),
        }
        try:
            async with pool.connection() as conn:
                cur = await conn.execute(self._sql.timer_claim, params)
                rows = await cur.fetchall()
        except psycopg.Error as exc:
            self._writer.check_pool()
            raise StorageError(
                f"PostgreSQL store ({self.schema}): claiming due timers failed: {exc}",
                hint="The timers it may have claimed are handed out again after the lease",
            ) from exc
        # RETURNING has no order; hand them out earliest first, as every store does.
        timers = [Timer(r[0], int(r[1]), float(r[2]), r[3], r[4]) for r in rows]
        timers.sort(key=lambda t: (t.fire_at, t.execution_id, t.position))
        return timers

    async def complete_timer(self, timer: Timer) -> None:
        """See :meth:`loom.storage.TimerStore.complete_timer`."""
        if _storable_text(timer.execution_id):
            params = (timer.execution_id, timer.position)
            await self._write("timer", timer.execution_id, self._sql.timer_complete, params)

    async def complete_timers(self, timers: Sequence[Timer]) -> None:
        """See :meth:`loom.storage.TimerStore.complete_timers` (one statement, one commit)."""
        kept = [t for t in timers if _storable_text(t.execution_id)]
        if not kept:
            return
        params = ([t.execution_id for t in kept], [t.position for t in kept])
        sql = self._sql.timer_complete_many
        await self._write("timer", kept[0].execution_id, sql, params)

    async def cancel_timers(self, execution_id: str) -> int:
        """See :meth:`loom.storage.TimerStore.cancel_timers`."""
        if not _storable_text(execution_id):
            return 0  # nothing can be stored under it
        sql = self._sql.timer_cancel
        result: int = await self._write("timer", execution_id, sql, (execution_id,))
        return result

    async def next_timer_due(self, prefix: str = "") -> float | None:
        """See :meth:`loom.storage.TimerStore.next_timer_due`."""
        rows = await self._fetch(self._sql.timer_next, (prefix,))
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    # ---------------------------------------------------------------- LeaseStore

    async def renew_lease(
        self, execution_id: str, *, holder: str, fence: int, expires_at: float
    ) -> bool:
        """See :meth:`loom.storage.LeaseStore.renew_lease`."""
        _storable(execution_id, "execution id")
        _storable(holder, "lease holder")
        params = (execution_id, holder, fence, expires_at)
        renewed = await self._write("timer", execution_id, self._sql.lease_renew, params)
        return bool(renewed)

    async def release_lease(self, execution_id: str, *, holder: str) -> None:
        """See :meth:`loom.storage.LeaseStore.release_lease`."""
        if _storable_text(execution_id) and _storable_text(holder):
            sql = self._sql.lease_release
            await self._write("timer", execution_id, sql, (execution_id, holder))

    async def lease_expiry(self, execution_id: str) -> float | None:
        """See :meth:`loom.storage.LeaseStore.lease_expiry`."""
        if not _storable_text(execution_id):
            return None
        rows = await self._fetch(self._sql.lease_expiry, (execution_id,))
        return None if not rows else float(rows[0][0])

    # ---------------------------------------------------------------- MailboxStore

    async def put_message(self, message: Message) -> Message:
        """See :meth:`loom.storage.MailboxStore.put_message`."""
        eid, mid = message.execution_id, message.message_id
        _storable(eid, "execution id")
        _storable(mid, "message id")
        _storable(message.event_type, "event type")
        text = encode_json(message.payload, limits=self.limits, what="message payload")
        _storable(text, "message payload")
        params = (eid, mid, message.event_type, text, message.sent_at)
        await self._write("mailbox", eid, self._sql.mailbox_put, params)
        rows = await self._fetch(self._sql.mailbox_get, (eid, mid))
        return Message(eid, mid, rows[0][0], decode_json(rows[0][1]), float(rows[0][2]))

    async def pending_messages(
        self, execution_id: str, event_type: str, *, limit: int = 100
    ) -> list[Message]:
        """See :meth:`loom.storage.MailboxStore.pending_messages`."""
        if not (_storable_text(execution_id) and _storable_text(event_type)):
            return []  # nothing can be stored under it
        rows = await self._fetch(self._sql.mailbox_pending, (execution_id, event_type, limit))
        return [
            Message(execution_id, r[0], event_type, decode_json(r[1]), float(r[2])) for r in rows
        ]

    async def consume_message(self, execution_id: str, message_id: str) -> None:
        """See :meth:`loom.storage.MailboxStore.consume_message`."""
        if not (_storable_text(execution_id) and _storable_text(message_id)):
            return
        sql = self._sql.mailbox_consume
        await self._write("mailbox", execution_id, sql, (execution_id, message_id))

    async def _write(self, kind: WriteKind, execution_id: str, sql: str, params: Any) -> Any:
        """Commit one statement through the group commit; its one row's count is the result."""
        self._writable()
        req = PostgresWrite(kind=kind, execution_id=execution_id, sql=sql, params=params)
        return await self._submit(req)

    async def _submit(self, req: PostgresWrite) -> Any:
        if self._pool is None or asyncio.get_running_loop() is not self._loop:
            await self._ensure_open()  # opens the pool, or refuses another loop
        return await self._writer.engine.submit(req)

    # ---------------------------------------------------------------- lifecycle

    async def close(self) -> None:
        """Finish the batches in flight, stop the listener and close every connection.

        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._listener.closed = True  # no reconnect while the batches in flight finish
        await self._writer.close()
        await self._listener.stop()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def __repr__(self) -> str:
        return f"PostgresStore({self._where()}, group_commit={self.group_commit})"
