"""SQLiteStore: the embedded default.

* WAL journal; ``synchronous=FULL`` by default, so an OS crash or power loss loses no
  acknowledged record. ``synchronous="NORMAL"`` is a documented opt-in: it survives process
  crashes but may lose the last commits on power loss.
* One write connection per process. Writes (append, fence, snapshot, timers) queued by
  concurrent tasks are coalesced into one transaction by the shared group-commit engine
  (``_batching``); a request that is refused leaves nothing behind, so one caller's refusal
  never fails another caller. A failed COMMIT fails every caller in the batch with that one
  error and stops the writer: a commit is never retried blindly.
  The event loop never waits for another process's lock: a batch begins on the loop's thread
  only if ``BEGIN IMMEDIATE`` gets the write lock at once; otherwise the batch goes to the
  writer thread, which waits up to ``busy_timeout`` for it while the loop serves other
  executions (and queues their writes for the next batch). The uncontended commit stays on the
  loop's thread because a hand-off to a thread costs more CPU per step than the statements.
* Reads run on the calling thread over a per-thread connection; in WAL they never block on the
  writer. Other processes may open the same file: fences, sequences and envelope uniqueness are
  checked inside ``BEGIN IMMEDIATE`` transactions, so they hold across processes too.

This module holds the connections, the writer and the log; the log's SQL is in ``_sqlite_sql``,
the index reads in ``_sqlite_index``, timers/leases/mailbox/blobs in ``_sqlite_tables``, refs in
``_sqlite_branches`` and the schema ladder in ``_sqlite_schema``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sqlite3
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from loom import faults
from loom._aio import LoopShare
from loom._settings import seconds_setting
from loom.errors import (
    ConfigurationError,
    CorruptEventError,
    DuplicateEnvelopeIdError,
    LoomError,
    NotALoomDatabaseError,
    StorageError,
    StorageWriteError,
    WriteOutcome,
)
from loom.model import (
    DEFAULT_LIMITS,
    Envelope,
    PayloadLimits,
    encode_json,
    summary_change,
)
from loom.storage._batching import GroupCommit, WriteRequest
from loom.storage._blobs import check_blobs
from loom.storage._common import (
    SNAPSHOT_LIMITS,
    TERMINAL_TYPES,
    Waiters,
    batch_head,
    check_reserved,
    check_snapshot,
    check_take_over,
    check_take_overs,
    decode_envelope,
    decode_snapshot,
    ended,
    merge_segments,
    plain_record,
    refusal_for,
    segment_checksum,
    snapshot_checksum,
    take_over_refusal,
)
from loom.storage._index import (
    FEED_KEY,
)
from loom.storage._loads import add_beyond, assemble, chunks, sqlite_load_many
from loom.storage._schema import SCHEMA_VERSION
from loom.storage._spi import Snapshot, StoredExecution, TakeOver
from loom.storage._sqlite_branches import SQLiteBranches
from loom.storage._sqlite_index import SQLiteIndexReads
from loom.storage._sqlite_schema import check_readable, load_reserved, migrate
from loom.storage._sqlite_sql import (
    APPEND_CHECK,
    INSERT_EVENT,
    LAST_SEQUENCE,
    append_check,
    ended_refusal,
    event_row,
    insert_or_undo,
    next_sequence_of,
    write_index,
    write_indexes,
)
from loom.storage._sqlite_tables import SQLiteSideTables
from loom.storage._sqlite_watch import ChangeWatch

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

#: How often a waiter re-checks its execution even if the change watch saw nothing (a
#: filesystem with coarse file times); the watch itself wakes it within ``poll_interval``.
_SAFETY_POLL = 1.0

# This process's id, kept current across fork: os.getpid() is a system call, and the writer
# checks it on every commit (connections and threads never cross a fork).
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)

#: How many executions' tails the lone append keeps (see SQLiteStore._tails): enough for every
#: execution stepping at once in a busy process; beyond it they are forgotten and read again.
_TAILS_KEPT = 4096

# What an attempt to begin a write transaction without waiting found.
_BEGUN, _BUSY, _FAILED = object(), object(), object()


@dataclass(eq=False, kw_only=True)
class _Request(WriteRequest):
    """One caller's write: a function run inside the writer's transaction."""

    apply: Callable[[sqlite3.Connection], Any]
    notify: str | None = None
    feed: bool = False
    #: Found the write lock held by another process (before_append crossed already).
    busy: bool = False


class SQLiteStore(SQLiteBranches, SQLiteIndexReads, SQLiteSideTables):
    """The embedded event, snapshot and fence store over one SQLite file.

    ``path`` may be ``":memory:"`` only for throwaway use within one connection; prefer a file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout: float = 10.0,
        group_commit: bool = True,
        max_batch: int = 1024,
        poll_interval: float = 0.05,
        limits: PayloadLimits = DEFAULT_LIMITS,
        read_only: bool = False,
        create: bool = True,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ConfigurationError(f"synchronous must be 'FULL' or 'NORMAL', not {synchronous!r}")
        busy_timeout = seconds_setting(busy_timeout, "SQLiteStore busy_timeout", zero_ok=True)
        poll_interval = seconds_setting(poll_interval, "SQLiteStore poll_interval")
        if max_batch < 1:
            raise ConfigurationError(f"SQLiteStore max_batch must be at least 1, not {max_batch}")
        self.path = str(path)
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self.group_commit = group_commit
        self.max_batch = max_batch if group_commit else 1
        self.poll_interval = poll_interval
        self.limits = limits
        self.read_only = read_only
        self._waiters = Waiters()
        self._watch: ChangeWatch | None = None
        if self.path != ":memory:" and not self.path.startswith("file:"):
            self._watch = ChangeWatch(
                (self.path, self.path + "-wal"), self._waiters.notify_all, poll_interval
            )
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        # One engine per event loop (callers' futures belong to their loop); every engine feeds
        # the one writer thread, which serialises their batches.
        self._engines: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, GroupCommit[_Request]
        ] = weakref.WeakKeyDictionary()
        self._hot_engine: (
            tuple[weakref.ref[asyncio.AbstractEventLoop], GroupCommit[_Request]] | None
        ) = None
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._thread_pid = 0
        self._writer: sqlite3.Connection | None = None
        self._writer_cursor: sqlite3.Cursor | None = None
        self._writer_lock = threading.Lock()
        self._writer_pid = 0
        #: What the lone append knows of some executions' tails (see _append_lone): fence, last
        #: sequence and type per execution id, exact while the writer connection's
        #: ``data_version`` is ``_tails_version`` (no other connection committed since) and no
        #: other write went through the writer (``_run_batch`` clears it). Under _writer_lock.
        self._tails: dict[str, tuple[int, int, str]] = {}
        self._tails_version = -1
        #: Lets the event loop run now and then between writes committed on its thread.
        self._loop_share = LoopShare()
        self._broken: BaseException | None = None
        self._closed = False
        memory = self.path == ":memory:"
        if (read_only or not create) and (memory or not Path(self.path).is_file()):
            raise NotALoomDatabaseError(
                f"no Loom database at {self.path}: the file does not exist",
                hint="Check the path; only an opening with create=True makes a new database",
            )
        if not memory and not read_only:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # Check (and create or migrate) the schema now, so a bad file fails at construction,
        # not mid-flow; a file that is not a Loom database is refused before anything (not
        # even the journal mode) is changed in it.
        try:
            conn = self._connect(setup=False)
        except sqlite3.Error as exc:
            raise NotALoomDatabaseError(f"cannot open {self.path} as SQLite: {exc}") from exc
        #: Derived ids a log written before schema rung 10 already holds (nearly always none).
        self._reserved: frozenset[str] = frozenset()
        try:
            if read_only:
                check_readable(conn, self.path)
            else:
                migrate(conn, self.path)
                self._reserved = load_reserved(conn)
                conn.execute("PRAGMA journal_mode = WAL")
        finally:
            conn.close()

    # ---------------------------------------------------------------- connections

    def _connect(self, *, setup: bool = True) -> sqlite3.Connection:
        if self.read_only:
            # mode=ro: SQLite itself refuses every write, and nothing (no journal switch, no
            # schema) is ever done to the file.
            uri = f"{Path(self.path).resolve().as_uri()}?mode=ro"
            conn = sqlite3.connect(
                uri,
                uri=True,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            return conn
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,  # we issue BEGIN/COMMIT ourselves
            check_same_thread=False,
        )
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        if setup:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        return conn

    def _reader(self) -> sqlite3.Connection:
        if self._closed:
            raise StorageError(f"the SQLite store {self.path} is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        pid = os.getpid()
        if conn is None or getattr(self._local, "pid", None) != pid:
            # Connections never cross a fork: a child opens its own.
            conn = self._connect()
            if not self.read_only:
                conn.execute("PRAGMA query_only = ON")
            self._local.conn = conn
            self._local.pid = pid
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    # ---------------------------------------------------------------- the writer

    def _writer_conn(self) -> sqlite3.Connection:
        pid = _pid
        if self._writer is None or self._writer_pid != pid:
            # Never reuse a connection across fork: the child opens its own.
            conn = self._connect()
            # No busy wait on the event loop's fast path (one statement fewer per step than
            # toggling it around each BEGIN): only the writer thread's contended path waits,
            # raising the timeout around its own BEGIN (see _run_batch).
            conn.execute("PRAGMA busy_timeout = 0")
            self._writer = conn
            self._writer_pid = pid
            # Reused by the lone append (see _append_lone): conn.execute makes a cursor a call.
            self._writer_cursor = conn.cursor()
            # A new connection's data_version says nothing about what the tails were read
            # under (a forked child inherits the parent's, whose writes it never sees).
            self._tails = {}
            self._tails_version = -1
        return self._writer

    def _writer_thread(self) -> concurrent.futures.ThreadPoolExecutor:
        pid = _pid
        if self._thread is None or self._thread_pid != pid:
            # A thread never survives fork: a child starts its own.
            self._thread = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="loom-sqlite-writer"
            )
            self._thread_pid = pid
        return self._thread

    async def _submit(
        self,
        apply: Callable[[sqlite3.Connection], Any],
        notify: str | None,
        *,
        feed: bool = False,
    ) -> Any:
        """Commit one write: at once when it is alone (see ``_write``), else queued and
        coalesced with every write queued meanwhile (see ``_batching``)."""
        if self._loop_share.due():
            await self._loop_share.turn()
        req, engine = self._write(apply, notify, feed)
        if engine is not None:
            return await engine.submit(req)
        if req.error is not None:
            raise req.error
        return req.result

    def _write(
        self, apply: Callable[[sqlite3.Connection], Any], notify: str | None, feed: bool
    ) -> tuple[_Request, GroupCommit[_Request] | None]:
        """The write as a request, committed here and now when it is a lone write and the write
        lock is free (engine None: ``result`` or ``error`` is its outcome), else with the engine
        to submit it to. The lone case runs no coroutine, future or yield of its own: it is
        what one execution stepping does on every step."""
        if self._closed:
            raise StorageWriteError(f"the SQLite store {self.path} is closed")
        if self.read_only:
            raise StorageWriteError(
                f"the SQLite store {self.path} was opened read-only; nothing was written",
                hint="Open it without read_only=True to write",
            )
        if self._broken is not None:
            raise StorageWriteError(
                f"the SQLite writer for {self.path} stopped after a failed commit; "
                "nothing was written. Reopen the store after checking the disk",
            ) from self._broken
        loop = asyncio.get_running_loop()
        hot = self._hot_engine
        engine = hot[1] if hot is not None and hot[0]() is loop else self._engine(loop)
        req = _Request(apply=apply, notify=notify, feed=feed)
        if engine.commit_alone(req):
            return req, None
        return req, engine

    def _engine(self, loop: asyncio.AbstractEventLoop) -> GroupCommit[_Request]:
        engine = self._engines.get(loop)
        if engine is None:
            engine = self._engines[loop] = GroupCommit(
                self._commit,
                run_now=self._commit_here,
                coalesce=self.group_commit,
                max_batch=self.max_batch,
                max_inflight=1,
                where=f"SQLite store {self.path}",
            )
        # The last loop's engine, found without the weak dictionary's lookup on every write;
        # held weakly like the loop in it, so a closed loop is never kept alive by the store.
        self._hot_engine = (weakref.ref(loop), engine)
        return engine

    async def _commit(self, batch: list[_Request]) -> None:
        """Commit ``batch``: on this thread when the write lock is free right now, else on the
        writer thread, which waits for it.

        A free lock is the common case (one process, or no other writer at this instant), and
        committing here costs no thread hand-off (which measured +75-130 µs of CPU per step on
        the development machine). A lock held by another process makes ``BEGIN IMMEDIATE``
        wait up to ``busy_timeout``: that wait, and everything after it, happens on the writer
        thread, so the event loop is never blocked behind another process's transaction.
        """
        # A lone write that found the lock busy a moment ago (``_commit_here`` from
        # ``commit_alone``) goes straight to the thread: it crossed before_append already.
        if not (len(batch) == 1 and batch[0].busy) and self._commit_here(batch):
            return
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(self._writer_thread(), self._commit_batch, batch)
        # The batch commits (or not) whatever happens to this task: wait for the thread's
        # verdict even if cancelled, so no caller is answered before its outcome is known.
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            await asyncio.wait([done])
            raise
        self._notify(batch)

    def _commit_here(self, batch: list[_Request]) -> bool:
        """Commit (or fail) ``batch`` on this thread if the write lock is free right now; False
        when it is not (the batch then waits for it on the writer thread)."""
        if not self._writer_lock.acquire(blocking=False):
            return False
        try:
            begun = self._begin_now(batch)
            if begun is _BUSY:
                for req in batch:
                    req.busy = True
                return False
            if begun is _BEGUN:
                self._run_batch(self._writer_conn(), batch, begun=True)
        finally:
            self._writer_lock.release()
        self._notify(batch)
        return True

    def _notify(self, batch: list[_Request]) -> None:
        if len(batch) == 1:  # a lone write (the common case): no lists to build
            req = batch[0]
            # Nobody waiting (the common case): nothing to build. Read without the lock: a
            # waiter registers before it re-reads the log, so it never misses this write.
            if req.error is None and self._waiters._by_execution and (req.notify or req.feed):
                self._waiters.notify([k for k in (req.notify, FEED_KEY if req.feed else None) if k])
            return
        ok = [r for r in batch if r.error is None]
        keys = [r.notify for r in ok if r.notify]
        if any(r.feed for r in ok):
            keys.append(FEED_KEY)
        self._waiters.notify(keys)

    def _begin_now(self, batch: list[_Request]) -> object:
        """Try ``BEGIN IMMEDIATE`` without waiting: _BEGUN, _BUSY (another writer holds the
        lock), or _FAILED (the batch was failed with the reason)."""
        if self._closed:
            self._fail_all(batch, StorageWriteError(f"the SQLite store {self.path} is closed"))
            return _FAILED
        if self._broken is not None:
            self._fail_all(batch, StorageWriteError(f"the SQLite writer for {self.path} stopped"))
            return _FAILED
        try:
            faults.hit("before_append")
            # The writer connection's busy timeout is 0 (see _writer_conn): a lock held by
            # another process answers SQLITE_BUSY at once instead of blocking the event loop.
            self._writer_conn().execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY:
                return _BUSY
            self._fail_all(batch, self._write_error("could not begin a write transaction", exc))
            return _FAILED
        except (sqlite3.Error, faults.InjectedFaultError) as exc:
            self._fail_all(batch, self._write_error("could not begin a write transaction", exc))
            return _FAILED
        return _BEGUN

    def _commit_batch(self, batch: list[_Request]) -> None:
        with self._writer_lock:
            if self._closed:
                self._fail_all(batch, StorageWriteError(f"the SQLite store {self.path} is closed"))
                return
            # Reached only after a busy attempt on the loop, which crossed before_append. This
            # thread may wait for the other writer: up to busy_timeout, for this batch only.
            conn = self._writer_conn()
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                self._run_batch(conn, batch, begun=False, fault_crossed=True)
            finally:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA busy_timeout = 0")

    def _run_batch(
        self,
        conn: sqlite3.Connection,
        batch: list[_Request],
        *,
        begun: bool,
        fault_crossed: bool = False,
    ) -> None:
        # Any of these writes may move a fence or a tail the lone append remembers (a start, a
        # take-over, a fork, an outcome): it reads them from the file again.
        self._tails.clear()
        if self._broken is not None:
            self._fail_all(batch, StorageWriteError(f"the SQLite writer for {self.path} stopped"))
            return
        if not begun:
            try:
                if not fault_crossed:
                    faults.hit("before_append")
                conn.execute("BEGIN IMMEDIATE")
            except (sqlite3.Error, faults.InjectedFaultError) as exc:
                self._fail_all(batch, self._write_error("could not begin a write transaction", exc))
                return
        try:
            applied = 0
            for req in batch:
                # A request either applies fully or raises a refusal having left nothing
                # behind (each apply compensates its own partial writes), so coalesced requests
                # need no SAVEPOINT each: a refusal fails only its own caller.
                try:
                    req.result = req.apply(conn)
                    applied += 1
                except LoomError as refusal:
                    req.error = refusal
            if not applied:
                conn.execute("ROLLBACK")
                return
            faults.hit("before_commit")
        except BaseException as exc:
            # A statement failed for a reason that is not a refusal (disk full, I/O error):
            # nothing of this batch is committed, and every caller in it is told so.
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            self._fail_all(batch, self._write_error("a write statement failed", exc))
            return
        try:
            conn.execute("COMMIT")
        except BaseException as exc:
            self._broken = exc
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            self._fail_all(batch, self._write_error("COMMIT failed; the writer stopped", exc))
            return
        try:
            faults.hit("after_append_before_ack")
        except BaseException as exc:
            # Committed, but the acknowledgement failed: every caller must hear about it (none
            # may hang), and none may assume nothing was written.
            self._fail_all(batch, self._unacknowledged(exc))

    def _unacknowledged(self, exc: BaseException) -> StorageWriteError:
        """A batch that committed but whose acknowledgement failed."""
        err = StorageWriteError(
            f"SQLite store {self.path}: the batch committed but its acknowledgement failed: {exc}",
            hint="Re-read the execution before retrying: the write is durable",
            outcome=WriteOutcome.COMMITTED,
        )
        err.__cause__ = exc
        return err

    def _write_error(self, what: str, exc: BaseException) -> StorageWriteError:
        err = StorageWriteError(f"SQLite store {self.path}: {what}: {exc}")
        err.__cause__ = exc
        return err

    def _fail_all(self, batch: list[_Request], error: StorageWriteError) -> None:
        for req in batch:
            req.error = error
            req.result = None

    # ---------------------------------------------------------------- EventStore

    async def append(self, envelopes: Sequence[Envelope]) -> None:
        if self._loop_share.due():
            await self._loop_share.turn()
        if len(envelopes) == 1:
            lone = self._append_lone(envelopes[0])
            if lone is True:
                return
            if lone is not False:
                await lone[1].submit(lone[0])  # the lock was busy: the writer thread waits
                return
        # Built and written here (not through _submit): one coroutine fewer on every step.
        apply, execution_id, feed = self._append_write(envelopes, None, "")
        req, engine = self._write(apply, execution_id, feed)
        if engine is not None:
            await engine.submit(req)
        elif req.error is not None:
            raise req.error

    def append_now(self, envelope: Envelope) -> bool | Awaitable[None]:
        """See :class:`loom.storage.AppendsNow`: the lone append of :meth:`append`, run in the
        caller's frame (False when the loop is due a turn, or the record needs the general
        path)."""
        if self._loop_share.due():
            return False
        lone = self._append_lone(envelope)
        if lone is True or lone is False:
            return lone
        return lone[1].submit(lone[0])  # another process holds the lock: the writer waits

    async def append_with_blobs(
        self, envelopes: Sequence[Envelope], blobs: Mapping[str, bytes], *, namespace: str = ""
    ) -> None:
        """Append ``envelopes`` and put ``blobs`` in one transaction (see AppendsWithBlobs)."""
        check_blobs(blobs)
        apply, execution_id, feed = self._append_write(envelopes, blobs, namespace)
        await self._submit(apply, execution_id, feed=feed)

    def _append_lone(self, env: Envelope) -> bool | tuple[_Request, GroupCommit[_Request]]:
        """Commit one plain record (a step's, say) here and now, straight through: what
        ``_append_write``, ``_write``, ``commit_alone``, ``_commit_here`` and ``_run_batch``
        do for it, with the same statements, checks, fault points and errors, without their
        closure, request, batch list and calls (a few µs of every step).

        True: committed (or refused: raised). False: not such a write, or not alone (another
        write is collecting, running or ready, or the store cannot write): nothing was done,
        not even a fault point crossed, and the general path takes it. A request and its
        engine: another process holds the write lock (``before_append`` was crossed), so the
        request goes to the engine, whose writer thread waits for the lock.

        Only a record that moves no summary, after sequence 0, under its derived id, with no
        reserved ids in the file: anything else needs the general path's extra writes.
        """
        if (
            self._reserved
            or self._closed
            or self.read_only
            or self._broken is not None
            or not plain_record(env)
        ):
            return False
        execution_id, sequence, fence = env.execution_id, env.sequence, env.fence
        loop = asyncio.get_running_loop()
        hot = self._hot_engine
        engine = hot[1] if hot is not None and hot[0]() is loop else self._engine(loop)
        if not engine.alone(loop):
            return False
        lock = self._writer_lock
        if not lock.acquire(blocking=False):
            return False
        error: BaseException | None = None
        try:
            conn = self._writer
            cur = self._writer_cursor
            if conn is None or cur is None or self._writer_pid != _pid:
                conn = self._writer_conn()
                cur = self._writer_cursor
                assert cur is not None
            try:
                if faults.ARMED:
                    faults.hit("before_append")
                # Busy timeout 0 on the writer (see _writer_conn): a lock held by another
                # process answers SQLITE_BUSY at once instead of blocking the event loop.
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                    raise self._write_error("could not begin a write transaction", exc) from exc
                apply, _, _ = self._append_write([env], None, "")
                return _Request(apply=apply, notify=execution_id, busy=True), engine
            except (sqlite3.Error, faults.InjectedFaultError) as exc:
                raise self._write_error("could not begin a write transaction", exc) from exc
            try:
                # The checks of _append_write's apply: the fence and the tail read inside the
                # write transaction; the row as event_row writes it (derived id stored empty).
                # The fence and tail this writer itself committed last for the execution are
                # still the file's when no other connection has committed since (data_version,
                # read inside this transaction, is as it was then: SQLite's own contract) and
                # no other write of this store has run (_run_batch forgets them): then they are
                # not read again, one statement instead of three seeks.
                tails = self._tails
                version = cur.execute("PRAGMA data_version").fetchone()[0]
                if version != self._tails_version:
                    tails.clear()
                    self._tails_version = version
                known = tails.pop(execution_id, None)
                if known is None:
                    current_fence, last, last_type = cur.execute(
                        APPEND_CHECK, (execution_id,)
                    ).fetchone()
                else:
                    current_fence, last, last_type = known
                if current_fence != fence or last != sequence - 1:
                    error = refusal_for(
                        execution_id,
                        sequence,
                        fence,
                        0 if current_fence is None else int(current_fence),
                        0 if last is None else int(last) + 1,
                    )
                if error is None and last_type in TERMINAL_TYPES:
                    error = ended(execution_id, last_type)
                if error is None:
                    try:
                        cur.execute(
                            INSERT_EVENT,
                            (
                                execution_id,
                                sequence,
                                "",
                                str(env.type),
                                env.payload_json,
                                env.recorded_at,
                                fence,
                                env.checksum(),
                            ),
                        )
                    except sqlite3.IntegrityError as exc:
                        error = DuplicateEnvelopeIdError(
                            f"an envelope id of this batch is already stored ({exc})",
                            execution_id=execution_id,
                        )
                        error.__cause__ = exc
                if error is not None:
                    cur.execute("ROLLBACK")  # a refusal: nothing of it stays
                    return True
                if faults.ARMED:
                    faults.hit("before_commit")
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                error = self._write_error("a write statement failed", exc)
                return True
            try:
                cur.execute("COMMIT")
            except BaseException as exc:
                self._broken = exc
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                error = self._write_error("COMMIT failed; the writer stopped", exc)
                return True
            # Committed: this record is the execution's tail now (nothing else moved: the
            # transaction held the write lock). Remembered only here, so any refusal or failure
            # above leaves the execution unknown (popped) and read again next time.
            if len(tails) >= _TAILS_KEPT:
                tails.clear()
            tails[execution_id] = (fence, sequence, env.type)
            try:
                if faults.ARMED:
                    faults.hit("after_append_before_ack")
            except BaseException as exc:
                error = self._unacknowledged(exc)
                return True
        finally:
            lock.release()
            if error is not None:
                raise error
        # Nobody waiting (the common case): nothing to build. Read without the lock: a waiter
        # registers before it re-reads the log, so it never misses this write.
        if self._waiters._by_execution:
            self._waiters.notify([execution_id])
        return True

    def _append_write(
        self, envelopes: Sequence[Envelope], blobs: Mapping[str, bytes] | None, namespace: str
    ) -> tuple[Callable[[sqlite3.Connection], None], str, bool]:
        """The append as a write for the writer: (apply, execution id, feeds the index)."""
        execution_id, first, fence = batch_head(envelopes)
        if self._reserved:
            check_reserved(envelopes, self._reserved)
        blob_rows = [(namespace, k, bytes(v)) for k, v in (blobs or {}).items()]
        rows = [event_row(e) for e in envelopes]
        change = summary_change(envelopes)

        def apply(conn: sqlite3.Connection) -> None:
            if blob_rows:  # kept even if the append is refused: an unnamed blob is harmless
                conn.executemany(
                    "INSERT OR IGNORE INTO loom_blobs (namespace, hash, data) VALUES (?, ?, ?)",
                    blob_rows,
                )
            # One B-tree write per step: the fence and the next sequence are READ inside the
            # write transaction (BEGIN IMMEDIATE excludes every other writer, in any process,
            # until COMMIT), and only the events table is written. The head row moves only on
            # a start, a take-over or a fence change.
            current_fence, next_sequence, last_type = append_check(conn, execution_id)
            refusal = refusal_for(execution_id, first, fence, current_fence, next_sequence)
            if refusal is None and last_type in TERMINAL_TYPES:
                # Nothing follows a terminal event (the tail read above already holds its type).
                refusal = ended(execution_id, last_type)
            if refusal is not None:
                raise refusal
            if first == 0:  # a start: the head records that the execution exists
                conn.execute(
                    "UPDATE loom_heads SET next_sequence = ? WHERE execution_id = ?",
                    (len(rows), execution_id),
                )
            insert_or_undo(
                conn,
                execution_id,
                rows,
                first,
                lambda: (
                    conn.execute(
                        "UPDATE loom_heads SET next_sequence = 0 WHERE execution_id = ?",
                        (execution_id,),
                    )
                    if first == 0
                    else None
                ),
            )
            if change is not None:
                write_index(conn, change)

        return apply, execution_id, change is not None

    async def take_over(self, envelopes: Sequence[Envelope], *, from_fence: int) -> None:
        execution_id, first = check_take_over(envelopes, from_fence)
        apply, feed = self._take_over_write(envelopes, from_fence, execution_id, first)
        await self._submit(apply, execution_id, feed=feed)

    async def take_over_many(self, requests: Sequence[TakeOver]) -> list[LoomError | None]:
        """See :meth:`loom.storage.TakesOverMany.take_over_many`: one transaction. Each
        request's statements either all apply or undo themselves before its refusal is raised
        (as in a coalesced batch), so one refusal needs no SAVEPOINT and fails only itself."""
        heads = check_take_overs(requests)
        if self._reserved:
            for envelopes, _ in requests:
                check_reserved(envelopes, self._reserved)
        rows = [[event_row(e) for e in envelopes] for envelopes, _ in requests]
        changes = [summary_change(envs) for envs, _ in requests]

        def apply(conn: sqlite3.Connection) -> list[LoomError | None]:
            # Checked one by one (one statement each), written all at once: the transaction
            # excludes every other writer, so nothing moves in between.
            outcomes: list[LoomError | None] = []
            ok: list[int] = []
            for i, ((eid, first), (_, from_fence)) in enumerate(zip(heads, requests, strict=True)):
                fence, next_sequence, last_type = append_check(conn, eid)
                refusal = take_over_refusal(eid, first, from_fence, fence, next_sequence)
                if refusal is None and last_type in TERMINAL_TYPES:
                    refusal = ended(eid, last_type)
                outcomes.append(refusal)
                if refusal is None:
                    ok.append(i)
            if not ok:
                return outcomes
            conn.execute("SAVEPOINT loom_take_overs")
            try:
                conn.executemany(
                    "UPDATE loom_heads SET fence = ?, next_sequence = ? WHERE execution_id = ?",
                    [
                        (requests[i][1] + 1, heads[i][1] + len(requests[i][0]), heads[i][0])
                        for i in ok
                    ],
                )
                conn.executemany(INSERT_EVENT, [row for i in ok for row in rows[i]])
                indexed = [c for i in ok if (c := changes[i]) is not None]
                if indexed:
                    write_indexes(conn, indexed)
            except sqlite3.IntegrityError:
                # An envelope id already stored: undo them all, then one at a time (each
                # undoes its own writes before its refusal), so only that one is refused.
                conn.execute("ROLLBACK TO loom_take_overs")
                conn.execute("RELEASE loom_take_overs")
                for i in ok:
                    # (built only here: a collision is rare, the closures are not free)
                    eid, first = heads[i]
                    change = changes[i]
                    try:
                        self._take_over_rows(rows[i], eid, first, requests[i][1])(conn)
                    except LoomError as refusal:
                        outcomes[i] = refusal
                    else:
                        if change is not None:  # its index row, as take_over writes it
                            write_index(conn, change)
                return outcomes
            conn.execute("RELEASE loom_take_overs")
            return outcomes

        outcomes: list[LoomError | None] = await self._submit(apply, None)
        keys = [eid for (eid, _), refusal in zip(heads, outcomes, strict=True) if refusal is None]
        if keys and self._waiters._by_execution:
            if any(
                change for change, refusal in zip(changes, outcomes, strict=True) if not refusal
            ):
                keys.append(FEED_KEY)
            self._waiters.notify(keys)
        return outcomes

    def _take_over_write(
        self, envelopes: Sequence[Envelope], from_fence: int, execution_id: str, first: int
    ) -> tuple[Callable[[sqlite3.Connection], None], bool]:
        """The take-over as a write for the writer: (apply, feeds the index)."""
        if self._reserved:
            check_reserved(envelopes, self._reserved)
        rows = [event_row(e) for e in envelopes]
        change = summary_change(envelopes)
        apply = self._take_over_rows(rows, execution_id, first, from_fence)
        if change is None:
            return apply, False

        def apply_indexed(conn: sqlite3.Connection) -> None:
            apply(conn)
            write_index(conn, change)

        return apply_indexed, True

    def _take_over_rows(
        self, rows: list[tuple[Any, ...]], execution_id: str, first: int, from_fence: int
    ) -> Callable[[sqlite3.Connection], None]:
        """The take-over of ``rows`` (its events), without the index row."""
        count = len(rows)

        def apply(conn: sqlite3.Connection) -> None:
            head = conn.execute(
                "SELECT fence, next_sequence FROM loom_heads WHERE execution_id = ?",
                (execution_id,),
            ).fetchone()
            current_fence = head[0] if head is not None else 0
            next_sequence = next_sequence_of(conn, execution_id)
            refusal = take_over_refusal(
                execution_id, first, from_fence, current_fence, next_sequence
            )
            if refusal is not None:
                raise refusal
            refusal = ended_refusal(conn, execution_id, first)
            if refusal is not None:
                raise refusal
            conn.execute(
                "INSERT INTO loom_heads (execution_id, fence, next_sequence) VALUES (?, ?, ?) "
                "ON CONFLICT (execution_id) DO UPDATE SET fence = excluded.fence, "
                "next_sequence = excluded.next_sequence",
                (execution_id, from_fence + 1, first + count),
            )

            def undo_head() -> None:
                if head is None:
                    conn.execute("DELETE FROM loom_heads WHERE execution_id = ?", (execution_id,))
                else:
                    conn.execute(
                        "UPDATE loom_heads SET fence = ?, next_sequence = ? WHERE execution_id = ?",
                        (head[0], head[1], execution_id),
                    )

            insert_or_undo(conn, execution_id, rows, first, undo_head)

        return apply

    async def read(
        self, execution_id: str, *, from_sequence: int = 0, limit: int | None = None
    ) -> list[Envelope]:
        try:
            rows = (
                self._reader()
                .execute(
                    "SELECT envelope_id, sequence, type, payload, recorded_at, fence, checksum "
                    "FROM loom_events WHERE execution_id = ? AND sequence >= ? ORDER BY sequence "
                    "LIMIT ?",
                    (execution_id, from_sequence, -1 if limit is None else max(limit, 0)),
                )
                .fetchall()
            )
        except sqlite3.OperationalError as exc:
            raise self._undecodable(execution_id, from_sequence, exc) from exc
        limits = self.limits
        return [
            decode_envelope(execution_id, r[0], r[1], r[2], r[3], r[4], r[5], r[6], limits)
            for r in rows
        ]

    def _undecodable(
        self, execution_id: str, from_sequence: int, exc: sqlite3.OperationalError
    ) -> Exception:
        """CorruptEventError naming the record whose text is not UTF-8 (a flipped bit on
        disk), found by reading the raw bytes; any other OperationalError is a StorageError."""
        if "decode" not in str(exc):
            return StorageError(f"SQLite store {self.path}: reading {execution_id!r} failed: {exc}")
        rows = (
            self._reader()
            .execute(
                "SELECT sequence, CAST(envelope_id AS BLOB), CAST(type AS BLOB), "
                "CAST(payload AS BLOB), CAST(checksum AS BLOB) FROM loom_events "
                "WHERE execution_id = ? AND sequence >= ? ORDER BY sequence",
                (execution_id, from_sequence),
            )
            .fetchall()
        )
        for sequence, *columns in rows:
            try:
                for column in columns:
                    column.decode()
            except (UnicodeDecodeError, AttributeError):
                return CorruptEventError(
                    f"event {sequence} of execution {execution_id!r} is not valid UTF-8",
                    execution_id=execution_id,
                    sequence=sequence,
                )
        return CorruptEventError(
            f"a record of execution {execution_id!r} is not valid UTF-8",
            execution_id=execution_id,
        )

    async def last_sequence(self, execution_id: str) -> int:
        row = self._reader().execute(LAST_SEQUENCE, (execution_id,)).fetchone()
        return -1 if row is None or row[0] is None else int(row[0])

    async def acquire_fence(self, execution_id: str) -> int:
        def apply(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "INSERT INTO loom_heads (execution_id, fence, next_sequence) VALUES (?, 1, 0) "
                "ON CONFLICT (execution_id) DO UPDATE SET fence = fence + 1 RETURNING fence",
                (execution_id,),
            ).fetchone()
            return int(row[0])

        result: int = await self._submit(apply, None)
        return result

    async def current_fence(self, execution_id: str) -> int:
        row = (
            self._reader()
            .execute("SELECT fence FROM loom_heads WHERE execution_id = ?", (execution_id,))
            .fetchone()
        )
        return int(row[0]) if row else 0

    async def iterate_execution_ids(
        self, *, after: str | None = None, page_size: int = 256
    ) -> AsyncIterator[str]:
        cursor = after if after is not None else ""
        first_page = after is None
        while True:
            rows = (
                self._reader()
                .execute(
                    "SELECT execution_id FROM loom_heads WHERE next_sequence > 0 AND "
                    "(execution_id > ? OR ?) ORDER BY execution_id LIMIT ?",
                    (cursor, 1 if first_page else 0, page_size),
                )
                .fetchall()
            )
            first_page = False
            for (execution_id,) in rows:
                yield execution_id
            if len(rows) < page_size:
                return
            cursor = rows[-1][0]

    async def wait_for_append(
        self, execution_id: str, after_sequence: int, *, timeout: float | None = None
    ) -> int:
        # In-process appends wake waiters at once; other processes' appends are seen by the
        # shared change watch (a stat of the files per interval, not a query per waiter).
        if self._watch is None:
            return await self._waiters.wait(
                execution_id, after_sequence, timeout, self.last_sequence, self.poll_interval
            )
        with self._watch.watching():
            return await self._waiters.wait(
                execution_id, after_sequence, timeout, self.last_sequence, _SAFETY_POLL
            )

    # ---------------------------------------------------------------- ExecutionIndex

    # The list, count, summary and feed reads are in ``_sqlite_index``.

    async def _last_cursor(self, _key: str = "") -> int:
        row = self._reader().execute("SELECT max(cursor) FROM loom_executions").fetchone()
        return int(row[0] or 0)

    async def wait_for_changes(self, after: int, *, timeout: float | None = None) -> int:
        """See :meth:`loom.storage.ExecutionIndex.wait_for_changes` (this process's writes
        wake it at once; other processes' are seen by polling every ``poll_interval``)."""
        return await self._waiters.wait(
            FEED_KEY, after, timeout, self._last_cursor, self.poll_interval
        )

    # ---------------------------------------------------------------- SnapshotStore

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        check_snapshot(snapshot)  # before the writer: a bad key must never stop it
        state_json = encode_json(snapshot.state, limits=SNAPSHOT_LIMITS, what="snapshot")
        eid, seq = snapshot.execution_id, snapshot.sequence
        row = (eid, seq, state_json, snapshot_checksum(eid, seq, state_json))

        def apply(conn: sqlite3.Connection) -> None:
            cur = conn.execute(
                "INSERT INTO loom_snapshots (execution_id, sequence, state, checksum) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (execution_id) DO UPDATE SET "
                "sequence = excluded.sequence, state = excluded.state, "
                "checksum = excluded.checksum WHERE excluded.sequence > loom_snapshots.sequence "
                "AND NOT EXISTS (SELECT 1 FROM loom_snapshot_segments g WHERE "
                "g.execution_id = excluded.execution_id AND g.sequence >= excluded.sequence)",
                row,
            )
            if cur.rowcount:  # the whole state replaces the chain it covers
                conn.execute(
                    "DELETE FROM loom_snapshot_segments WHERE execution_id = ? AND sequence <= ?",
                    (eid, seq),
                )

        faults.hit("before_snapshot")
        await self._submit(apply, None)

    async def save_snapshot_segment(self, segment: Snapshot, base: int) -> bool:
        """See :meth:`loom.storage.SnapshotSegments.save_snapshot_segment`."""
        check_snapshot(segment)
        state_json = encode_json(segment.state, limits=SNAPSHOT_LIMITS, what="snapshot")
        eid, seq = segment.execution_id, segment.sequence
        row = (eid, seq, base, state_json, segment_checksum(eid, seq, base, state_json))

        def apply(conn: sqlite3.Connection) -> bool:
            head = conn.execute(
                "SELECT max(s.sequence, coalesce((SELECT max(sequence) FROM "
                "loom_snapshot_segments WHERE execution_id = s.execution_id), -1)) "
                "FROM loom_snapshots s WHERE s.execution_id = ?",
                (eid,),
            ).fetchone()
            if head is None or head[0] != base or not base < seq:
                return False
            conn.execute(
                "INSERT INTO loom_snapshot_segments (execution_id, sequence, base, state, "
                "checksum) VALUES (?, ?, ?, ?, ?)",
                row,
            )
            return True

        faults.hit("before_snapshot")
        return bool(await self._submit(apply, None))

    async def load_snapshot(self, execution_id: str) -> Snapshot | None:
        try:
            # The whole row first (kind 0), then its segments in order: one query.
            rows = (
                self._reader()
                .execute(
                    "SELECT 0, sequence, -1, state, checksum FROM loom_snapshots "
                    "WHERE execution_id = ?1 UNION ALL "
                    "SELECT 1, sequence, base, state, checksum FROM loom_snapshot_segments "
                    "WHERE execution_id = ?1 ORDER BY 1, 2",
                    (execution_id,),
                )
                .fetchall()
            )
        except sqlite3.OperationalError as exc:
            if "decode" not in str(exc):
                raise StorageError(
                    f"SQLite store {self.path}: reading a snapshot failed: {exc}"
                ) from exc
            raise CorruptEventError(
                f"the snapshot of {execution_id!r} is not valid UTF-8", execution_id=execution_id
            ) from exc
        if not rows or rows[0][0] != 0:
            return None
        whole = decode_snapshot(execution_id, rows[0][1], rows[0][3], rows[0][4])
        if len(rows) == 1:
            return whole
        return merge_segments(whole, [(r[1], r[2], r[3], r[4]) for r in rows[1:]])

    async def load_many(self, execution_ids: Sequence[str]) -> dict[str, StoredExecution]:
        """See :meth:`loom.storage.LoadsMany.load_many`: one SELECT per 256 ids."""
        loaded: dict[str, StoredExecution] = {}
        for chunk in chunks(execution_ids):
            try:
                rows = self._reader().execute(sqlite_load_many(len(chunk)), chunk).fetchall()
            except sqlite3.OperationalError as exc:
                if "decode" not in str(exc):
                    raise StorageError(
                        f"SQLite store {self.path}: loading executions failed: {exc}"
                    ) from exc
                # Which record is not UTF-8 is found by the one-at-a-time loads it falls back to.
                raise CorruptEventError(
                    f"a record of {len(chunk)} executions is not valid UTF-8"
                ) from exc
            found, beyond = assemble(rows, self.limits)
            loaded.update(found)
            await add_beyond(loaded, beyond, self.last_sequence)
        return loaded

    # ---------------------------------------------------------------- lifecycle

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._watch is not None:
            self._watch.stop()
        thread, self._thread = self._thread, None
        if thread is not None and self._thread_pid == os.getpid():
            # Batches already on the thread finish (their callers hear the outcome); later
            # ones find the store closed.
            await asyncio.get_running_loop().run_in_executor(None, thread.shutdown)
        with self._writer_lock:
            writer, self._writer = self._writer, None
            if writer is not None and self._writer_pid == os.getpid():
                writer.close()
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            try:
                conn.close()
            except sqlite3.Error:
                pass

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, synchronous={self.synchronous!r})"
