"""PostgresStore: the multi-node store (several processes and hosts over one database).

* Every invariant is enforced by the database, never by process memory: an append is one
  fence-guarded ``UPDATE heads ... WHERE fence = %s AND next_sequence = %s`` (0 rows -> the head
  is read and :func:`refusal_for` names the exact refusal), envelope ids are a ``UNIQUE``
  constraint, fences are an atomic ``INSERT ... ON CONFLICT DO UPDATE SET fence = fence + 1``.
* Group commit: writes (append, fence, snapshot) queued by concurrent tasks are coalesced into
  one transaction, sent in pipeline mode (one round trip for the whole batch). The append
  statement does nothing at all when it is refused (its INSERT selects from the UPDATE's
  returned row), so a refusal never needs a rollback; only when a statement *raises* (a duplicate
  envelope id, a deadlock) is the batch rolled back and replayed one SAVEPOINT per request, so
  one caller's refusal never fails another. A failed COMMIT or a lost connection fails every
  caller in the batch with one ``StorageWriteError`` (cause attached); nothing partial commits.
* A lone write is one statement in autocommit: one round trip, the same as a bare
  ``INSERT`` + ``COMMIT``; coalescing costs a lone writer nothing.
* A connection lost *while committing* leaves the outcome unknown. The store then asks the
  database (from a fresh connection, after waiting out the dead transaction's row lock) whether
  the batch landed, and answers every caller accordingly, so "acknowledged" means durable and
  "StorageWriteError" means not written (or, if even that check fails, says the outcome is
  unknown). Pooled connections are re-checked after a failure, so the store recovers from a
  server restart without a process restart. Writes are never retried blindly.
* ``wait_for_append`` is woken by ``pg_notify`` inside the append transaction, received on a
  dedicated ``LISTEN`` connection that reconnects by itself; a slow poll is only a safety net.
* The schema lives in its own PostgreSQL schema (``schema="loom"``), versioned in a ``meta``
  table and created or migrated in one transaction under an advisory lock, so several processes
  may open it at once. A database written by a newer Loom is refused (``SchemaVersionError``).

A store is bound to the event loop that opened it (its pool is an asyncio pool).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import Counter
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from loom import faults
from loom.errors import (
    ConfigurationError,
    DuplicateEnvelopeIdError,
    LoomError,
    PayloadError,
    SchemaVersionError,
    StorageError,
    StorageWriteError,
)
from loom.model import DEFAULT_LIMITS, Envelope, PayloadLimits, encode_json
from loom.storage._common import (
    SNAPSHOT_LIMITS,
    Waiters,
    batch_head,
    decode_envelope,
    decode_snapshot,
    refusal_for,
    snapshot_checksum,
)
from loom.storage._spi import Snapshot

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

SCHEMA_VERSION = 1

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# Statements that take a database from version N-1 to N. Version 1 creates everything. Ids are
# COLLATE "C" so that enumeration order is code-point order, as in every other store.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        'CREATE TABLE {s}.heads (execution_id text COLLATE "C" PRIMARY KEY,'
        " fence bigint NOT NULL, next_sequence bigint NOT NULL)",
        'CREATE TABLE {s}.events (execution_id text COLLATE "C" NOT NULL,'
        ' sequence bigint NOT NULL, envelope_id text COLLATE "C" NOT NULL,'
        " type text NOT NULL, payload text NOT NULL, recorded_at double precision NOT NULL,"
        " fence bigint NOT NULL, checksum text NOT NULL,"
        " CONSTRAINT events_pkey PRIMARY KEY (execution_id, sequence),"
        " CONSTRAINT events_envelope_id_key UNIQUE (envelope_id))",
        'CREATE TABLE {s}.snapshots (execution_id text COLLATE "C" PRIMARY KEY,'
        " sequence bigint NOT NULL, state text NOT NULL, checksum text NOT NULL)",
    ),
}

# One statement per append. The INSERT reads from the UPDATE's RETURNING, so a refused append
# (0 rows moved) writes nothing and needs no rollback. The head is returned for the refusal.
_APPEND = """
WITH moved AS (
    UPDATE {{s}}.heads SET next_sequence = %(end)s
    WHERE execution_id = %(eid)s AND fence = %(fence)s AND next_sequence = %(first)s
    RETURNING execution_id
), ins AS (
    INSERT INTO {{s}}.events
        (execution_id, sequence, envelope_id, type, payload, recorded_at, fence, checksum)
    {rows}
    RETURNING 1
)
SELECT (SELECT count(*) FROM ins), {notify}, h.fence, h.next_sequence
FROM (SELECT 1) AS one LEFT JOIN {{s}}.heads AS h ON h.execution_id = %(eid)s
"""

_NOTIFY = "(SELECT count(pg_notify(%(channel)s, %(note)s)) FROM moved)"

# Most appends carry one envelope: scalar parameters cost far less to send than arrays.
_ONE_ROW = (
    "SELECT moved.execution_id, %(first)s, %(id)s, %(type)s, %(payload)s, %(at)s::float8, "
    "%(fence)s, %(sum)s FROM moved"
)
_MANY_ROWS = """SELECT moved.execution_id, r.seq, r.eid, r.typ, r.payload, r.at, %(fence)s, r.sum
    FROM moved, unnest(%(seqs)s::bigint[], %(ids)s::text[], %(types)s::text[],
                       %(payloads)s::text[], %(ats)s::float8[], %(sums)s::text[])
         AS r(seq, eid, typ, payload, at, sum)"""

_FENCE = (
    "INSERT INTO {s}.heads AS h (execution_id, fence, next_sequence) VALUES (%s, 1, 0) "
    "ON CONFLICT (execution_id) DO UPDATE SET fence = h.fence + 1 RETURNING h.fence"
)

_SNAPSHOT = (
    "INSERT INTO {s}.snapshots AS t (execution_id, sequence, state, checksum) "
    "VALUES (%s, %s, %s, %s) ON CONFLICT (execution_id) DO UPDATE SET "
    "sequence = excluded.sequence, state = excluded.state, checksum = excluded.checksum "
    "WHERE excluded.sequence > t.sequence RETURNING 1"
)

_HEAD = "SELECT fence, next_sequence FROM {s}.heads WHERE execution_id = %s"

_READ = (
    "SELECT envelope_id, sequence, type, payload, recorded_at, fence, checksum "
    "FROM {s}.events WHERE execution_id = %s AND sequence >= %s ORDER BY sequence"
)

_PROBE = (
    "SELECT 1 FROM {s}.events WHERE envelope_id = %s AND execution_id = %s "
    "AND sequence = %s AND checksum = %s"
)

#: pg_notify payloads must stay under 8000 bytes; a longer id wakes every waiter instead.
_MAX_NOTE_BYTES = 4000

_Conn = psycopg.AsyncConnection[tuple[Any, ...]]


@dataclass(eq=False)
class _Request:
    """One caller's write, answered on the caller's future."""

    kind: Literal["append", "fence", "snapshot"]
    execution_id: str
    sql: str
    params: Any
    future: asyncio.Future[Any]
    first: int = 0
    fence: int = 0
    count: int = 0
    #: (envelope_id, sequence, checksum) of the first envelope: proves an append landed.
    probe: tuple[str, int, str] | None = None
    result: Any = None
    error: BaseException | None = None


def _answer(req: _Request) -> None:
    if req.future.done():  # the caller gave up (cancelled); nothing to tell it
        return
    if req.error is not None:
        req.future.set_exception(req.error)
    else:
        req.future.set_result(req.result)


def _lost(conn: _Conn) -> bool:
    return conn.closed or conn.broken


def _storable(value: str, what: str) -> None:
    # PostgreSQL text cannot hold NUL, and a lone surrogate cannot be sent as UTF-8: refuse
    # both before the write is queued, so one bad request never reaches a shared batch.
    if "\x00" in value:
        raise PayloadError(f"{what} contains a NUL character, which PostgreSQL cannot store")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise PayloadError(f"{what} is not valid UTF-8 text: {exc}") from exc


class PostgresStore:
    """The event, snapshot and fence store over PostgreSQL (psycopg 3, an asyncio pool).

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
    ) -> None:
        if not _SCHEMA_NAME.fullmatch(schema):
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
        s = f'"{schema}"'
        note = _NOTIFY if notify else "0"
        self._sql = {
            "append_one": _APPEND.format(rows=_ONE_ROW, notify=note).format(s=s),
            "append_many": _APPEND.format(rows=_MANY_ROWS, notify=note).format(s=s),
            "fence": _FENCE.format(s=s),
            "snapshot": _SNAPSHOT.format(s=s),
            "head": _HEAD.format(s=s),
            "read": _READ.format(s=s),
            "probe": _PROBE.format(s=s),
            "probe_lock": f"SELECT 1 FROM {s}.heads WHERE execution_id = %s FOR SHARE",
            "last": f"SELECT next_sequence FROM {s}.heads WHERE execution_id = %s",
            "current_fence": f"SELECT fence FROM {s}.heads WHERE execution_id = %s",
            "snapshot_load": (
                f"SELECT sequence, state, checksum FROM {s}.snapshots WHERE execution_id = %s"
            ),
            "ids_first": (
                f"SELECT execution_id FROM {s}.heads WHERE next_sequence > 0 "
                "ORDER BY execution_id LIMIT %s"
            ),
            "ids_after": (
                f"SELECT execution_id FROM {s}.heads WHERE next_sequence > 0 "
                "AND execution_id > %s ORDER BY execution_id LIMIT %s"
            ),
        }
        digest = hashlib.blake2b(schema.encode(), digest_size=12).hexdigest()
        self._channel = f"loom_{digest}"
        # Advisory lock key for migrations: a signed 64-bit number derived from the schema.
        self._lock_key = int.from_bytes(
            hashlib.blake2b(f"loom-migrate:{schema}".encode(), digest_size=8).digest(),
            "big",
            signed=True,
        )
        self._pool: AsyncConnectionPool[_Conn] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open_lock = asyncio.Lock()
        self._closed = False
        self._pending: list[_Request] = []
        self._collecting = False
        self._inflight = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._check_task: asyncio.Task[None] | None = None
        self._waiters = Waiters()
        self._waiting: Counter[str] = Counter()
        self._listener: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()

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

    async def _ensure_open(self) -> AsyncConnectionPool[_Conn]:
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

    async def _connect(self) -> AsyncConnectionPool[_Conn]:
        pool: AsyncConnectionPool[_Conn] = AsyncConnectionPool(
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
                await self._migrate(conn)
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

    async def _migrate(self, conn: _Conn) -> None:
        s = f'"{self.schema}"'
        async with conn.transaction():
            # Every opener takes the same lock, so concurrent first opens create the schema once
            # and a migration is never observed half-done (DDL is transactional in PostgreSQL).
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value text NOT NULL)"
            )
            cur = await conn.execute(f"SELECT value FROM {s}.meta WHERE key = 'schema_version'")
            row = await cur.fetchone()
            version = int(row[0]) if row is not None else 0
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"the PostgreSQL store at {self._where()} has Loom schema version "
                    f"{version}; this Loom reads up to {SCHEMA_VERSION}"
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target]:
                    await conn.execute(statement.format(s=s))
            if version < SCHEMA_VERSION:
                await conn.execute(
                    f"INSERT INTO {s}.meta (key, value) VALUES ('schema_version', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(SCHEMA_VERSION),),
                )

    @classmethod
    async def drop_schema(cls, dsn: str, schema: str = "loom") -> None:
        """Drop a store's schema and everything in it (tests; decommissioning). Idempotent."""
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigurationError(f"not a Loom schema name: {schema!r}")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    # ---------------------------------------------------------------- group commit

    async def _submit(self, req: _Request) -> Any:
        """Commit one write, coalesced with every write queued meanwhile.

        The first writer to find no batch collecting leads: it yields once so that every task
        that is ready now can queue behind it (as ``SQLiteStore`` does), then takes the queue. A
        lone write commits right there, in the caller's task (no hop). A shared batch runs in a
        task of its own, so that a cancelled caller never strands the others; when it finishes it
        takes whatever queued meanwhile. At most ``max_inflight_batches`` batches run at once.
        """
        await self._ensure_open()
        self._pending.append(req)
        if self._collecting or self._inflight >= self.max_inflight_batches:
            return await req.future  # a batch that is collecting, or the next free one, takes it
        self._collecting = True
        self._inflight += 1
        if self.group_commit:
            try:
                await asyncio.sleep(0)
            except BaseException:  # cancelled while collecting: hand the others to a batch task
                self._collecting = False
                self._inflight -= 1
                if req in self._pending:
                    self._pending.remove(req)
                self._maybe_start_batch_task()
                raise
        batch = self._take_batch()
        if batch != [req]:
            self._spawn(self._flush(batch))
            return await req.future
        try:
            await self._run_batch(batch)
        except BaseException:
            if req.future.done() and not req.future.cancelled():
                req.future.exception()  # retrieved: the caller gets the interruption instead
            raise
        finally:
            self._inflight -= 1
            self._maybe_start_batch_task()
        return req.future.result()

    def _take_batch(self) -> list[_Request]:
        batch = self._pending[: self.max_batch]
        del self._pending[: self.max_batch]
        self._collecting = False
        self._maybe_start_batch_task()  # what is left beyond max_batch
        return batch

    def _maybe_start_batch_task(self) -> None:
        if self._pending and not self._collecting and self._inflight < self.max_inflight_batches:
            self._collecting = True
            self._inflight += 1
            self._spawn(self._flush(None))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, batch: list[_Request] | None) -> None:
        """Run ``batch`` (or take one: this task was started while writers queued), then keep
        taking what queued meanwhile, as long as no other batch is collecting it."""
        try:
            while True:
                if batch is None:
                    batch = self._take_batch()
                if batch:
                    await self._run_batch(batch)
                if not self._pending or self._collecting:
                    return
                self._collecting = True
                batch = None
        finally:
            self._inflight -= 1

    async def _run_batch(self, batch: list[_Request]) -> None:
        # Requests of different executions are independent, so they may run in any order; one
        # global order (by id, stable for one execution's requests) means batches of several
        # processes lock heads rows in the same order and cannot deadlock each other.
        batch.sort(key=lambda r: r.execution_id)
        try:
            try:
                faults.hit("before_append")
                pool = self._pool
                if pool is None:
                    raise StorageWriteError(f"the PostgreSQL store ({self._where()}) is closed")
                async with pool.connection() as conn:
                    if len(batch) == 1:
                        committed = await self._run_single(conn, batch[0])
                    else:
                        committed = await self._run_many(conn, batch)
            except Exception as exc:
                # Nothing of this batch was committed (commit failures are resolved inside).
                self._check_pool()
                self._fail_all(batch, self._write_error("the write transaction failed", exc))
                return
            if committed:
                try:
                    faults.hit("after_append_before_ack")
                except Exception as exc:
                    self._fail_all(
                        batch,
                        self._write_error(
                            "committed, but the acknowledgement was lost", exc, outcome="committed"
                        ),
                    )
        except BaseException as exc:
            self._fail_all(batch, self._write_error("the write was interrupted", exc))
            raise
        finally:
            for req in batch:
                _answer(req)
            notify = [r.execution_id for r in batch if r.kind == "append" and r.error is None]
            if notify:
                self._waiters.notify(notify)

    async def _run_single(self, conn: _Conn, req: _Request) -> bool:
        # A lone write is one autocommit statement: the statement and its COMMIT are one round
        # trip, so ``before_commit`` is crossed just before it (a crash there, as at any point
        # before COMMIT, leaves nothing written).
        faults.hit("before_commit")
        try:
            cur = await conn.execute(req.sql, req.params)
            row = await cur.fetchone()
        except psycopg.Error as exc:
            if _lost(conn):
                return await self._resolve([req], exc)
            req.error = self._statement_error(req, exc)
            return False
        if self._settle(req, row):
            await self._reread_head(conn, req)
        return req.error is None

    async def _run_many(self, conn: _Conn, batch: list[_Request]) -> bool:
        try:
            async with conn.pipeline() as pipeline:
                await conn.execute("BEGIN")
                cursors = []
                for req in batch:
                    cur = conn.cursor()
                    await cur.execute(req.sql, req.params)
                    cursors.append(cur)
                await pipeline.sync()
                rows = [await cur.fetchone() for cur in cursors]
        except psycopg.Error:
            if _lost(conn):
                raise  # no COMMIT was sent: nothing is written; _run_batch fails every caller
            # A statement raised (duplicate envelope id, deadlock, ...): replay the batch one
            # SAVEPOINT per request so that only that request fails.
            await conn.execute("ROLLBACK")
            return await self._run_savepoints(conn, batch)
        for req, row in zip(batch, rows, strict=True):
            if self._settle(req, row):
                await self._reread_head(conn, req)
        return await self._commit(conn, batch)

    async def _run_savepoints(self, conn: _Conn, batch: list[_Request]) -> bool:
        await conn.execute("BEGIN")
        for req in batch:
            req.error = None
            await conn.execute("SAVEPOINT loom_request")
            try:
                cur = await conn.execute(req.sql, req.params)
                row = await cur.fetchone()
            except psycopg.Error as exc:
                if _lost(conn):
                    raise
                await conn.execute("ROLLBACK TO SAVEPOINT loom_request")
                req.error = self._statement_error(req, exc)
            else:
                if self._settle(req, row):
                    await self._reread_head(conn, req)
            await conn.execute("RELEASE SAVEPOINT loom_request")
        return await self._commit(conn, batch)

    async def _commit(self, conn: _Conn, batch: list[_Request]) -> bool:
        """COMMIT the batch; True if it is durable (False: every request was refused)."""
        if all(r.error is not None for r in batch):
            await conn.execute("ROLLBACK")
            return False
        # A fault raised here propagates; the pool rolls the open transaction back.
        faults.hit("before_commit")
        try:
            await conn.execute("COMMIT")
        except psycopg.Error as exc:
            if _lost(conn):
                return await self._resolve(batch, exc)
            raise  # the server refused the COMMIT: it rolled back, nothing is written
        return True

    def _settle(self, req: _Request, row: tuple[Any, ...] | None) -> bool:
        """Turn a statement's row into the request's result or refusal.

        Returns True when the head the statement saw does not explain the refusal (a concurrent
        commit changed it after the statement's snapshot) and must be read again.
        """
        if req.kind == "fence":
            assert row is not None
            req.result = int(row[0])
            return False
        if req.kind == "snapshot":
            return False
        assert row is not None
        inserted, _, head_fence, head_next = row
        if inserted == req.count:
            return False
        req.error = refusal_for(
            req.execution_id, req.first, req.fence, head_fence or 0, head_next or 0
        )
        return req.error is None

    async def _reread_head(self, conn: _Conn, req: _Request) -> None:
        cur = await conn.execute(self._sql["head"], (req.execution_id,))
        head = await cur.fetchone()
        current_fence, next_sequence = head if head is not None else (0, 0)
        req.error = refusal_for(
            req.execution_id, req.first, req.fence, current_fence, next_sequence
        )
        if req.error is None:
            # The same holder appended concurrently and out of order; the head now fits, but
            # this statement saw otherwise and wrote nothing. Nothing of it is written.
            req.error = StorageWriteError(
                f"append to {req.execution_id!r} at {req.first} raced with another append by "
                "the same fence holder; nothing was written",
                execution_id=req.execution_id,
                hint="Append one batch at a time per execution",
            )

    def _statement_error(self, req: _Request, exc: psycopg.Error) -> LoomError:
        if isinstance(exc, psycopg.errors.UniqueViolation) and req.kind == "append":
            err: LoomError = DuplicateEnvelopeIdError(
                f"an envelope id of this batch is already stored ({exc.diag.message_detail})",
                execution_id=req.execution_id,
            )
        else:
            err = StorageWriteError(
                f"the {req.kind} for {req.execution_id!r} failed: {exc}",
                execution_id=req.execution_id,
            )
        err.__cause__ = exc
        return err

    async def _resolve(self, batch: list[_Request], exc: psycopg.Error) -> bool:
        """The connection died while committing: find out whether the batch landed.

        The batch is atomic, so one envelope of one append in it answers for all of it. The
        check first takes a share lock on that execution's head row, which waits until the
        dead session's transaction (holding the row) is really gone, committed or not.
        """
        self._check_pool()
        probe = next((r for r in batch if r.kind == "append" and r.error is None), None)
        landed = None if probe is None else await self._probe(probe)
        if landed:
            return True
        if landed is None:
            err = self._write_error(
                "the connection was lost while committing and the outcome could not be checked",
                exc,
                outcome="unknown",
                hint="The write may or may not be stored: read the execution before retrying",
            )
        else:
            err = self._write_error(
                "the connection was lost while committing; checked: nothing was written", exc
            )
        self._fail_all(batch, err)
        return False

    async def _probe(self, req: _Request) -> bool | None:
        assert req.probe is not None
        envelope_id, sequence, checksum = req.probe
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.resolve_timeout
        delay = 0.05
        while True:
            remaining = deadline - loop.time()
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=max(1, round(remaining))
                )
                async with conn, conn.transaction():
                    await conn.execute(
                        f"SET LOCAL lock_timeout = '{max(1, int(remaining * 1000))}ms'"
                    )
                    await conn.execute(self._sql["probe_lock"], (req.execution_id,))
                    cur = await conn.execute(
                        self._sql["probe"], (envelope_id, req.execution_id, sequence, checksum)
                    )
                    return await cur.fetchone() is not None
            except psycopg.Error:
                if loop.time() + delay >= deadline:
                    return None
            await asyncio.sleep(delay)  # the server may be restarting: back off and ask again
            delay = min(delay * 2, 1.0)

    def _check_pool(self) -> asyncio.Task[None] | None:
        """Have the pool test its idle connections and replace the dead ones, in the background.

        After a lost connection the others are probably dead too (a server restart or a
        terminated session kills them all, and the pool only learns it when one is used)."""
        pool = self._pool
        if pool is None or self._closed:
            return None
        if self._check_task is None or self._check_task.done():
            self._check_task = asyncio.get_running_loop().create_task(self._run_pool_check(pool))
        return self._check_task

    async def _run_pool_check(self, pool: AsyncConnectionPool[_Conn]) -> None:
        try:
            await pool.check()
        except psycopg.Error:
            pass  # the pool keeps reconnecting by itself; the next caller will see the error

    def _write_error(self, what: str, exc: BaseException, **details: Any) -> StorageWriteError:
        hint = details.pop("hint", None)
        err = StorageWriteError(
            f"PostgreSQL store ({self.schema}): {what}: {exc}", hint=hint, **details
        )
        err.__cause__ = exc
        return err

    def _fail_all(self, batch: list[_Request], error: StorageWriteError) -> None:
        for req in batch:
            req.error = error
            req.result = None

    # ---------------------------------------------------------------- reads

    async def _fetch(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        pool = await self._ensure_open()
        for attempt in (1, 2):
            try:
                async with pool.connection() as conn:
                    cur = await conn.execute(sql, params)
                    return await cur.fetchall()
            except psycopg.OperationalError as exc:
                # Reads are idempotent: once the pool has replaced the connections that died
                # while idle (server restart, terminated sessions), one retry hides the loss.
                check = self._check_pool()
                if attempt == 2 or isinstance(exc, PoolTimeout | psycopg.errors.QueryCanceled):
                    raise StorageError(
                        f"PostgreSQL store ({self.schema}): read failed: {exc}"
                    ) from exc
                if check is not None:
                    await asyncio.shield(check)
            except psycopg.Error as exc:
                raise StorageError(f"PostgreSQL store ({self.schema}): read failed: {exc}") from exc
        raise AssertionError("unreachable")

    # ---------------------------------------------------------------- EventStore

    async def append(self, envelopes: Sequence[Envelope]) -> None:
        """See :meth:`loom.storage.EventStore.append`."""
        execution_id, first, fence = batch_head(envelopes)
        _storable(execution_id, "execution id")
        for e in envelopes:
            _storable(e.envelope_id, "envelope id")
            _storable(e.payload_json, "payload")
        note = execution_id if len(execution_id.encode()) <= _MAX_NOTE_BYTES else ""
        sums = [e.checksum() for e in envelopes]
        params: dict[str, Any] = {
            "eid": execution_id,
            "fence": fence,
            "first": first,
            "end": first + len(envelopes),
            "channel": self._channel,
            "note": note,
        }
        if len(envelopes) == 1:
            e = envelopes[0]
            params.update(
                id=e.envelope_id, type=e.type.value, payload=e.payload_json, at=e.recorded_at
            )
            params["sum"] = sums[0]
            sql = self._sql["append_one"]
        else:
            params.update(
                seqs=[e.sequence for e in envelopes],
                ids=[e.envelope_id for e in envelopes],
                types=[e.type.value for e in envelopes],
                payloads=[e.payload_json for e in envelopes],
                ats=[e.recorded_at for e in envelopes],
                sums=sums,
            )
            sql = self._sql["append_many"]
        req = _Request(
            "append",
            execution_id,
            sql,
            params,
            asyncio.get_running_loop().create_future(),
            first=first,
            fence=fence,
            count=len(envelopes),
            probe=(envelopes[0].envelope_id, first, sums[0]),
        )
        await self._submit(req)

    async def read(self, execution_id: str, *, from_sequence: int = 0) -> list[Envelope]:
        """See :meth:`loom.storage.EventStore.read`."""
        if "\x00" in execution_id:
            return []  # nothing can be stored under it
        rows = await self._fetch(self._sql["read"], (execution_id, from_sequence))
        limits = self.limits
        return [
            decode_envelope(execution_id, r[0], r[1], r[2], r[3], r[4], r[5], r[6], limits)
            for r in rows
        ]

    async def last_sequence(self, execution_id: str) -> int:
        """See :meth:`loom.storage.EventStore.last_sequence`."""
        if "\x00" in execution_id:
            return -1
        rows = await self._fetch(self._sql["last"], (execution_id,))
        return int(rows[0][0]) - 1 if rows else -1

    async def acquire_fence(self, execution_id: str) -> int:
        """See :meth:`loom.storage.EventStore.acquire_fence`."""
        _storable(execution_id, "execution id")
        req = _Request(
            "fence",
            execution_id,
            self._sql["fence"],
            (execution_id,),
            asyncio.get_running_loop().create_future(),
        )
        result: int = await self._submit(req)
        return result

    async def current_fence(self, execution_id: str) -> int:
        """See :meth:`loom.storage.EventStore.current_fence`."""
        if "\x00" in execution_id:
            return 0
        rows = await self._fetch(self._sql["current_fence"], (execution_id,))
        return int(rows[0][0]) if rows else 0

    async def iterate_execution_ids(
        self, *, after: str | None = None, page_size: int = 256
    ) -> AsyncIterator[str]:
        """See :meth:`loom.storage.EventStore.iterate_execution_ids`."""
        # No stored id holds NUL, so the ids after "ab\x00..." are exactly the ids after "ab".
        cursor = None if after is None else after.split("\x00", 1)[0]
        while True:
            if cursor is None:
                rows = await self._fetch(self._sql["ids_first"], (page_size,))
            else:
                rows = await self._fetch(self._sql["ids_after"], (cursor, page_size))
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
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        await self._ensure_open()
        self._ensure_listener()
        if self.notify and not self._listening.is_set():
            # Let LISTEN take effect first so that no other process's append is missed; if the
            # listener cannot connect, polling covers the wait.
            budget = self.connect_timeout if deadline is None else deadline - loop.time()
            try:
                await asyncio.wait_for(self._listening.wait(), max(0.0, budget))
            except TimeoutError:
                pass
        remaining = None if deadline is None else max(0.0, deadline - loop.time())
        poll = self.safety_poll_interval if self._listening.is_set() else self.poll_interval
        self._waiting[execution_id] += 1
        try:
            return await self._waiters.wait(
                execution_id, after_sequence, remaining, self.last_sequence, poll
            )
        finally:
            self._waiting[execution_id] -= 1
            if self._waiting[execution_id] <= 0:
                del self._waiting[execution_id]

    def _ensure_listener(self) -> None:
        if self._listener is None and self.notify and not self._closed:
            self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def _listen(self) -> None:
        """Hold a LISTEN connection; reconnect when it drops, then wake every waiter to re-check
        (notifications sent while it was down are lost)."""
        delay = 0.05
        while not self._closed:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=max(1, round(self.connect_timeout))
                )
                async with conn:
                    await conn.execute(f"LISTEN {self._channel}")
                    self._listening.set()
                    delay = 0.05
                    self._waiters.notify(list(self._waiting))
                    async for note in conn.notifies():
                        self._waiters.notify(
                            [note.payload] if note.payload else list(self._waiting)
                        )
            except psycopg.Error:
                pass
            finally:
                self._listening.clear()
            if self._closed:
                return
            self._waiters.notify(list(self._waiting))  # re-check now: a wake-up may be lost
            await asyncio.sleep(delay)  # the server may be restarting: back off, then reconnect
            delay = min(delay * 2, 1.0)

    # ---------------------------------------------------------------- SnapshotStore

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """See :meth:`loom.storage.SnapshotStore.save_snapshot`."""
        _storable(snapshot.execution_id, "execution id")
        state_json = encode_json(snapshot.state, limits=SNAPSHOT_LIMITS, what="snapshot")
        _storable(state_json, "snapshot")
        checksum = snapshot_checksum(snapshot.execution_id, snapshot.sequence, state_json)
        faults.hit("before_snapshot")
        req = _Request(
            "snapshot",
            snapshot.execution_id,
            self._sql["snapshot"],
            (snapshot.execution_id, snapshot.sequence, state_json, checksum),
            asyncio.get_running_loop().create_future(),
        )
        await self._submit(req)

    async def load_snapshot(self, execution_id: str) -> Snapshot | None:
        """See :meth:`loom.storage.SnapshotStore.load_snapshot`."""
        if "\x00" in execution_id:
            return None
        rows = await self._fetch(self._sql["snapshot_load"], (execution_id,))
        if not rows:
            return None
        sequence, state, checksum = rows[0]
        return decode_snapshot(execution_id, sequence, state, checksum)

    # ---------------------------------------------------------------- lifecycle

    async def close(self) -> None:
        """Finish the batches in flight, stop the listener and close every connection.

        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for req in self._pending:
            req.error = StorageWriteError(f"the PostgreSQL store ({self.schema}) was closed")
            _answer(req)
        self._pending.clear()
        for task in (self._listener, self._check_task):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, psycopg.Error):
                    pass
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def __repr__(self) -> str:
        return f"PostgresStore({self._where()}, group_commit={self.group_commit})"
