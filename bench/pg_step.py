"""Where a PostgreSQL step's time goes: ``python -m bench.pg_step [--steps 400] [--rounds 5]``.

One table, every row measured in the same run, interleaved round by round (so a load change on
this shared machine hits every row alike), the median round reported:

* ``floor (sync)``: the ``bench.peers`` floor exactly: a warm psycopg connection in autocommit,
  one ``INSERT`` per row (an autocommit statement is BEGIN; INSERT; COMMIT in one round trip).
* ``floor (async)``: the same on an asyncio connection, in this event loop.
* ``SELECT 1``: one round trip that commits nothing (the protocol + asyncio floor).
* ``append statement``: the store's one-envelope append statement, raw on a warm asyncio
  connection in autocommit (prepared like the store's), ``notify`` on and off: the SQL's cost
  with no engine and no store Python around it.
* ``store.append``: ``PostgresStore.append([envelope])`` with envelopes built beforehand: the
  statement plus the store and its group-commit engine.
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
from loom.storage.postgres import PostgresStore

PG_DSN = os.environ.get(
    "LOOM_BENCH_PG_DSN",
    os.environ.get("LOOM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"),
)
PAYLOAD = json.dumps({"position": 123, "step_id": "inc", "attempt": 1, "output": 124, "t": 0.0})
FLOOR_TABLE = "floor_rows"

_waits = 0


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
        self.server: float | None = None

    async def measure(self, steps: int, body: Callable[[int], Awaitable[None]]) -> None:
        w, c, t = _waits, time.process_time(), time.perf_counter()
        await body(steps)
        self.add(steps, w, c, t)

    def add(self, steps: int, waits0: int, cpu0: float, wall0: float) -> None:
        """Record ``steps`` steps measured from the counters' values ``*0``."""
        self.wall.append((time.perf_counter() - wall0) / steps * 1e6)
        self.cpu.append((time.process_time() - cpu0) / steps * 1e6)
        self.trips.append((_waits - waits0) / steps)


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


async def run(steps: int, rounds: int) -> list[Row]:
    schema = f"loom_pgstep_{os.getpid()}"
    _count_waits()
    sync_conn = psycopg.connect(PG_DSN, autocommit=True)
    aconn = await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True)
    stmt_conn = await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True)
    stores = {n: await PostgresStore.open(PG_DSN, schema=schema, notify=n) for n in (True, False)}
    runtime = loom.WorkflowRuntime(stores[True])
    runtime.register(seq_flow)
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
            "channel": store._channel,
            "note": e.execution_id,
            "id": e.envelope_id,
            "type": str(e.type),
            "payload": e.payload_json,
            "at": e.recorded_at,
            "sum": e.checksum(),
        }

    def stmt_body(notify: bool) -> Callable[[int], Awaitable[None]]:
        store = stores[notify]
        sql = store._sql.events("append", one=True)

        async def body(n: int) -> None:
            eid, fence = await fresh(store, f"stmt{int(notify)}")
            # The first event (a start) goes through the store: it writes the index row.
            first = envelopes(eid, fence, n + 1)
            await store.append(first[:1])
            params = [raw_params(store, e) for e in first[1:]]
            w, c, t = _waits, time.process_time(), time.perf_counter()
            for p in params:
                cur = await stmt_conn.execute(sql, p)
                await cur.fetchone()
            rows[f"append statement, notify={'on' if notify else 'off'}"].add(n, w, c, t)

        return body

    def store_body(notify: bool) -> Callable[[int], Awaitable[None]]:
        store = stores[notify]

        async def body(n: int) -> None:
            eid, fence = await fresh(store, f"store{int(notify)}")
            evs = envelopes(eid, fence, n + 1)
            await store.append(evs[:1])
            w, c, t = _waits, time.process_time(), time.perf_counter()
            for e in evs[1:]:
                await store.append([e])
            rows[f"store.append, notify={'on' if notify else 'off'}"].add(n, w, c, t)

        return body

    async def runtime_body(n: int) -> None:
        counter["exec"] += 1
        handle = await runtime.start(seq_flow, n, execution_id=f"rt-{counter['exec']}")
        assert await handle.result() == n

    plain: list[tuple[str, Callable[[int], Awaitable[None]]]] = [
        ("floor (sync, = bench.peers)", floor_sync_body),
        ("floor (async)", floor_async),
        ("SELECT 1 (async, no commit)", select1),
        ("runtime step (200-step flow)", runtime_body),
    ]
    timed_inside = [
        ("append statement, notify=on", stmt_body(True)),
        ("append statement, notify=off", stmt_body(False)),
        ("store.append, notify=on", store_body(True)),
        ("store.append, notify=off", store_body(False)),
    ]
    rows = {name: Row(name) for name, _ in plain + timed_inside}
    try:
        # Warm-up: connections, prepared statements, caches.
        for _, body in plain + timed_inside:
            await body(20)
        for row in rows.values():
            row.wall, row.cpu, row.trips = [], [], []
        for _ in range(rounds):
            for name, body in plain:
                await rows[name].measure(steps if "runtime" not in name else 200, body)
            for _, body in timed_inside:
                await body(steps)
        # Server-side time of the statements alone (no COMMIT).
        rows["floor (sync, = bench.peers)"].server = await server_time(
            aconn,
            f"INSERT INTO {FLOOR_TABLE} (id, payload) VALUES (%s, %s)",
            (10**12, PAYLOAD),
            25,
        )
        for notify in (True, False):
            store = stores[notify]
            eid, fence = await fresh(store, "explain")
            evs = envelopes(eid, fence, 2)
            await store.append(evs[:1])
            rows[
                f"append statement, notify={'on' if notify else 'off'}"
            ].server = await server_time(
                aconn, store._sql.events("append", one=True), raw_params(store, evs[1]), 25
            )
    finally:
        await runtime.close()
        for s in stores.values():
            await s.close()
        sync_conn.execute(f"DROP TABLE IF EXISTS {FLOOR_TABLE}")
        sync_conn.close()
        await aconn.close()
        await stmt_conn.close()
        await PostgresStore.drop_schema(PG_DSN, schema)
    return list(rows.values())


def report(rows: list[Row], steps: int, rounds: int) -> None:
    floor = statistics.median(rows[0].wall)
    load = os.getloadavg()
    print(
        f"\nPostgreSQL per-step breakdown: {rounds} rounds x {steps} steps, median round; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    header = f"{'':32} {'wall µs':>8} {'x floor':>8} {'CPU µs':>7} {'trips':>6} {'server µs':>10}"
    print(header)
    print("-" * len(header))
    for r in rows:
        wall = statistics.median(r.wall)
        server = f"{r.server:10.1f}" if r.server is not None else f"{'':10}"
        print(
            f"{r.name:32} {wall:8.1f} {wall / floor:8.2f} {statistics.median(r.cpu):7.1f} "
            f"{statistics.median(r.trips):6.2f} {server}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="steps per row per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = asyncio.run(run(args.steps, args.rounds))
    report(rows, args.steps, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
