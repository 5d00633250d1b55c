"""The lone write's round trip, and a batch's, as libpq calls on the writer's connections.

A lone write (the common case: one step's append) is one autocommit statement. Through a psycopg
cursor it pays for the cursor's query conversion, parameter adaptation, prepared-statement
bookkeeping and a generic wait (a poll, a timer and the reader's registration per round trip):
about as much client CPU as the rest of the append. Here the statement is converted to ``$n``
form and prepared once per connection under a name of our own, its scalar parameters are
encoded straight to text, and the answer is awaited on one reader callback.

When nothing else is ready to run on the event loop and no other write of the store is in flight
on another connection (one execution stepping: the common case), the answer is first waited for
in ``poll()``, for at most :data:`LONE_WAIT` (and never past the loop's next timer): a commit's
answer usually comes well within it, and waiting on the loop instead (a future, the reader's
registration, two loop iterations) costs about as much client CPU and wall time again as the
rest of the round trip. The same ``poll()`` watches the loop's own selector (epoll, kqueue),
whose descriptor is readable while anything the loop watches is ready: a read's answer on
another connection, a request to an HTTP worker, another store's write, a thread's result. It
ends the wait at once, the answer is then awaited on the loop beside it, and the next write
first lets the loop run. So the loop is held only while nothing else has anything to do. (A
write still lets the loop take a pass once every ``SHARE_LOOP_EVERY``, as the other stores'
writes do; on a loop without such a descriptor, uvloop's say, that pass and the budget are what
bound the wait of other I/O.) An answer that takes longer than the budget (a lock wait, a slow
server) is awaited on the loop. SQLite's lone write blocks the loop for its whole commit; this
is the same idea, bounded.

A batch of several writes (group commit under concurrent flows) is sent the same way, in libpq's
pipeline mode: ``BEGIN``, the change cursor's lock if a write takes it, and every statement in
one round trip (:meth:`LeanStatements.begin_and_run`); the writer then settles each answer and
commits as before. Through psycopg's pipeline each statement cost its own cursor, conversion and
adaptation: ~30% of the client's CPU under 1,000 concurrent flows.

Only scalar parameters (``str``, ``int``, ``float``, ``bool``, ``None``) take this path; a
statement with arrays or bytes, or text holding a NUL (which libpq would cut short), goes through
psycopg as before. A prepared statement dropped
behind our back (a pooler's ``DISCARD ALL``, psycopg's own ``DEALLOCATE ALL`` after a
``ROLLBACK`` on the connection) is prepared again and the statement sent again: it never ran.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import operator
import re
import select
import struct
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
import psycopg.errors
from psycopg import pq

from loom._aio import LoopShare
from loom.storage._postgres_sql import MAX_NOTE_BYTES, Conn

__all__ = ["LONE_WAIT", "LeanStatements", "PlainAppend", "forget_prepared", "lean_values"]

#: Seconds a lone write may wait for its answer without yielding the event loop (see above).
LONE_WAIT = 0.002

#: Seconds a cancel request for an abandoned lone write may take (see LeanStatements._abandon).
CANCEL_TIMEOUT = 2.0

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%")

# Parameter types sent with the PREPARE: the server then needs no inference (an untyped integer
# beside ``- 1`` would be taken as int4), and a value's type picks its own prepared statement.
_TEXT, _INT8, _FLOAT8, _BOOL, _UNKNOWN = 25, 20, 701, 16, 0

#: Numbers of the statements this path prepares: never reused in a process, so no name collides
#: with one still held by a connection that went back to the pool and is checked out again, or
#: with one the server kept after our cache was cleared.
_statement_numbers = itertools.count(1)


def _convert(sql: str) -> tuple[bytes, tuple[str, ...] | int]:
    """``sql`` with psycopg placeholders (all named or all positional) in ``$n`` form, and its
    parameter names (or count). Called once per statement: :func:`_statement` keeps it."""
    names: list[str] = []
    count = 0

    def number(m: re.Match[str]) -> str:
        nonlocal count
        if m.group(0) == "%%":
            return "%"
        name = m.group(1)
        if name is None:
            count += 1
            return f"${count}"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    text = _PLACEHOLDER.sub(number, sql)
    if names and count:
        raise ValueError("a statement mixes named and positional placeholders")
    return text.encode(), tuple(names) if names else count


def _none(value: None) -> None:
    return None


def _bool(value: bool) -> bytes:
    return b"t" if value else b"f"


#: How each scalar type is sent: (its encoder, its type). Floats go in binary (IEEE 754, big
#: endian: exactly the value, NaN and infinities included), the rest as text; the encoders are
#: C callables for the common types, so a write's values are encoded in one ``map``.
_ENCODERS: dict[type, tuple[Callable[[Any], bytes | None], int]] = {
    str: (str.encode, _TEXT),
    int: (b"%d".__mod__, _INT8),
    float: (struct.Struct(">d").pack, _FLOAT8),
    bool: (_bool, _BOOL),
    type(None): (_none, _UNKNOWN),
}

#: How one statement's parameters are sent, for one combination of their Python types: each
#: value's encoder, the types sent with the PREPARE, and a function picking the encoded text
#: values out (checked for a NUL in one scan; None: there are none); None when a parameter is
#: not a scalar (psycopg adapts it).
_Plan = tuple[
    tuple[Callable[[Any], bytes | None], ...],
    tuple[int, ...],
    Callable[[list[bytes | None]], Any] | None,
]

#: By statement: its ``$n`` text, the picker of its named parameters in ``$n`` order (C code;
#: None for positional ones, whose count is checked instead) and its plans by its parameters'
#: types (a statement's writes come in a handful of type combinations: a value is None or not).
_Statement = tuple[
    bytes,
    Callable[[Mapping[str, Any]], Any] | None,
    int,
    dict[tuple[type, ...], _Plan | None],
]
_statements: dict[str, _Statement] = {}


def _plan(kinds: tuple[type, ...]) -> _Plan | None:
    encoders: list[Callable[[Any], bytes | None]] = []
    types: list[int] = []
    for kind in kinds:
        encoder = _ENCODERS.get(kind)
        if encoder is None:
            if not issubclass(kind, str):
                return None  # arrays, bytes, anything else: psycopg adapts them
            encoder = _ENCODERS[str]  # a str subclass (an enum's value)
        encoders.append(encoder[0])
        types.append(encoder[1])
    texts = [i for i, t in enumerate(types) if t == _TEXT]
    pick_texts: Callable[[list[bytes | None]], Any] | None = None
    if len(texts) == 1:  # a slice: a list of one, as joinable as the tuple of several
        pick_texts = operator.itemgetter(slice(texts[0], texts[0] + 1))
    elif texts:
        pick_texts = operator.itemgetter(*texts)
    return tuple(encoders), tuple(types), pick_texts


def _statement(sql: str) -> _Statement:
    found = _statements.get(sql)
    if found is None:
        text, shape = _convert(sql)
        if type(shape) is tuple:
            found = (text, _picker(shape), -1, {})
        else:
            assert type(shape) is int
            found = (text, None, shape, {})
        _statements[sql] = found
    return found


def lean_values(
    sql: str, params: Mapping[str, Any] | Sequence[Any]
) -> tuple[bytes, list[bytes | None], tuple[int, ...]] | None:
    """(the ``$n`` statement, its encoded values, their types), or None when a parameter is not
    a scalar (the write then goes through psycopg)."""
    text, picker, count, plans = _statements.get(sql) or _statement(sql)
    ordered: Sequence[Any]
    if picker is not None:
        if type(params) is not dict and not isinstance(params, Mapping):
            return None
        ordered = picker(params)
    else:
        if isinstance(params, Mapping) or len(params) != count:
            return None
        ordered = params
    kinds = tuple(map(type, ordered))
    try:
        plan = plans[kinds]
    except KeyError:
        plan = plans[kinds] = _plan(kinds)
    if plan is None:
        return None
    encoders, types, pick_texts = plan
    values: list[bytes | None] = list(map(operator.call, encoders, ordered))
    if pick_texts is not None and b"\0" in b"".join(pick_texts(values)):
        # libpq sends a text parameter up to its first NUL: the rest would be dropped
        # silently. psycopg refuses it (a DataError), as the write did before this path.
        return None
    return text, values, types


#: The parameters of the plain append statement (``Statements.events("append", one=True)``)
#: in ``$n`` order, with notify and without: what :class:`PlainAppend` encodes directly.
_PLAIN_NAMES = ("end", "ends", "eid", "fence", "first", "id", "type", "payload", "at", "sum")
_PLAIN_TYPES = (_INT8, _BOOL, _TEXT, _INT8, _INT8, _TEXT, _TEXT, _TEXT, _FLOAT8, _TEXT)
_pack_float = struct.Struct(">d").pack
_format_int = b"%d".__mod__


class PlainAppend:
    """The lean values of one statement, the plain append (one step's record: what one
    execution stepping writes every time), encoded straight from the record's parts instead of
    through a dict of parameters and :func:`lean_values`' generic plan (a fifth of the append's
    client CPU). The same bytes and types as ``lean_values(sql, params)``.
    """

    __slots__ = ("_channel", "_text", "_types")

    def __init__(self, sql: str, channel: str) -> None:
        text, names = _convert(sql)
        notify = names == (*_PLAIN_NAMES, "channel", "note")
        if not notify and names != _PLAIN_NAMES:
            raise ValueError(f"not the plain append statement: its parameters are {names}")
        self._text = text
        self._types = (*_PLAIN_TYPES, _TEXT, _TEXT) if notify else _PLAIN_TYPES
        self._channel = channel.encode() if notify else None

    def values(
        self,
        execution_id: str,
        sequence: int,
        fence: int,
        ends: bool,
        type: str,
        payload: str,
        recorded_at: float,
        checksum: str,
    ) -> tuple[bytes, list[bytes | None], tuple[int, ...]] | None:
        """(the ``$n`` statement, its encoded values, their types), as :func:`lean_values`
        encodes the store's parameters (the note: the execution id, if it fits one); None for
        text holding a NUL, as there (the store refuses one before, this is the last guard)."""
        eid = execution_id.encode()
        kind = type.encode()
        text = payload.encode()
        if b"\0" in eid or b"\0" in kind or b"\0" in text:
            return None
        values: list[bytes | None] = [
            _format_int(sequence + 1),
            b"t" if ends else b"f",
            eid,
            _format_int(fence),
            _format_int(sequence),
            b"",  # the derived id, stored empty (schema rung 10)
            kind,
            text,
            _pack_float(recorded_at),
            checksum.encode(),
        ]
        if self._channel is not None:
            values.append(self._channel)
            values.append(eid if len(eid) <= MAX_NOTE_BYTES else b"")
        return self._text, values, self._types


def _picker(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], Sequence[Any]]:
    pick = operator.itemgetter(*names)
    if len(names) == 1:
        return lambda params: (pick(params),)
    return pick


def _idle_budget(loop: asyncio.AbstractEventLoop) -> float:
    """How long the loop may be held now: :data:`LONE_WAIT` if no callback is ready to run,
    less if a timer is due sooner; 0 if something is ready (or the loop is not asyncio's own,
    whose queues are not known)."""
    ready = getattr(loop, "_ready", None)
    scheduled = getattr(loop, "_scheduled", None)
    if ready is None or scheduled is None or ready:
        return 0.0
    if scheduled:
        due: float = scheduled[0].when()
        return min(LONE_WAIT, due - loop.time())
    return LONE_WAIT


def _retrieved(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


def _selector_fd(loop: asyncio.AbstractEventLoop) -> int | None:
    """The file descriptor of the loop's selector, if it has one (asyncio's selector loop on
    epoll or kqueue); None otherwise (a poll or select selector, uvloop, a proactor)."""
    selector = getattr(loop, "_selector", None)
    fileno = getattr(selector, "fileno", None)
    if fileno is None:
        return None
    try:
        fd = fileno()
    except (OSError, ValueError):  # closed
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


async def forget_prepared(conn: Conn) -> None:
    """Make psycopg forget the statements it prepared on ``conn`` (they were dropped behind
    its back, and it would keep naming them): it clears its cache when it sees a
    ``DEALLOCATE ALL`` go through, and prepares them again on their next uses."""
    await conn.execute("DEALLOCATE ALL")


def _wake(loop: asyncio.AbstractEventLoop, fd: int, write: bool, fut: asyncio.Future[None]) -> None:
    # Unregistered here, not after the waiting task resumes: the socket stays readable until
    # then, so the loop's next poll would queue this callback again, and that queued (then
    # cancelled) handle makes the group commit see "another writer ready" and yield a loop
    # iteration on every write.
    if write:
        loop.remove_writer(fd)
    else:
        loop.remove_reader(fd)
    if not fut.done():
        fut.set_result(None)


class LeanStatements:
    """The statements prepared on one connection by this path, and its round trip.

    Used only while the writer holds the connection for one batch, so never concurrently.
    """

    def __init__(
        self,
        conn: Conn,
        *,
        spin_wait: float = 0.0,
        others_writing: Callable[[], bool] | None = None,
    ) -> None:
        #: Seconds a lone write's answer is spun for before the blocking wait (see
        #: PostgresStore's ``spin_wait``); never beyond that wait's budget.
        self.spin_wait = spin_wait
        #: Whether another write of the same store is in flight on another connection: its
        #: answer arrives on a socket only the loop watches, so an answer is then awaited on
        #: the loop, never in ``poll()`` (which would leave the other writer's answer unseen
        #: until this one's came, commit after commit: two executions stepping side by side
        #: ran one at a time, the other one step every ``SHARE_LOOP_EVERY``).
        self._others_writing = others_writing
        # Weakly: a writer keeps one of these per pooled connection in a WeakKeyDictionary,
        # whose entry would never go if its value held its key.
        self._conn = weakref.ref(conn)
        #: The connection's server process, kept for after a lost answer closed it: whether
        #: that process still runs the statement decides when its outcome can be checked.
        self.backend_pid: int = conn.pgconn.backend_pid
        #: (name, parameter formats) of each statement prepared here, by (text, types).
        self._names: dict[tuple[bytes, tuple[int, ...]], tuple[bytes, tuple[int, ...] | None]] = {}
        #: The poll() a lone write waits in: this connection's socket and, where the loop's
        #: selector has a file descriptor of its own (epoll, kqueue), that one too, so the
        #: wait ends as soon as anything the loop watches is ready (see _answer).
        self._poller: (
            tuple[weakref.ref[asyncio.AbstractEventLoop], select.poll, int | None] | None
        ) = None
        #: When the next write first lets the loop run (see execute).
        self.loop_share = LoopShare()

    @property
    def conn(self) -> Conn:
        """The connection these statements are prepared on."""
        conn = self._conn()
        if conn is None:  # only its owner uses it, while holding the connection
            raise psycopg.InterfaceError("the connection of these lean statements is gone")
        return conn

    async def execute(
        self,
        text: bytes,
        values: list[bytes | None],
        types: tuple[int, ...],
        *,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> tuple[Any, ...] | None:
        """Run one prepared statement; return its first row (its first column as an int: every
        write statement answers with a count or a number), or None if it returned no row.
        ``loop``: the running loop, if the caller has it at hand (on Python 3.11 asking for it
        is a getpid() system call, 0.7 µs on this project's VM).

        Raises the psycopg error of a failed statement (nothing of it was written), or
        ``psycopg.OperationalError`` if the connection was lost (the outcome is then unknown).
        """
        if LONE_WAIT > 0 and self.loop_share.due():
            # A pass of the loop before a write, once every SHARE_LOOP_EVERY, as the other
            # stores take it: it picks up the I/O that is due, so the wait below (which does
            # not yield) never starves the other tasks (a stepping flow would otherwise run to
            # its end in one go). One pass per write cost ~15 µs a step, a tenth of a commit.
            # Nothing is sent yet: a cancellation here writes nothing.
            await self.loop_share.turn()
        prepared = self._names.get((text, types))
        if prepared is None:
            prepared = await self._prepared(text, types)
        try:
            name, formats = prepared
            self.conn.pgconn.send_query_prepared(name, values, formats)
            result = await self._answer(pq.ExecStatus.TUPLES_OK, loop)
        except psycopg.errors.InvalidSqlStatementName:
            # Dropped behind our back since we prepared it; the statement never ran.
            self._names.clear()
            prepared = await self._prepared(text, types)
            result = await self._run(prepared, values)
        if result.ntuples == 0:
            return None
        first = result.get_value(0, 0)
        return (None if first is None else int(first),)

    async def begin_and_run(
        self,
        statements: Sequence[tuple[bytes, list[bytes | None], tuple[int, ...]]],
        lock_key: int | None = None,
    ) -> list[tuple[Any, ...] | None]:
        """``BEGIN``, the advisory transaction lock ``lock_key`` if any, then each of
        ``statements`` (prepared), sent at once in libpq's pipeline mode: one round trip for a
        whole batch, without psycopg's per-statement cursor, conversion and adaptation (about
        as much client CPU per statement as a lone write's whole append). Returns each
        statement's first row as :meth:`execute` does; the transaction is left open for the
        caller to commit.

        Raises the first failed statement's psycopg error (the statements after it did not
        run; the transaction is aborted and the caller rolls it back), or
        ``psycopg.OperationalError`` if the connection was lost (nothing was committed).
        """
        prepared = []
        for text, _values, types in statements:
            known = self._names.get((text, types))
            if known is None:
                # Prepared outside the pipeline, once per connection; an answer of the
                # pipeline below naming a dropped statement is an error the caller handles.
                known = await self._prepared(text, types)
            prepared.append(known)
        pgconn = self.conn.pgconn
        loop = asyncio.get_running_loop()
        expected = len(statements) + (2 if lock_key is not None else 1)
        pgconn.enter_pipeline_mode()
        try:
            pgconn.send_query_params(b"BEGIN", None)
            if lock_key is not None:
                pgconn.send_query_params(
                    b"SELECT pg_advisory_xact_lock($1)", [b"%d" % lock_key], [_INT8]
                )
            for (name, formats), (_text, values, _types) in zip(prepared, statements, strict=True):
                pgconn.send_query_prepared(name, values, formats)
            pgconn.pipeline_sync()
            while pgconn.flush():  # the socket's buffer is full: a large batch
                # Read while waiting to write: a server blocked sending answers into a full
                # receive buffer would stop reading the rest of the batch (libpq's advice).
                if await self._readable_or_writable(loop, pgconn.socket):
                    pgconn.consume_input()
            answers: list[pq.abc.PGresult | None] = []
            current: pq.abc.PGresult | None = None
            while True:
                if pgconn.is_busy():
                    await self._ready(loop, pgconn.socket)
                    pgconn.consume_input()
                    continue
                result = pgconn.get_result()
                if result is None:  # the end of one statement's answer
                    answers.append(current)
                    current = None
                    if len(answers) > expected or pgconn.status != pq.ConnStatus.OK:
                        # A connection that went bad answers "no result" forever: never spin.
                        raise psycopg.OperationalError(
                            "the connection was lost while a batch was being answered"
                        )
                elif result.status == pq.ExecStatus.PIPELINE_SYNC:
                    break
                else:
                    current = result
            pgconn.exit_pipeline_mode()
        except BaseException:
            # Mid-answer or mid-pipeline: the connection cannot be reused (psycopg would find
            # it in pipeline mode, or mid-answer), so it is closed and the pool drops it (also
            # when the server has already gone: the pool then discards it without a warning).
            await self.conn.close()
            raise
        if len(answers) != expected:
            raise psycopg.InterfaceError(
                f"unexpected answer to a batch: {len(answers)} results for {expected} statements"
            )
        for answer in answers:
            if answer is not None and answer.status == pq.ExecStatus.FATAL_ERROR:
                error = psycopg.errors.error_from_result(answer, encoding=self.conn.info.encoding)
                if isinstance(error, psycopg.errors.InvalidSqlStatementName):
                    self._names.clear()  # dropped behind our back: prepared again next time
                raise error
        rows: list[tuple[Any, ...] | None] = []
        for answer in answers[expected - len(statements) :]:
            if answer is None or answer.status != pq.ExecStatus.TUPLES_OK:
                status = "none" if answer is None else pq.ExecStatus(answer.status).name
                raise psycopg.InterfaceError(f"unexpected answer to a batched write: {status}")
            if answer.ntuples == 0:
                rows.append(None)
                continue
            first = answer.get_value(0, 0)
            rows.append((None if first is None else int(first),))
        return rows

    async def _prepared(
        self, text: bytes, types: tuple[int, ...]
    ) -> tuple[bytes, tuple[int, ...] | None]:
        key = (text, types)
        prepared = self._names.get(key)
        if prepared is None:
            name = f"loom_w{next(_statement_numbers)}".encode()
            self.conn.pgconn.send_prepare(name, text, types)
            await self._answer(pq.ExecStatus.COMMAND_OK)
            # Floats are sent in binary (see _ENCODERS), everything else as text.
            formats = tuple(int(t == _FLOAT8) for t in types) if _FLOAT8 in types else None
            prepared = self._names[key] = (name, formats)
        return prepared

    async def _run(
        self, prepared: tuple[bytes, tuple[int, ...] | None], values: list[bytes | None]
    ) -> pq.abc.PGresult:
        name, formats = prepared
        self.conn.pgconn.send_query_prepared(name, values, formats)
        return await self._answer(pq.ExecStatus.TUPLES_OK)

    async def _answer(
        self, expected: pq.ExecStatus, loop: asyncio.AbstractEventLoop | None = None
    ) -> pq.abc.PGresult:
        """Flush what was sent and collect the answer (one result, then the end of it)."""
        pgconn = self.conn.pgconn
        if loop is None:
            loop = asyncio.get_running_loop()
        try:
            while pgconn.flush():  # rare: the socket's buffer is full
                await self._ready(loop, pgconn.socket, write=True)
            results: list[pq.abc.PGresult] = []
            others = self._others_writing
            budget = 0.0 if others is not None and others() else _idle_budget(loop)
            spin = min(self.spin_wait, budget)
            while True:
                if pgconn.is_busy():
                    if spin > 0:
                        # Reading what has arrived, without sleeping: the answer is taken the
                        # moment it lands, by a process that has not been put to sleep (its
                        # wake-up, and the cold caches after it, cost more than the spin).
                        started = time.monotonic()
                        until = started + spin
                        spin = 0.0  # once: an answer still not in is waited for as below
                        while True:
                            pgconn.consume_input()
                            if not pgconn.is_busy() or time.monotonic() >= until:
                                break
                        budget -= time.monotonic() - started
                        continue
                    if budget > 0:
                        poller, loop_fd = self._poller_for(loop, pgconn.socket)
                        started = time.monotonic()
                        ready = poller.poll(math.ceil(budget * 1000))
                        if not ready:
                            budget = 0.0  # spent: the rest is awaited on the loop
                        elif len(ready) == 1 and ready[0][0] != loop_fd:  # the answer alone
                            budget -= time.monotonic() - started
                            pgconn.consume_input()
                            continue
                        else:
                            # Something the loop watches is ready: another connection's answer
                            # (a read, a timer claim, another store's write), a request to an
                            # HTTP worker, a thread's result. It gets the loop now, with this
                            # answer if it is still to come, and the next write lets the loop
                            # run first if this one is in.
                            budget = 0.0
                            self.loop_share.hurry()
                            if len(ready) > 1:  # the answer too
                                pgconn.consume_input()
                                continue
                    await self._ready(loop, pgconn.socket)
                    pgconn.consume_input()
                    continue
                result = pgconn.get_result()
                if result is None:
                    break
                results.append(result)
        except BaseException as exc:
            # Cancelled or failed with a statement in flight: the connection cannot be reused
            # (psycopg would find it mid-answer), so it is closed and the pool drops it. A
            # cancelled one is stopped on the server first; a failed one (a lost connection)
            # is left to the store's check of a lost write, which waits for its backend.
            if pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
                if isinstance(exc, (Exception, GeneratorExit)):  # a closed coroutine: no await
                    await self.conn.close()
                else:
                    await self._abandon()
            raise
        for result in results:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                raise psycopg.errors.error_from_result(result, encoding=self.conn.info.encoding)
        if len(results) != 1 or results[0].status != expected:
            statuses = [pq.ExecStatus(r.status).name for r in results]
            raise psycopg.InterfaceError(f"unexpected answer to a write: {statuses}")
        return results[0]

    async def _abandon(self) -> None:
        """Stop the statement in flight, whose caller was cancelled, with a cancel request;
        then close the connection.

        Closing alone leaves the server running it: a backend waiting on a lock does not
        notice a closed socket, and its autocommit statement would commit whenever the lock
        came, long after its caller gave up (a cancelled step, a shutdown). The request is
        bounded by :data:`CANCEL_TIMEOUT` and may lose the race with a commit already under
        way: the write's outcome stays unknown either way, but it no longer runs on."""
        conn = self.conn
        if conn.pgconn.status != pq.ConnStatus.OK or not psycopg.capabilities.has_cancel_safe():
            # Lost: the server ended it, or the network did, and a request would most likely
            # wait out its bound for nothing (the store's check of a lost write covers this).
            # Or a libpq older than 17, whose blocking cancel ignores any bound and, run in a
            # thread, was seen to hold up the whole process against an unanswering server.
            await conn.close()
            return
        # Its own task, shielded: a second cancel of the caller stops the wait, not the request
        # (whose failure is then retrieved by the callback, never logged as unretrieved).
        request = asyncio.ensure_future(conn.cancel_safe(timeout=CANCEL_TIMEOUT))
        request.add_done_callback(_retrieved)
        try:
            await asyncio.shield(request)
        except Exception:
            pass  # best effort: the server unreachable, or not answering within the bound
        finally:
            await conn.close()

    def _poller_for(
        self, loop: asyncio.AbstractEventLoop, sock: int
    ) -> tuple[select.poll, int | None]:
        """The poll() for a lone wait on ``loop``, and the loop's selector's fd in it (or None:
        a loop without one, uvloop's say, whose other I/O then waits out the budget)."""
        known = self._poller
        if known is not None and known[0]() is loop:
            return known[1], known[2]
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        loop_fd = _selector_fd(loop)
        if loop_fd is not None:
            # An epoll (or kqueue) descriptor is readable while any file registered in it is
            # ready: the loop's sockets, and its self-pipe (call_soon_threadsafe, a thread's
            # result). Timers are not in it: the budget already stops at the next one.
            poller.register(loop_fd, select.POLLIN)
        self._poller = (weakref.ref(loop), poller, loop_fd)
        return poller, loop_fd

    @staticmethod
    async def _readable_or_writable(loop: asyncio.AbstractEventLoop, fd: int) -> bool:
        """Wait until ``fd`` can be read or written; True if it can be read."""
        fut: asyncio.Future[bool] = loop.create_future()

        def wake(readable: bool) -> None:
            if not fut.done():
                fut.set_result(readable)

        loop.add_reader(fd, wake, True)
        loop.add_writer(fd, wake, False)
        try:
            return await fut
        finally:
            loop.remove_reader(fd)
            loop.remove_writer(fd)

    @staticmethod
    async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool = False) -> None:
        fut = loop.create_future()
        if write:
            loop.add_writer(fd, _wake, loop, fd, True, fut)
        else:
            loop.add_reader(fd, _wake, loop, fd, False, fut)
        try:
            await fut
        finally:
            if fut.cancelled() or not fut.done():  # _wake did not run: still registered
                if write:
                    loop.remove_writer(fd)
                else:
                    loop.remove_reader(fd)
