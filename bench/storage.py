"""Append throughput and latency of the stores: ``python bench/storage.py [--seconds 2]``.

For 1, 8 and 64 concurrent writers (each appending one event at a time to its own execution),
with group commit and without (``group_commit=False``), on SQLite (``synchronous=FULL``) and
PostgreSQL, next to the raw driver floor: the same number of writers, each on its own connection,
doing one ``INSERT`` + ``COMMIT`` per row into a plain table of the same database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from loom.model import Envelope, EventType
from loom.storage import SQLiteStore, Store
from loom.storage.postgres import PostgresStore

PG_DSN = os.environ.get(
    "LOOM_BENCH_PG_DSN",
    os.environ.get("LOOM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"),
)
WRITERS = (1, 8, 64)
PAYLOAD = {"position": 0, "step_id": "bench", "output": {"rows": 1234, "ok": True}}
#: Unmeasured lead-in per configuration (connections, prepared statements, caches).
WARMUP = 0.3


@dataclass
class Result:
    backend: str
    mode: str
    writers: int
    count: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.count / self.seconds

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def bench_store(
    store: Store, backend: str, mode: str, writers: int, seconds: float
) -> Result:
    latencies: list[float] = []
    ids = [f"{mode}-{writers}-{i}" for i in range(writers)]
    fences = [await store.acquire_fence(i) for i in ids]
    begin = time.perf_counter() + WARMUP
    stop = begin + seconds

    async def writer(execution_id: str, fence: int) -> None:
        seq = 0
        while time.perf_counter() < stop:
            envelope = Envelope.create(
                execution_id,
                seq,
                EventType.EXECUTION_STARTED if seq == 0 else EventType.STEP_COMPLETED,
                PAYLOAD,
                fence=fence,
                recorded_at=time.time(),
            )
            t0 = time.perf_counter()
            await store.append([envelope])
            t1 = time.perf_counter()
            if t0 >= begin and t1 <= stop:
                latencies.append(t1 - t0)
            seq += 1

    await asyncio.gather(*(writer(i, f) for i, f in zip(ids, fences, strict=True)))
    return Result(backend, mode, writers, len(latencies), seconds, latencies)


def sqlite_floor(path: Path, writers: int, seconds: float) -> Result:
    """Threads, one connection each, INSERT in autocommit (= INSERT + COMMIT) per row."""
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode = WAL")
    setup.execute(
        "CREATE TABLE IF NOT EXISTS floor (execution_id TEXT, sequence INTEGER, payload TEXT, "
        "PRIMARY KEY (execution_id, sequence))"
    )
    setup.close()
    latencies: list[float] = []
    lock = threading.Lock()
    begin = time.perf_counter() + WARMUP
    stop = begin + seconds
    text = str(PAYLOAD)

    def writer(n: int) -> None:
        conn = sqlite3.connect(path, isolation_level=None, timeout=60, check_same_thread=False)
        conn.execute("PRAGMA synchronous = FULL")
        mine = []
        seq = 0
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            conn.execute("INSERT INTO floor VALUES (?, ?, ?)", (f"{writers}-{n}", seq, text))
            t1 = time.perf_counter()
            if t0 >= begin and t1 <= stop:
                mine.append(t1 - t0)
            seq += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Result("sqlite", "floor", writers, len(latencies), seconds, latencies)


async def pg_floor(dsn: str, schema: str, writers: int, seconds: float) -> Result:
    """One connection per writer, INSERT in autocommit (= INSERT + COMMIT) per row."""
    table = f'"{schema}".floor'
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (execution_id text, sequence bigint, "
            "payload text, PRIMARY KEY (execution_id, sequence))"
        )
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(writers)]
    latencies: list[float] = []
    begin = time.perf_counter() + WARMUP
    stop = begin + seconds
    text = str(PAYLOAD)

    async def writer(n: int, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        seq = 0
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await conn.execute(
                f"INSERT INTO {table} VALUES (%s, %s, %s)", (f"{writers}-{n}", seq, text)
            )
            t1 = time.perf_counter()
            if t0 >= begin and t1 <= stop:
                latencies.append(t1 - t0)
            seq += 1

    try:
        await asyncio.gather(*(writer(n, c) for n, c in enumerate(conns)))
    finally:
        for c in conns:
            await c.close()
    return Result("postgres", "floor", writers, len(latencies), seconds, latencies)


async def run_sqlite(seconds: float, tmp: Path) -> list[Result]:
    results = []
    for writers in WRITERS:
        results.append(await asyncio.to_thread(sqlite_floor, tmp / "floor.db", writers, seconds))
        for group_commit in (True, False):
            store = SQLiteStore(tmp / f"s-{writers}-{group_commit}.db", group_commit=group_commit)
            try:
                mode = "coalesced" if group_commit else "per-append"
                results.append(await bench_store(store, "sqlite", mode, writers, seconds))
            finally:
                await store.close()
    return results


async def run_postgres(seconds: float) -> list[Result]:
    schema = f"loom_bench_{os.getpid()}"
    results = []
    try:
        for writers in WRITERS:
            results.append(await pg_floor(PG_DSN, schema, writers, seconds))
            for group_commit in (True, False):
                store = await PostgresStore.open(PG_DSN, schema=schema, group_commit=group_commit)
                try:
                    mode = "coalesced" if group_commit else "per-append"
                    results.append(await bench_store(store, "postgres", mode, writers, seconds))
                finally:
                    await store.close()
    finally:
        await PostgresStore.drop_schema(PG_DSN, schema)
    return results


def report(results: list[Result]) -> None:
    print(f"\n{'store':9} {'mode':11} {'writers':>7} {'appends/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for r in results:
        print(
            f"{r.backend:9} {r.mode:11} {r.writers:7} {r.rate:10.0f} {r.pct(0.5):8.2f} "
            f"{r.pct(0.99):8.2f}"
        )
    by = {(r.backend, r.mode, r.writers): r for r in results}
    print()
    for backend in sorted({r.backend for r in results}):
        floor64, co64 = by.get((backend, "floor", 64)), by.get((backend, "coalesced", 64))
        floor1, co1, pa1 = (by.get((backend, m, 1)) for m in ("floor", "coalesced", "per-append"))
        if floor64 and co64:
            print(
                f"{backend}: 64 writers coalesced vs floor: {co64.rate / floor64.rate:.2f}x "
                f"({co64.rate:.0f} vs {floor64.rate:.0f} appends/s)"
            )
        if floor1 and co1 and pa1:
            print(
                f"{backend}: 1 writer p50 coalesced {co1.pct(0.5):.3f} ms, per-append "
                f"{pa1.pct(0.5):.3f} ms, floor {floor1.pct(0.5):.3f} ms"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per configuration")
    parser.add_argument("--stores", default="sqlite,postgres")
    args = parser.parse_args()
    stores = args.stores.split(",")
    results: list[Result] = []
    runs: list[Callable[[], Awaitable[list[Result]]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if "sqlite" in stores:
            runs.append(lambda: run_sqlite(args.seconds, Path(tmp)))
        if "postgres" in stores:
            try:
                psycopg.connect(PG_DSN, connect_timeout=3).close()
                runs.append(lambda: run_postgres(args.seconds))
            except psycopg.Error as exc:
                print(f"postgres skipped: {exc}", file=sys.stderr)
        for run in runs:
            results += asyncio.run(run())
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, {args.seconds}s per row")
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
