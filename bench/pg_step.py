"""Where a PostgreSQL step's time goes: ``python -m bench.pg_step [--steps 400] [--rounds 5]``.

One table, every row measured in the same run, interleaved round by round (so a load change on
this shared machine hits every row alike; the statement rows in reverse order every other
round), the median round reported:

* ``floor (sync)``: the ``bench.peers`` floor exactly: a warm psycopg connection in autocommit,
  one ``INSERT`` per row (an autocommit statement is BEGIN; INSERT; COMMIT in one round trip).
* ``floor (async)``: the same on an asyncio connection, in this event loop.
* ``SELECT 1``: one round trip that commits nothing (the protocol + asyncio floor).
* ``append statement``: the store's one-envelope append statement, raw on a warm asyncio
  connection in autocommit, sent as the store sends a lone write (``_postgres_lean``: its own
  prepared statement, parameters encoded to text, libpq calls): the SQL's cost with no engine
  and no store Python around it. Its head is not watched (nobody waits for it elsewhere), so
  it sends no notification; ``watched``: the same once a waiter marked the head (it notifies);
  ``notify=off``: a store opened with ``notify=False``; ``rung 10``: the statement as schema
  rung 10 sent it (every append notified; the end of the log checked by a lookup in the
  events), on the same tables.
* ``floor (lean)``: the floor's ``INSERT`` sent as the store sends its lone write: the floor
  the statements below are compared with (the same client path, so their ratio is the SQL's).
* ``events INSERT alone`` / ``heads UPDATE alone``: each half of the append statement as a
  statement of its own (raw, lean, autocommit, on the store's own tables): each alone costs
  what the floor does; it is writing both tables in one transaction that costs more.
* ``append statement, read fence``: a what-if no store sends: the fence and the tail read, not
  moved (the head row only read, the tail checked by the previous event's key, a duplicate
  refused by the events' primary key), as SQLite's rung 5 does. It saves the head's update,
  but without the head row's lock a waiter's ``watched`` mark (rung 11) can land between the
  append's snapshot and its commit, and the wake-up is lost; ``FOR SHARE`` keeps the lock and
  costs what the update does (see issue 13's note).
* ``append, advisory lock``: a what-if no store sends either: a PL/pgSQL function that takes a
  shared advisory lock on the execution, then (on a snapshot taken after the lock) reads the
  fence and ``watched``, checks the previous event's key, inserts and notifies if watched. With
  a waiter's mark and a take-over taking the lock exclusively, no wake-up or fence change could
  slip between the read and the commit, and no head row would be written per step. Every
  statement row checks that all its events landed (a refused write commits nothing, and would
  look cheap).
* ``store.append``: ``PostgresStore.append([envelope])`` with envelopes built beforehand: the
  statement plus the store and its group-commit engine.
* ``... spinning``: the floor's lean ``INSERT``, the append statement, ``store.append`` and the
  runtime step with ``spin_wait`` (``--spin``, default 1 ms; ``PostgresStore(spin_wait=...)``):
  the client spins on its socket for the answer instead of sleeping in ``poll()``. Compare a
  spinning row with ``floor (lean, spinning)``, not with the sync floor, which sleeps: most of
  what spinning saves is the sleeping client's wake-up, which every floor that sleeps pays.
* ``runtime step``: a flow of ``--steps`` ``ctx.run`` steps (as ``bench.peers``' per-step row),
  per step.

Columns: wall and CPU (this process's ``time.process_time``) µs per step, client round trips per
step (psycopg waits on the socket), and, for the statements, the server's own execution time
(``EXPLAIN ANALYZE`` inside a rolled-back transaction: the statement without its COMMIT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

import loom
from loom.model import Envelope, EventType
from loom.storage._common import TERMINAL_SQL
from loom.storage._postgres_lean import LeanStatements, lean_values
from loom.storage.postgres import PostgresStore

APP = "loom_pgstep"
_BASE_DSN = os.environ.get(
    "LOOM_BENCH_PG_DSN",
    os.environ.get("LOOM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"),
)
# Every connection of this run is tagged, so that its server processes can be found.
PG_DSN = _BASE_DSN + ("&" if "?" in _BASE_DSN else "?") + f"application_name={APP}"
PAYLOAD = json.dumps({"position": 123, "step_id": "inc", "attempt": 1, "output": 124, "t": 0.0})
FLOOR_TABLE = "floor_rows"

# The one-envelope append as schema rung 10 sent it (build 0ad3da3), for the row that compares
# it with this build's: the tail's end checked by a lookup in the events, the notify sent on
# every append, as a subquery of its own.
RUNG_10_APPEND = """
WITH moved AS (
    UPDATE {s}.heads SET next_sequence = %(end)s
    WHERE execution_id = %(eid)s AND fence = %(fence)s AND next_sequence = %(first)s
    AND NOT EXISTS (SELECT 1 FROM {s}.events WHERE execution_id = %(eid)s
        AND sequence = %(first)s - 1 AND type IN ({terminal}))
    RETURNING execution_id
), ins AS (
    INSERT INTO {s}.events
        (execution_id, sequence, envelope_id, type, payload, recorded_at, fence, checksum)
    SELECT moved.execution_id, %(first)s, %(id)s, %(type)s, %(payload)s, %(at)s::float8,
        %(fence)s, %(sum)s FROM moved
)
SELECT (SELECT count(*) FROM moved), (SELECT count(pg_notify(%(channel)s, %(note)s)) FROM moved)
"""

# The one-envelope append with the fence read, not moved (what SQLite's rung 5 does): the head
# row is only read, the tail checked by the previous event's key, a duplicate refused by the
# events' primary key. A what-if row: no store sends it.
READ_FENCE_APPEND = """
WITH h AS (
    SELECT execution_id, watched FROM {s}.heads
    WHERE execution_id = %(eid)s AND fence = %(fence)s AND NOT ended
    AND EXISTS (SELECT 1 FROM {s}.events WHERE execution_id = %(eid)s
        AND sequence = %(first)s - 1)
), ins AS (
    INSERT INTO {s}.events
        (execution_id, sequence, envelope_id, type, payload, recorded_at, fence, checksum)
    SELECT h.execution_id, %(first)s, %(id)s, %(type)s, %(payload)s, %(at)s::float8,
        %(fence)s, %(sum)s FROM h
)
SELECT count(*), count(CASE WHEN h.watched OR %(first)s::bigint = 0
    THEN pg_notify(%(channel)s, %(note)s) END) FROM h
"""

# A what-if for a protocol that moves no head row and loses no wake-up: the append takes a
# shared advisory lock on its execution (lock-manager memory: no heap write, no WAL), a waiter's
# watched mark and a take-over would take it exclusively, and the statements after the lock run
# on a snapshot taken after it (a PL/pgSQL function's statements each take their own), so the
# append sees a mark or a fence that was committed while it waited. No store sends it.
LOCKED_APPEND_FUNCTION = """
CREATE FUNCTION {s}.append_locked(p_eid text, p_seq bigint, p_id text, p_type text,
    p_payload text, p_at float8, p_fence bigint, p_sum text, p_channel text, p_note text)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE w boolean;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(p_eid, 0));
    SELECT watched INTO w FROM {s}.heads
        WHERE execution_id = p_eid AND fence = p_fence AND NOT ended;
    IF NOT FOUND OR NOT EXISTS (SELECT 1 FROM {s}.events
            WHERE execution_id = p_eid AND sequence = p_seq - 1) THEN
        RETURN 0;
    END IF;
    INSERT INTO {s}.events
        (execution_id, sequence, envelope_id, type, payload, recorded_at, fence, checksum)
        VALUES (p_eid, p_seq, p_id, p_type, p_payload, p_at, p_fence, p_sum);
    IF w OR p_seq = 0 THEN
        PERFORM pg_notify(p_channel, p_note);
    END IF;
    RETURN 1;
END $$
"""
LOCKED_APPEND_CALL = (
    "SELECT {s}.append_locked(%(eid)s, %(first)s, %(id)s, %(type)s, %(payload)s,"
    " %(at)s::float8, %(fence)s, %(sum)s, %(channel)s, %(note)s), 0"
)

_waits = 0
#: The server processes of this run's connections (see _refresh_backends).
_backends: list[int] = []


def _schedstat(pid: int | str) -> tuple[int, int]:
    """(ns on a CPU, ns waiting for one) of a process, from the kernel's scheduler stats."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            run, wait, _ = f.read().split()
    except OSError:
        return 0, 0  # not on this machine (a remote server) or gone
    return int(run), int(wait)


def _refresh_backends(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APP,)
    ).fetchall()
    _backends[:] = [int(r[0]) for r in rows]


class Snap:
    """The counters at one moment: wall, this process's CPU, round trips, scheduler stats of
    this process and of the server processes serving it."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()
        self.waits = _waits
        self.client = _schedstat("self")
        server = [_schedstat(pid) for pid in _backends]
        self.server = (sum(r for r, _ in server), sum(w for _, w in server))


def _counted(gen: Any) -> Any:
    """``gen`` (a psycopg wait generator), counting one round trip if it waits at all (a
    commit in autocommit mode, say, finishes without touching the socket)."""
    global _waits
    try:
        step = gen.send(None)
    except StopIteration as stop:
        return stop.value
    _waits += 1
    while True:
        sent = yield step
        try:
            step = gen.send(sent)
        except StopIteration as stop:
            return stop.value


def _count_waits() -> None:
    """Count round trips on every psycopg connection of this process."""
    async_wait = psycopg.AsyncConnection.wait
    sync_wait = psycopg.Connection.wait

    async def counted_async(self: Any, gen: Any, *a: Any, **k: Any) -> Any:
        return await async_wait(self, _counted(gen), *a, **k)

    def counted_sync(self: Any, gen: Any, *a: Any, **k: Any) -> Any:
        return sync_wait(self, _counted(gen), *a, **k)

    psycopg.AsyncConnection.wait = counted_async  # type: ignore[method-assign]
    psycopg.Connection.wait = counted_sync  # type: ignore[method-assign]

    # The store's lone writes bypass psycopg's wait (``_postgres_lean``), and may not wait on
    # the loop at all: count each statement sent and answered there as one round trip.
    lean_answer = LeanStatements._answer

    async def counted_answer(self: LeanStatements, expected: Any) -> Any:
        global _waits
        _waits += 1
        return await lean_answer(self, expected)

    LeanStatements._answer = counted_answer  # type: ignore[method-assign]


@loom.step(id="inc")
async def inc(x: int) -> int:
    return x + 1


@loom.flow(id="pg-step-seq", version="1")
async def seq_flow(ctx: loom.WorkflowContext, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.run(inc, x)
    return x


class Row:
    def __init__(self, name: str) -> None:
        self.name = name
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.trips: list[float] = []
        self.server_cpu: list[float] = []
        self.runq: list[float] = []
        self.server: float | None = None

    async def measure(self, steps: int, body: Callable[[int], Awaitable[None]]) -> None:
        start = Snap()
        await body(steps)
        self.add(steps, start)

    def add(self, steps: int, start: Snap) -> None:
        """Record ``steps`` steps measured from ``start``."""
        end = Snap()
        self.wall.append((end.wall - start.wall) / steps * 1e6)
        self.cpu.append((end.cpu - start.cpu) / steps * 1e6)
        self.trips.append((end.waits - start.waits) / steps)
        self.server_cpu.append((end.server[0] - start.server[0]) / steps / 1e3)
        waited = end.client[1] - start.client[1] + end.server[1] - start.server[1]
        self.runq.append(waited / steps / 1e3)


async def server_time(conn: psycopg.AsyncConnection[Any], sql: str, params: Any, n: int) -> float:
    """Median server execution time (µs) of ``sql``, without its COMMIT or planning (the
    store's statements are prepared after their first uses)."""
    times = []
    for _ in range(n):
        async with conn.transaction(force_rollback=True):
            cur = await conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params, prepare=False)
            row = await cur.fetchone()
            assert row is not None
            plan = row[0][0]
            times.append(plan["Execution Time"] * 1000)
    return float(statistics.median(times))


async def run(
    steps: int, rounds: int, only: list[str] | None = None, spin: float = 0.001
) -> list[Row]:
    schema = f"loom_pgstep_{os.getpid()}"
    _count_waits()
    sync_conn = psycopg.connect(PG_DSN, autocommit=True)
    aconn = await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True)
    stmt_conn = await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True)
    lean = LeanStatements(stmt_conn)
    spin_conn = await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True)
    spinning_lean = LeanStatements(spin_conn, spin_wait=spin)
    stores = {n: await PostgresStore.open(PG_DSN, schema=schema, notify=n) for n in (True, False)}
    spinning = await PostgresStore.open(PG_DSN, schema=schema, spin_wait=spin)
    runtime = loom.WorkflowRuntime(stores[True])
    runtime.register(seq_flow)
    spinning_runtime = loom.WorkflowRuntime(spinning)
    spinning_runtime.register(seq_flow)
    sync_conn.execute(LOCKED_APPEND_FUNCTION.format(s=f'"{schema}"'))
    sync_conn.execute(f"DROP TABLE IF EXISTS {FLOOR_TABLE}")
    sync_conn.execute(f"CREATE TABLE {FLOOR_TABLE} (id BIGINT PRIMARY KEY, payload TEXT NOT NULL)")
    counter = {"floor": 0, "exec": 0}

    def floor_sync(n: int) -> None:
        sql = f"INSERT INTO {FLOOR_TABLE} (id, payload) VALUES (%s, %s)"
        i = counter["floor"]
        for k in range(i, i + n):
            sync_conn.execute(sql, (k, PAYLOAD))
        counter["floor"] = i + n

    async def floor_sync_body(n: int) -> None:
        floor_sync(n)

    async def floor_async(n: int) -> None:
        sql = f"INSERT INTO {FLOOR_TABLE} (id, payload) VALUES (%s, %s)"
        i = counter["floor"]
        counter["floor"] = i + n
        for k in range(i, i + n):
            await aconn.execute(sql, (k, PAYLOAD))

    async def select1(n: int) -> None:
        for _ in range(n):
            await aconn.execute("SELECT 1")

    async def fresh(store: PostgresStore, key: str) -> tuple[str, int]:
        counter["exec"] += 1
        eid = f"{key}-{counter['exec']}"
        fence = await store.acquire_fence(eid)
        return eid, fence

    def envelopes(eid: str, fence: int, n: int) -> list[Envelope]:
        return [
            Envelope.create(
                eid,
                s,
                EventType.EXECUTION_STARTED if s == 0 else EventType.STEP_COMPLETED,
                {"position": s, "step_id": "inc", "attempt": 1, "output": s + 1},
                fence=fence,
                recorded_at=time.time(),
            )
            for s in range(n)
        ]

    def raw_params(store: PostgresStore, e: Envelope) -> dict[str, Any]:
        return {
            "eid": e.execution_id,
            "fence": e.fence,
            "first": e.sequence,
            "end": e.sequence + 1,
            "ends": False,
            "channel": store._channel,
            "note": e.execution_id,
            # As the store writes it: a derived id is stored empty (schema rung 10).
            "id": ""
            if e.envelope_id == f"{e.execution_id}#{e.sequence}.{e.fence}"
            else e.envelope_id,
            "type": str(e.type),
            "payload": e.payload_json,
            "at": e.recorded_at,
            "sum": e.checksum(),
        }

    async def timed_lean(
        row: str, encoded: list[Any], statements: LeanStatements | None = None
    ) -> None:
        """Send each of ``encoded`` (built beforehand) as the store sends a lone write, timed."""
        statements = statements or lean
        _refresh_backends(sync_conn)
        start = Snap()
        for values in encoded:
            assert values is not None
            await statements.execute(*values)
        rows[row].add(len(encoded), start)

    def stmt_body(
        row: str,
        notify: bool = True,
        *,
        watched: bool = False,
        sql: str | None = None,
        statements: LeanStatements | None = None,
    ) -> Callable[[int], Awaitable[None]]:
        store = stores[notify]
        text = sql or store._sql.events("append", one=True)

        async def body(n: int) -> None:
            eid, fence = await fresh(store, "stmt")
            # The first event (a start) goes through the store: it writes the index row.
            first = envelopes(eid, fence, n + 1)
            await store.append(first[:1])
            if watched:  # as a waiter in another process marks it (PostgresStore._watch_last)
                await aconn.execute(store._sql.watch, (eid,))
            encoded = [lean_values(text, raw_params(store, e)) for e in first[1:]]
            await timed_lean(row, encoded, statements)
            # A refused write costs no commit: every row must have landed, or the figure lies.
            stored = sync_conn.execute(
                f'SELECT count(*) FROM "{schema}".events WHERE execution_id = %s', (eid,)
            ).fetchone()
            assert stored is not None and stored[0] == n + 1, (row, stored, n + 1)

        return body

    floor_lean_sql = f"INSERT INTO {FLOOR_TABLE} (id, payload) VALUES (%s, %s) RETURNING 1"

    def floor_lean_body(row: str, statements: LeanStatements) -> Callable[[int], Awaitable[None]]:
        async def floor_lean(n: int) -> None:
            i = counter["floor"]
            counter["floor"] = i + n
            encoded = [lean_values(floor_lean_sql, (k, PAYLOAD)) for k in range(i, i + n)]
            await timed_lean(row, encoded, statements)

        return floor_lean

    def half_body(half: str) -> Callable[[int], Awaitable[None]]:
        store = stores[False]
        table = f'"{schema}".events' if half == "insert" else f'"{schema}".heads'
        sql = (
            f"INSERT INTO {table} (execution_id, sequence, envelope_id, type, payload,"
            " recorded_at, fence, checksum) VALUES (%s, %s, '', %s, %s, %s, %s, %s) RETURNING 1"
            if half == "insert"
            else f"UPDATE {table} SET next_sequence = %s WHERE execution_id = %s RETURNING 1"
        )

        async def body(n: int) -> None:
            eid, fence = await fresh(store, f"half-{half}")
            evs = envelopes(eid, fence, n + 1)[1:]
            encoded = [
                lean_values(
                    sql,
                    (eid, e.sequence, str(e.type), e.payload_json, e.recorded_at, fence, "x" * 32)
                    if half == "insert"
                    else (e.sequence + 1, eid),
                )
                for e in evs
            ]
            name = "events INSERT" if half == "insert" else "heads UPDATE"
            await timed_lean(f"{name} alone", encoded)

        return body

    def store_body(row: str, store: PostgresStore) -> Callable[[int], Awaitable[None]]:
        async def body(n: int) -> None:
            eid, fence = await fresh(store, "store")
            evs = envelopes(eid, fence, n + 1)
            await store.append(evs[:1])
            _refresh_backends(sync_conn)
            start = Snap()
            for e in evs[1:]:
                await store.append([e])
            rows[row].add(n, start)

        return body

    def runtime_body(on: loom.WorkflowRuntime) -> Callable[[int], Awaitable[None]]:
        async def body(n: int) -> None:
            counter["exec"] += 1
            handle = await on.start(seq_flow, n, execution_id=f"rt-{counter['exec']}")
            assert await handle.result() == n

        return body

    rung_10 = RUNG_10_APPEND.format(s=f'"{schema}"', terminal=TERMINAL_SQL)
    read_fence = READ_FENCE_APPEND.format(s=f'"{schema}"')
    locked = LOCKED_APPEND_CALL.format(s=f'"{schema}"')
    plain: list[tuple[str, Callable[[int], Awaitable[None]]]] = [
        ("floor (sync, = bench.peers)", floor_sync_body),
        ("floor (async)", floor_async),
        ("SELECT 1 (async, no commit)", select1),
        ("runtime step (200-step flow)", runtime_body(runtime)),
        ("runtime step, spinning", runtime_body(spinning_runtime)),
    ]
    timed_inside = [
        ("floor (lean)", floor_lean_body("floor (lean)", lean)),
        ("floor (lean, spinning)", floor_lean_body("floor (lean, spinning)", spinning_lean)),
        ("events INSERT alone", half_body("insert")),
        ("heads UPDATE alone", half_body("update")),
        ("append statement", stmt_body("append statement")),
        ("append statement, watched", stmt_body("append statement, watched", watched=True)),
        ("append statement, notify=off", stmt_body("append statement, notify=off", False)),
        (
            "append statement, rung 10",
            stmt_body("append statement, rung 10", sql=rung_10),
        ),
        (
            "append statement, read fence",
            stmt_body("append statement, read fence", sql=read_fence),
        ),
        (
            "append, advisory lock",
            stmt_body("append, advisory lock", sql=locked),
        ),
        (
            "append statement, spinning",
            stmt_body("append statement, spinning", statements=spinning_lean),
        ),
        ("store.append, notify=on", store_body("store.append, notify=on", stores[True])),
        ("store.append, notify=off", store_body("store.append, notify=off", stores[False])),
        ("store.append, spinning", store_body("store.append, spinning", spinning)),
    ]
    if only:  # the floor always runs: every ratio is to it
        plain = [r for r in plain if r[0] == plain[0][0] or r[0] in only]
        timed_inside = [r for r in timed_inside if r[0] in only]
    rows = {name: Row(name) for name, _ in plain + timed_inside}
    try:
        # Warm-up: connections, prepared statements, caches.
        for _, body in plain + timed_inside:
            await body(20)
        for row in rows.values():
            row.wall, row.cpu, row.trips = [], [], []
        for i in range(rounds):
            for name, body in plain:
                _refresh_backends(sync_conn)
                await rows[name].measure(steps if "runtime" not in name else 200, body)
            # In reverse order every other round: no row always runs right after another.
            for _, body in timed_inside if i % 2 else timed_inside[::-1]:
                await body(steps)
        # Server-side time of the statements alone (no COMMIT).
        rows["floor (sync, = bench.peers)"].server = await server_time(
            aconn,
            f"INSERT INTO {FLOOR_TABLE} (id, payload) VALUES (%s, %s)",
            (10**12, PAYLOAD),
            25,
        )
        for row, notify in (("append statement", True), ("append statement, notify=off", False)):
            if row not in rows:
                continue
            store = stores[notify]
            eid, fence = await fresh(store, "explain")
            evs = envelopes(eid, fence, 2)
            await store.append(evs[:1])
            rows[row].server = await server_time(
                aconn, store._sql.events("append", one=True), raw_params(store, evs[1]), 25
            )
    finally:
        await runtime.close()
        await spinning_runtime.close()
        for s in (*stores.values(), spinning):
            await s.close()
        sync_conn.execute(f"DROP TABLE IF EXISTS {FLOOR_TABLE}")
        sync_conn.close()
        await aconn.close()
        await stmt_conn.close()
        await spin_conn.close()
        await PostgresStore.drop_schema(PG_DSN, schema)
    return list(rows.values())


def report(rows: list[Row], steps: int, rounds: int) -> None:
    med = statistics.median
    floor = rows[0]
    floor_wall = med(floor.wall)
    floor_cpu = med(floor.cpu) + med(floor.server_cpu)
    load = os.getloadavg()
    print(
        f"\nPostgreSQL per-step breakdown: {rounds} rounds x {steps} steps, median round; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        "client/server CPU: this process / its server processes on a CPU; run queue: both "
        "waiting for a CPU;\nthe rest of wall is waiting on I/O (the commit's WAL flush) and "
        "on each other; stmt: EXPLAIN ANALYZE's execution time"
    )
    header = (
        f"{'µs per step':32} {'wall':>7} {'x floor':>7} {'client':>7} {'server':>7} "
        f"{'CPU x fl':>8} {'run q':>7} {'trips':>5} {'stmt':>6}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        wall = med(r.wall)
        cpu = med(r.cpu) + med(r.server_cpu)
        stmt = f"{r.server:6.1f}" if r.server is not None else f"{'':6}"
        print(
            f"{r.name:32} {wall:7.1f} {wall / floor_wall:7.2f} {med(r.cpu):7.1f} "
            f"{med(r.server_cpu):7.1f} {cpu / floor_cpu:8.2f} {med(r.runq):7.1f} "
            f"{med(r.trips):5.2f} {stmt}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="steps per row per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--rows",
        default="",
        help="only these rows (names as printed, separated by ';'; the sync floor always runs): "
        "more rounds of a few rows resolve a smaller difference",
    )
    parser.add_argument(
        "--spin",
        type=float,
        default=0.001,
        help="the spinning rows' spin_wait (seconds, at most 0.002)",
    )
    args = parser.parse_args()
    only = [name.strip() for name in args.rows.split(";") if name.strip()]
    rows = asyncio.run(run(args.steps, args.rounds, only, args.spin))
    report(rows, args.steps, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
