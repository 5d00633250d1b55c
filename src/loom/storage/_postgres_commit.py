"""PostgresStore's write path: batches of the shared group-commit engine, run in pipeline mode.

* Writes (append, take-over, fence, snapshot, timer) queued by concurrent tasks are coalesced
  into one transaction, sent in pipeline mode (one round trip for the whole batch). An event
  write does nothing at all when it is refused (its INSERT selects from the head write's
  returned row), so a refusal never needs a rollback; only when a statement *raises* (a
  duplicate envelope id, a deadlock) is the batch rolled back and replayed one SAVEPOINT per
  request, so one caller's refusal never fails another. A failed COMMIT or a lost connection
  fails every caller in the batch with one ``StorageWriteError`` (cause attached); nothing
  partial commits.
* A lone write is one statement in autocommit: one round trip, the same as a bare
  ``INSERT`` + ``COMMIT``; coalescing costs a lone writer nothing. The writer keeps one pooled
  connection checked out for its batches (and its statements prepared on it), so a step pays no
  pool hand-over; it goes back to the pool when anything fails on it, and batches running
  alongside take pooled connections as before.
* A connection lost *while committing* leaves the outcome unknown. The store then asks the
  database (from a fresh connection, after waiting out the dead transaction's row lock) whether
  the batch landed, and answers every caller accordingly, so "acknowledged" means durable and
  "StorageWriteError" means not written (or, if even that check fails, says the outcome is
  unknown). Pooled connections are re-checked after a failure, so the store recovers from a
  server restart without a process restart. Writes are never retried blindly.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import psycopg
import psycopg.errors
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg_pool import AsyncConnectionPool

from loom import faults
from loom.errors import DuplicateEnvelopeIdError, LoomError, StorageWriteError
from loom.storage._batching import GroupCommit, WriteRequest
from loom.storage._common import Waiters, ended, refusal_for, take_over_refusal
from loom.storage._postgres_lean import LeanStatements, forget_prepared, lean_values
from loom.storage._postgres_sql import Conn, Statements

__all__ = ["PostgresWrite", "PostgresWriter", "WriteKind"]

WriteKind = Literal[
    "append", "take_over", "take_over_many", "fence", "snapshot", "timer", "blob", "mailbox"
]

ProbeT = TypeVar("ProbeT")  # what a lost-COMMIT probe learns

#: The kinds that write events (and so move the head, notify waiters and prove a batch landed).
_EVENT_WRITES = ("append", "take_over")


@dataclass(eq=False, kw_only=True)
class PostgresWrite(WriteRequest):
    """One caller's write: one statement (its parameters) and what proves or refuses it."""

    kind: WriteKind
    execution_id: str
    sql: str
    params: Any
    first: int = 0
    #: The envelopes' fence for an append; the fence taken over *from* for a take-over.
    fence: int = 0
    count: int = 0
    #: (first sequence, ids as stored, checksums) of every envelope: proves an append landed.
    probe: tuple[int, Sequence[str], Sequence[str]] | None = None
    #: The change cursor's advisory lock key if the statement may take it (it writes an index
    #: row): a batch holding one takes that lock before anything else (see _lock_first).
    cursor_lock: int | None = None
    #: A take_over_many's (execution id, first sequence, ids as stored, checksums) of each
    #: take-over: proves which of them landed.
    probe_many: Sequence[tuple[str, int, Sequence[str], Sequence[str]]] | None = None
    #: The statement's lean values, encoded up front (see PlainAppend); None: encoded from
    #: ``params`` if the write goes out alone on the held connection.
    lean: tuple[bytes, list[bytes | None], tuple[int, ...]] | None = None


#: The server ended the session (an operator's pg_terminate_backend, a shutdown, a crash
#: restart, the database dropped, an idle-session timeout): class 57P.
_SESSION_ENDED = frozenset({"57P01", "57P02", "57P03", "57P04", "57P05"})


def _lost(conn: Conn, exc: psycopg.Error | None = None) -> bool:
    """Whether ``conn`` is gone: closed or broken, or (given the error ``exc`` that a statement
    on it raised) ended by the server or left in libpq's pipeline mode.

    A server ending the session answers the statement in flight with its FATAL error first and
    closes the socket after, so libpq can report the error before it has read the end of the
    stream: the connection then still looks usable. Taken for a plain statement error, the
    batch was rolled back on a dead connection (and failed with that error instead), and a
    pipeline that could not be left went back to the pool mid-answer."""
    if conn.closed or conn.broken:
        return True
    if exc is None:
        return False
    # The context only of an error the server did not send (psycopg's own, leaving a pipeline
    # after the FATAL answer): a statement's error raised while the caller itself handles a
    # session error elsewhere carries that one as its context too, and says nothing of this
    # connection.
    for error in (exc,) if exc.sqlstate else (exc, exc.__context__):
        if isinstance(error, psycopg.Error) and (
            error.sqlstate in _SESSION_ENDED
            or (error.sqlstate or "").startswith("08")  # connection exception
            or error.diag.severity_nonlocalized in ("FATAL", "PANIC")
        ):
            return True
    return conn.pgconn.pipeline_status != PipelineStatus.OFF


async def _gone(conn: psycopg.AsyncConnection[Any], backend: int, deadline: float) -> bool:
    """Wait (on ``conn``, in autocommit: each look sees the server as it is now) until the
    server process ``backend`` has exited; False if it still runs at ``deadline`` (the loop's
    clock). A process id the server reused is waited for too: that can only make the outcome
    unknown, never wrong."""
    loop = asyncio.get_running_loop()
    delay = 0.005
    while True:
        cur = await conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND pid <> pg_backend_pid()",
            (backend,),
        )
        if await cur.fetchone() is None:
            return True
        if loop.time() + delay >= deadline:
            return False
        await asyncio.sleep(delay)  # the server's state, which no event announces: polled
        delay = min(delay * 2, 0.25)


def _proves(req: PostgresWrite) -> bool:
    """Whether ``req``'s records being stored would prove its batch committed: an event write,
    or a take_over_many that moved a head (or whose answer, which says so, was lost)."""
    if req.kind == "take_over_many":
        return req.probe_many is not None and (req.result is None or len(req.result) > 0)
    return req.kind in _EVENT_WRITES


def _refusal(req: PostgresWrite, current_fence: int, next_sequence: int) -> LoomError | None:
    """The refusal (if any) of an event write onto the head (``current_fence``,
    ``next_sequence``)."""
    if req.kind == "take_over":
        return take_over_refusal(
            req.execution_id, req.first, req.fence, current_fence, next_sequence
        )
    return refusal_for(req.execution_id, req.first, req.fence, current_fence, next_sequence)


class PostgresWriter:
    """The write half of :class:`~loom.storage.postgres.PostgresStore`, owned by it.

    :meth:`submit` commits one :class:`PostgresWrite` through the shared group-commit engine
    (``_batching``), which hands this writer batches to run on one pooled connection each.
    """

    def __init__(
        self,
        *,
        dsn: str,
        schema: str,
        sql: Statements,
        pool: Callable[[], AsyncConnectionPool[Conn] | None],
        closed: Callable[[], bool],
        waiters: Waiters,
        where: str,
        group_commit: bool,
        max_batch: int,
        max_inflight: int,
        resolve_timeout: float,
        spin_wait: float = 0.0,
    ) -> None:
        self.dsn = dsn
        self.spin_wait = spin_wait
        self.schema = schema
        self.resolve_timeout = resolve_timeout
        self._sql = sql
        self._pool = pool
        self._closed = closed
        self._waiters = waiters
        self._check_task: asyncio.Task[None] | None = None
        #: The connection this writer keeps out of the pool for its batches (see _acquire).
        self._held: Conn | None = None
        self._held_busy = False
        #: A cursor on it, reused: a new cursor per statement copies the adapters each time.
        self._held_cursor: psycopg.AsyncCursor[tuple[Any, ...]] | None = None
        #: The lone writes' own prepared statements on it (see _postgres_lean).
        self._held_lean: LeanStatements | None = None
        #: The lean statements of each pooled connection a batch ran on beside the held one
        #: (prepared per connection; forgotten with the connection).
        self._pooled_lean: weakref.WeakKeyDictionary[Conn, LeanStatements] = (
            weakref.WeakKeyDictionary()
        )
        #: When it goes back to the pool anyway (the pool's max_lifetime, which it cannot apply
        #: to a connection it does not hold), so that a long-running writer still recycles it.
        self._held_until = 0.0
        self.engine: GroupCommit[PostgresWrite] = GroupCommit(
            self._run_batch,
            coalesce=group_commit,
            max_batch=max_batch,
            max_inflight=max_inflight,
            where=f"PostgreSQL store ({where})",
        )

    async def submit(self, req: PostgresWrite) -> Any:
        """Commit ``req``, coalesced with the writes queued meanwhile; return its result."""
        return await self.engine.submit(req)

    async def close(self) -> None:
        """Let the batches in flight finish, refuse what is still queued, stop the pool check."""
        await self.engine.drain()
        self.engine.fail_pending(
            lambda: StorageWriteError(f"the PostgreSQL store ({self.schema}) was closed")
        )
        task = self._check_task
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, psycopg.Error):
                pass
        await self._return_held()

    async def _run_batch(self, batch: list[PostgresWrite]) -> None:
        if len(batch) > 1:
            # Requests of different executions are independent, so they may run in any order;
            # one global order (by id, stable for one execution's requests) means batches of
            # several processes lock heads rows in the same order and cannot deadlock each
            # other. An execution's timer rows come after its heads row, for the same reason (a
            # batch holds only writes that were pending at once, so none waits for another).
            batch.sort(key=lambda r: (r.execution_id, r.kind == "timer"))
        try:
            try:
                if faults.ARMED:
                    faults.hit("before_append")
                conn, held = self._take_held() or await self._acquire()
                failed = True
                try:
                    if len(batch) == 1:
                        cur = self._held_cursor if held else None
                        lean = self._lean_on(conn, held)
                        committed = await self._run_single(conn, batch[0], cur, lean)
                    else:
                        committed = await self._run_many(conn, batch, self._lean_on(conn, held))
                    failed = False
                finally:
                    if not (held and self._keep_held(conn, failed)):
                        await self._release(conn, held, failed)
            except Exception as exc:
                # Nothing of this batch was committed (commit failures are resolved inside).
                self.check_pool()
                self._fail_all(
                    batch,
                    self._write_error(
                        "the write transaction failed", exc, execution_id=_lone_id(batch)
                    ),
                )
                return
            if committed and faults.ARMED:
                try:
                    faults.hit("after_append_before_ack")
                except Exception as exc:
                    self._fail_all(
                        batch,
                        self._write_error(
                            "committed, but the acknowledgement was lost",
                            exc,
                            outcome="committed",
                            execution_id=_lone_id(batch),
                        ),
                    )
        except BaseException as exc:
            # Interrupted mid-write (a cancelled batch task, at shutdown): its statement, or its
            # COMMIT, may have reached the server and run to its end before the cancel request
            # a lean write sends (or the closed socket) could stop it; a lone write is one
            # autocommit statement. So what it did is not known.
            self._fail_all(
                batch,
                self._write_error(
                    "the write was interrupted",
                    exc,
                    outcome="unknown",
                    hint="The write may have reached the server before the interruption: read "
                    "the execution before retrying",
                    execution_id=_lone_id(batch),
                ),
            )
            raise
        finally:
            notify = [r.execution_id for r in batch if r.kind in _EVENT_WRITES and r.error is None]
            if notify:
                self._waiters.notify(notify)

    async def append_alone(
        self,
        execution_id: str,
        lean: tuple[bytes, list[bytes | None], tuple[int, ...]],
        request: Callable[[], PostgresWrite],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> bool:
        """Commit one plain record (``lean``: its statement's values) on the held connection
        when nothing else is being written: what ``submit``, :meth:`_run_batch` and
        :meth:`_run_single` do for it, with the same statement, fault points, refusals and
        errors, without the request, the batch and their coroutines (a sixth of a step's
        client CPU). ``request`` builds the request only when something other than a commit
        comes of it (a refusal, a failure, a lost answer), for the general path's handling.

        True: committed (or refused: raised). False: not alone, or the held connection is not
        free: nothing was done, not even a fault point crossed. ``loop``: the running loop, if
        the caller has it at hand.
        """
        engine = self.engine
        if not engine.idle(loop):
            return False
        taken = self._take_held()
        if taken is None:
            return False
        conn = taken[0]
        statements = self._held_lean
        assert statements is not None  # held with it (see _acquire)
        engine.lone_begins()
        req: PostgresWrite | None = None
        try:
            failed = True
            try:
                try:
                    if faults.ARMED:
                        faults.hit("before_append")
                        faults.hit("before_commit")  # one autocommit statement: see _run_single
                    row = await statements.execute(*lean, loop=loop)
                except psycopg.Error as exc:
                    req = request()
                    if _lost(conn, exc):
                        committed = await self._resolve([req], exc, conn)
                    else:
                        req.error = self._statement_error(req, exc)
                        committed = False
                else:
                    committed = row is not None and row[0] == 1  # the head moved: written
                    if not committed:
                        req = request()
                        if self._settle(req, row):
                            await self._reread_head(conn, req)
                        committed = req.error is None
                failed = False
            finally:
                if not self._keep_held(conn, failed):
                    await self._release(conn, True, failed)
        except Exception as exc:
            # Nothing was committed (a lost commit is resolved above), as in _run_batch.
            self.check_pool()
            raise self._write_error(
                "the write transaction failed", exc, execution_id=execution_id
            ) from exc
        finally:
            # An interruption (a cancel) goes to the caller as it is, as from _run_batch.
            engine.lone_ends()
        if committed and faults.ARMED:
            try:
                faults.hit("after_append_before_ack")
            except Exception as exc:
                raise self._write_error(
                    "committed, but the acknowledgement was lost",
                    exc,
                    outcome="committed",
                    execution_id=execution_id,
                ) from exc
        if req is not None and req.error is not None:
            raise req.error
        if self._waiters._by_execution:
            self._waiters.notify([execution_id])
        return True

    async def _acquire(self) -> tuple[Conn, bool]:
        """A connection for one batch, and whether it is the writer's held one.

        The first batch to find the held connection free takes it (checking one out of the
        pool if none is held); a batch running alongside it takes a pooled one. A pool of one
        connection is left to the reads between batches.
        """
        pool = self._pool()
        if pool is None:
            raise StorageWriteError(f"the PostgreSQL store ({self.schema}) is closed")
        if not self._held_busy and (self._held is not None or pool.max_size > 1):
            self._held_busy = True
            if self._held is None:
                try:
                    self._held = await pool.getconn()
                except BaseException:
                    self._held_busy = False
                    raise
                self._held_cursor = self._held.cursor()
                self._held_lean = LeanStatements(
                    self._held,
                    spin_wait=self.spin_wait,
                    others_writing=self.engine.others_in_flight,
                )
                self._held_until = time.monotonic() + pool.max_lifetime
            return self._held, True
        return await pool.getconn(), False

    def _lean_on(self, conn: Conn, held: bool) -> LeanStatements:
        """The lean statements of ``conn``: the held connection's, or a pooled one's."""
        if held and self._held_lean is not None:
            return self._held_lean
        lean = self._pooled_lean.get(conn)
        if lean is None:
            lean = self._pooled_lean[conn] = LeanStatements(
                conn, others_writing=self.engine.others_in_flight
            )
        return lean

    def _backend_of(self, conn: Conn) -> int | None:
        """The server process of ``conn``, as its lean statements noted it (a lost connection
        no longer tells it: psycopg answers 0 once it is broken or closed); None if unknown."""
        lean = self._held_lean if conn is self._held else self._pooled_lean.get(conn)
        return None if lean is None else lean.backend_pid or None

    def _take_held(self) -> tuple[Conn, bool] | None:
        """The held connection, taken for one batch, if there is one and it is free (what
        :meth:`_acquire` does first, without its coroutine); None: ask ``_acquire``."""
        held = self._held
        if held is None or self._held_busy or self._pool() is None:
            return None
        self._held_busy = True
        return held, True

    def _keep_held(self, conn: Conn, failed: bool) -> bool:
        """Give the held connection back for the next batch if all went well and it is within
        the pool's lifetime (what :meth:`_release` does then, without its coroutine); False:
        nothing was done, ``_release`` decides."""
        if (
            failed
            or conn.pgconn.transaction_status != TransactionStatus.IDLE
            or self._closed()
            or time.monotonic() >= self._held_until
        ):
            return False
        self._held_busy = False
        return True

    async def _release(self, conn: Conn, held: bool, failed: bool) -> None:
        """Keep the held connection for the next batch if all went well (and it is within the
        pool's lifetime); otherwise hand it back to the pool, which rolls back whatever is open,
        or drops it if it is dead or expired."""
        if held:
            self._held_busy = False
            if (
                not failed
                and conn.pgconn.transaction_status == TransactionStatus.IDLE
                and not self._closed()
                and time.monotonic() < self._held_until
            ):
                return
            self._held = self._held_cursor = self._held_lean = None
        pool = self._pool()
        if pool is None:
            await conn.close()
            return
        if failed and not _lost(conn):
            if (
                conn.pgconn.transaction_status == TransactionStatus.ACTIVE
                or conn.pgconn.pipeline_status != PipelineStatus.OFF
            ):
                # Mid-answer, or left in pipeline mode (a session the server ended): no
                # rollback mends it. Closed, the pool discards it (handed back open, it would
                # warn that it found it mid-answer, then close it).
                await conn.close()
            else:
                try:
                    await conn.rollback()  # what the pool's own connection() does on an error
                except psycopg.Error:
                    pass
        await pool.putconn(conn)

    async def _return_held(self) -> None:
        """Hand the held connection back to the pool (the pool is checking its connections,
        or the store is closing)."""
        held = self._held
        if held is None or self._held_busy:
            return  # the batch using it hands it back itself if anything fails on it
        self._held = self._held_cursor = self._held_lean = None
        pool = self._pool()
        if pool is None:
            await held.close()
        else:
            await pool.putconn(held)

    async def _run_single(
        self,
        conn: Conn,
        req: PostgresWrite,
        cur: psycopg.AsyncCursor[tuple[Any, ...]] | None,
        lean: LeanStatements | None = None,
    ) -> bool:
        # A lone write is one autocommit statement: the statement and its COMMIT are one round
        # trip, so ``before_commit`` is crossed just before it (a crash there, as at any point
        # before COMMIT, leaves nothing written).
        if faults.ARMED:
            faults.hit("before_commit")
        # take_over_many's parameters are scalars too (JSON texts), but it answers with an array.
        encoded = None
        if lean is not None and req.kind != "take_over_many":
            encoded = req.lean or lean_values(req.sql, req.params)
        row: tuple[Any, ...] | None
        try:
            if encoded is not None:
                assert lean is not None
                row = await lean.execute(*encoded)
            else:
                if cur is None:
                    cur = conn.cursor()
                try:
                    await cur.execute(req.sql, req.params, prepare=True)
                except psycopg.errors.InvalidSqlStatementName:
                    # Dropped behind psycopg's back (a pooler's DISCARD ALL): it would keep
                    # naming them. The statement never ran; it runs again, prepared again.
                    await forget_prepared(conn)
                    await cur.execute(req.sql, req.params, prepare=True)
                row = await cur.fetchone()
        except psycopg.Error as exc:
            if _lost(conn, exc):
                return await self._resolve([req], exc, conn)
            req.error = self._statement_error(req, exc)
            return False
        if self._settle(req, row):
            await self._reread_head(conn, req)
        return req.error is None

    async def _run_many(
        self, conn: Conn, batch: list[PostgresWrite], lean: LeanStatements | None = None
    ) -> bool:
        encoded = self._lean_batch(batch) if lean is not None else None
        if encoded is not None:
            assert lean is not None
            key = next((r.cursor_lock for r in batch if r.cursor_lock is not None), None)
            try:
                rows = await lean.begin_and_run(encoded, key)
            except psycopg.Error as exc:
                if _lost(conn, exc):
                    raise  # no COMMIT was sent: nothing is written; _run_batch fails every caller
                # As below: replay the batch one SAVEPOINT per request (after a dropped
                # prepared statement too: the savepoints go through psycopg).
                await conn.execute("ROLLBACK")
                return await self._run_savepoints(conn, batch)
            return await self._settle_many(conn, batch, rows)
        try:
            async with conn.pipeline() as pipeline:
                await conn.execute("BEGIN")
                await self._lock_first(conn, batch)
                cursors = []
                for req in batch:
                    cur = conn.cursor()
                    await cur.execute(req.sql, req.params, prepare=True)
                    cursors.append(cur)
                await pipeline.sync()
                rows = [await cur.fetchone() for cur in cursors]
        except psycopg.Error as exc:
            if _lost(conn, exc):
                raise  # no COMMIT was sent: nothing is written; _run_batch fails every caller
            # A statement raised (duplicate envelope id, deadlock, ...): replay the batch one
            # SAVEPOINT per request so that only that request fails.
            await conn.execute("ROLLBACK")
            return await self._run_savepoints(conn, batch)
        return await self._settle_many(conn, batch, rows)

    async def _settle_many(
        self, conn: Conn, batch: list[PostgresWrite], rows: Sequence[tuple[Any, ...] | None]
    ) -> bool:
        for req, row in zip(batch, rows, strict=True):
            if self._settle(req, row):
                await self._reread_head(conn, req)
        return await self._commit(conn, batch)

    @staticmethod
    def _lean_batch(
        batch: list[PostgresWrite],
    ) -> list[tuple[bytes, list[bytes | None], tuple[int, ...]]] | None:
        """Each request's statement as lean values, or None if one of them needs psycopg
        (a parameter that is not a scalar, or a take_over_many, which answers with an array
        and takes its heads' locks first: see _lock_first)."""
        encoded = []
        for req in batch:
            if req.kind == "take_over_many":
                return None
            values = req.lean or lean_values(req.sql, req.params)
            if values is None:
                return None
            encoded.append(values)
        return encoded

    async def _run_savepoints(self, conn: Conn, batch: list[PostgresWrite]) -> bool:
        await conn.execute("BEGIN")
        await self._lock_first(conn, batch)
        for req in batch:
            req.error = None
            await conn.execute("SAVEPOINT loom_request")
            try:
                cur = await conn.execute(req.sql, req.params)
                row = await cur.fetchone()
            except psycopg.Error as exc:
                if _lost(conn, exc):
                    raise
                await conn.execute("ROLLBACK TO SAVEPOINT loom_request")
                req.error = self._statement_error(req, exc)
            else:
                if self._settle(req, row):
                    await self._reread_head(conn, req)
            await conn.execute("RELEASE SAVEPOINT loom_request")
        return await self._commit(conn, batch)

    async def _lock_first(self, conn: Conn, batch: list[PostgresWrite]) -> None:
        """Take the locks a batch's statements would otherwise take out of the global order:
        the change cursor's lock before any head (a statement takes it after its own head, so
        a later one would lock its head while holding it: see _INDEX in _postgres_sql), and
        the heads of a many-execution take-over with the others, in id order (its statement
        locks them where its first id sorts, not where each one does)."""
        key = next((r.cursor_lock for r in batch if r.cursor_lock is not None), None)
        if key is not None:
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
        if any(r.kind == "take_over_many" for r in batch):
            ids = sorted(
                {p[0] for r in batch if r.kind == "take_over_many" for p in r.probe_many or ()}
                | {r.execution_id for r in batch if r.kind != "take_over_many"}
            )
            await conn.execute(self._sql.lock_heads, (ids,))

    async def _commit(self, conn: Conn, batch: list[PostgresWrite]) -> bool:
        """COMMIT the batch; True if it is durable (False: every request was refused)."""
        if all(r.error is not None for r in batch):
            await conn.execute("ROLLBACK")
            return False
        # A fault raised here propagates; the pool rolls the open transaction back.
        faults.hit("before_commit")
        try:
            await conn.execute("COMMIT")
        except psycopg.Error as exc:
            if _lost(conn, exc):
                return await self._resolve(batch, exc, conn)
            raise  # the server refused the COMMIT: it rolled back, nothing is written
        return True

    def _settle(self, req: PostgresWrite, row: tuple[Any, ...] | None) -> bool:
        """Turn a statement's row into the request's result.

        Returns True when an event write wrote nothing: the head must be read to name its
        refusal (the statement says only whether the head moved, the price of a refusal being
        one more read rather than every append reading the head back).
        """
        if req.kind == "fence":
            assert row is not None
            req.result = int(row[0])
            return False
        if req.kind == "take_over_many":  # the ids whose head moved (see take_over_many)
            assert row is not None
            req.result = row[0]
            return False
        if req.kind in ("snapshot", "blob"):
            req.result = row is not None  # a snapshot's row says it was kept
            return False
        if req.kind in ("timer", "mailbox"):  # each of these statements returns one count
            assert row is not None
            req.result = int(row[0])
            return False
        assert row is not None
        return bool(row[0] != 1)  # the head did not move: nothing was written

    async def _reread_head(self, conn: Conn, req: PostgresWrite) -> None:
        cur = await conn.execute(self._sql.head, (req.execution_id,))
        head = await cur.fetchone()
        current_fence, next_sequence = head if head is not None else (0, 0)
        req.error = _refusal(req, current_fence, next_sequence)
        if req.error is None:
            cur = await conn.execute(self._sql.ended, (req.execution_id, req.first - 1))
            last = await cur.fetchone()
            if last is not None:
                req.error = ended(req.execution_id, str(last[0]))
                return
            # The same holder appended concurrently and out of order; the head now fits, but
            # this statement saw otherwise and wrote nothing. Nothing of it is written.
            what = "append to" if req.kind == "append" else "take-over of"
            req.error = StorageWriteError(
                f"{what} {req.execution_id!r} at {req.first} raced with another append by "
                "the same fence holder; nothing was written",
                execution_id=req.execution_id,
                hint="Append one batch at a time per execution",
            )

    def _statement_error(self, req: PostgresWrite, exc: psycopg.Error) -> LoomError:
        if isinstance(exc, psycopg.errors.UniqueViolation) and req.kind in _EVENT_WRITES:
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

    async def _resolve(
        self, batch: list[PostgresWrite], exc: psycopg.Error, conn: Conn | None = None
    ) -> bool:
        """The connection died while committing: find out whether the batch landed.

        The batch is atomic, so one append in it answers for all of it, if it is recognised
        whole: every envelope's id and checksum (which covers its fence, content and time).
        Its first record alone is not enough: a racer taking over from the same fence writes
        under the same new fence at the same sequence, and its batch may start with the very
        same record (a marker built the same way at the same time) and go on differently; the
        stored records then are not ours, and acknowledging ours would claim a write that
        never happened. The check first takes a share lock on that execution's head row,
        which waits until the dead session's transaction (holding the row) is really gone,
        committed or not. A connection lost on the client's side (a closed socket, a cut
        network, a proxy) may leave its backend running the statement, before it holds any
        row (waiting for the change cursor's lock, say, or writing a head not there yet): so
        the check first waits until ``conn``'s backend is gone, or says the outcome is unknown.
        """
        self.check_pool()
        if conn is not None and not conn.closed:
            # Ended by the server, though libpq has not seen the end of it yet (see _lost):
            # closed now, so that no later write is sent on it. Its backend is known already.
            await conn.close()
        probe = next((r for r in batch if r.error is None and _proves(r)), None)
        landed = None if probe is None else await self._probe(probe)
        backend = None if conn is None else self._backend_of(conn)
        if landed is False and probe is not None and backend is not None:
            # Not found yet: the lost backend may still be running it. Found, it was final.
            landed = await self._probe(probe, backend)
        if landed:
            return True
        if landed is None:
            err = self._write_error(
                "the connection was lost while committing and the outcome could not be checked",
                exc,
                outcome="unknown",
                hint="The write may or may not be stored: read the execution before retrying",
                execution_id=_lone_id(batch),
            )
        else:
            err = self._write_error(
                "the connection was lost while committing; checked: nothing was written",
                exc,
                execution_id=_lone_id(batch),
            )
        self._fail_all(batch, err)
        return False

    async def _probe(self, req: PostgresWrite, backend: int | None = None) -> bool | None:
        if req.kind == "take_over_many":
            return await self._probe_many(req, backend)
        assert req.probe is not None
        first, ids, sums = req.probe

        async def ask(conn: psycopg.AsyncConnection[Any]) -> bool:
            await conn.execute(self._sql.probe_lock, (req.execution_id,))
            cur = await conn.execute(
                self._sql.probe,
                (req.execution_id, first, first + len(sums), list(ids), list(sums)),
            )
            return await cur.fetchone() is not None

        return await self._ask_until_answered(ask, backend)

    async def _probe_many(self, req: PostgresWrite, backend: int | None = None) -> bool | None:
        """Whether a take_over_many landed, and (its answer being lost with the COMMIT's) which
        of its take-overs it wrote: those whose records are all stored, as for one append. It
        is one transaction, so one of them found proves it committed; none found means that
        nothing of it is stored (committed or not, it wrote nothing)."""
        assert req.probe_many is not None
        known = None if req.result is None else set(req.result)
        wanted = [p for p in req.probe_many if known is None or p[0] in known]
        document = json.dumps(
            [{"eid": e, "first": f, "ids": list(i), "sums": list(c)} for e, f, i, c in wanted]
        )
        eids = sorted(p[0] for p in wanted)

        async def ask(conn: psycopg.AsyncConnection[Any]) -> list[str]:
            await conn.execute(self._sql.probe_many_lock, (eids,))
            cur = await conn.execute(self._sql.probe_many, (document,))
            return [str(row[0]) for row in await cur.fetchall()]

        found = await self._ask_until_answered(ask, backend)
        if found is None:
            return None
        if req.result is None:
            req.result = found
        return bool(found)

    async def _ask_until_answered(
        self,
        ask: Callable[[psycopg.AsyncConnection[Any]], Awaitable[ProbeT]],
        backend: int | None = None,
    ) -> ProbeT | None:
        """``ask`` on a fresh connection, in a transaction whose lock wait ends with the
        deadline, until it answers or ``resolve_timeout`` has passed (then None: unknown).
        ``backend``: the lost connection's server process, waited for to be gone first (while
        it runs, what it writes is not known yet)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.resolve_timeout
        delay = 0.05
        while True:
            remaining = deadline - loop.time()
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=max(1, round(remaining))
                )
                async with conn:
                    running = False
                    if backend is not None:
                        running = not await _gone(conn, backend, deadline)
                        backend = None  # looked for: a later connection need not look again
                        remaining = deadline - loop.time()
                    async with conn.transaction():
                        await conn.execute(
                            f"SET LOCAL lock_timeout = '{max(1, int(remaining * 1000))}ms'"
                        )
                        answer = await ask(conn)
                    # Still running at the deadline, its write not found: it may yet land.
                    return None if running and not answer else answer
            except psycopg.Error:
                if loop.time() + delay >= deadline:
                    return None
            await asyncio.sleep(delay)  # the server may be restarting: back off and ask again
            delay = min(delay * 2, 1.0)

    def check_pool(self) -> asyncio.Task[None] | None:
        """Have the pool test its idle connections and replace the dead ones, in the background.

        After a lost connection the others are probably dead too (a server restart or a
        terminated session kills them all, and the pool only learns it when one is used)."""
        pool = self._pool()
        if pool is None or self._closed():
            return None
        if self._check_task is None or self._check_task.done():
            self._check_task = asyncio.get_running_loop().create_task(self._run_pool_check(pool))
        return self._check_task

    async def _run_pool_check(self, pool: AsyncConnectionPool[Conn]) -> None:
        try:
            await self._return_held()  # checked with the others, not trusted blindly
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

    def _fail_all(self, batch: list[PostgresWrite], error: StorageWriteError) -> None:
        for req in batch:
            req.error = error
            req.result = None


def _lone_id(batch: list[PostgresWrite]) -> str | None:
    """The execution a batch's one error names: its request's, if it holds one (a batch of
    several shares one error, naming none)."""
    return (batch[0].execution_id or None) if len(batch) == 1 else None
