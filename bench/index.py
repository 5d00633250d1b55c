"""Listing executions from the index: first and next page of suspended executions out of N.

    python bench/index.py [--executions 100000] [--page 50] [--backends sqlite,postgres]

Fills a fresh store through the real write path (each execution one atomic take-over holding
EXECUTION_STARTED, and for every other one EXECUTION_SUSPENDED), then times, over many rounds,
the first page and the next page (keyset cursor) of ``status = suspended``, a page filtered by
flow as well, and a count. Prints medians and p95 in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from loom.model import Envelope, EventType
from loom.storage import ExecutionQuery, SQLiteStore

PG_DSN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def _batch(i: int, now: float) -> list[Envelope]:
    eid = f"{int(now * 1e6) + i:016x}-{i:07d}"
    start = Envelope.create(
        eid,
        0,
        EventType.EXECUTION_STARTED,
        {"flow_id": f"flow-{i % 10}", "flow_version": "1", "input": i},
        fence=1,
        recorded_at=now + i * 1e-3,
    )
    if i % 2:
        return [start]
    wait = Envelope.create(
        eid,
        1,
        EventType.EXECUTION_SUSPENDED,
        {"position": 1, "event_type": "approve"},
        fence=1,
        recorded_at=now + i * 1e-3,
    )
    return [start, wait]


async def fill(store: Any, n: int) -> float:
    now = time.time() - n * 1e-3
    started = time.perf_counter()
    chunk = 500
    for lo in range(0, n, chunk):
        await asyncio.gather(
            *(store.take_over(_batch(i, now), from_fence=0) for i in range(lo, min(n, lo + chunk)))
        )
    return time.perf_counter() - started


async def timed(fn: Callable[[], Awaitable[Any]], rounds: int) -> tuple[float, float]:
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t) * 1e3)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


async def measure(name: str, store: Any, n: int, page: int, rounds: int) -> list[tuple[str, ...]]:
    fill_s = await fill(store, n)
    suspended = ExecutionQuery(statuses=["suspended"], limit=page)
    first = await store.list_executions(suspended)
    assert len(first.items) == page and first.next_cursor is not None
    nxt = ExecutionQuery(statuses=["suspended"], limit=page, cursor=first.next_cursor)
    by_flow = ExecutionQuery(statuses=["suspended"], flow_id="flow-4", limit=page)
    flow_only = ExecutionQuery(flow_id="flow-3", limit=page)
    everything = ExecutionQuery(limit=page)
    rows = []
    for label, fn in (
        ("first page, suspended", lambda: store.list_executions(suspended)),
        ("next page, suspended", lambda: store.list_executions(nxt)),
        ("first page, suspended + flow", lambda: store.list_executions(by_flow)),
        ("first page, flow (any status)", lambda: store.list_executions(flow_only)),
        ("first page, no filter", lambda: store.list_executions(everything)),
        ("count, suspended", lambda: store.count_executions(suspended)),
        ("change feed, 100 after 0", lambda: store.changes(0, 100)),
    ):
        await fn()  # warm
        med, p95 = await timed(fn, rounds)
        rows.append((name, label, f"{med:.2f}", f"{p95:.2f}"))
    total = await store.count_executions(ExecutionQuery())
    waiting = await store.count_executions(suspended)
    print(f"{name}: {total:,} executions ({waiting:,} suspended) written in {fill_s:.1f} s")
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--executions", type=int, default=100_000)
    parser.add_argument("--page", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    rows: list[tuple[str, ...]] = []
    backends = args.backends.split(",")
    if "sqlite" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            store = SQLiteStore(Path(tmp) / "index.db")
            try:
                rows += await measure("sqlite", store, args.executions, args.page, args.rounds)
            finally:
                await store.close()
    if "postgres" in backends:
        try:
            from loom.storage.postgres import PostgresStore
        except ImportError as exc:
            print(f"postgres: skipped ({exc})")
        else:
            await PostgresStore.drop_schema(PG_DSN, "bench_index")
            store = await PostgresStore.open(PG_DSN, schema="bench_index")
            try:
                rows += await measure("postgres", store, args.executions, args.page, args.rounds)
            finally:
                await store.close()
                await PostgresStore.drop_schema(PG_DSN, "bench_index")
    print()
    header = ("store", "query", "median ms", "p95 ms")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    asyncio.run(main())
