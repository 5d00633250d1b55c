"""Timer firing lag with many timers due in the same second.

    python bench/timers.py [--timers 10000] [--backend both|sqlite|postgres]
                           [--concurrency N] [--compare]

Starts N executions that each sleep until the same instant T, then lets the runtime's
TimerService (one process) fire them. Lag is TIMER_FIRED's recorded time minus T, per timer
(p50/p99/max); "all done" is the time from T until the execution index counts every execution
completed; "CPU" is this process's CPU time (time.process_time) from the service's start to
then, every thread included. The clock is real time shifted so that T comes one second after
setup finishes, however long setup took. ``--compare`` also runs, alternating in the same run,
the service without its batch read (each wake reads its own state: the build before it).
PostgreSQL rows run when `loom.storage.postgres` and a server at $LOOM_TEST_PG_DSN (default
127.0.0.1:5432/test) exist. The load average is printed: on a shared machine, compare CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import loom
from loom.model import EventType, ExecutionStatus
from loom.storage import ExecutionQuery


class ShiftedClock:
    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


@loom.flow(id="wake-at", version="1")
async def wake_at(ctx: loom.WorkflowContext, when: float) -> None:
    await ctx.sleep_until(when)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(store: Any, n: int, *, batch_read: bool, concurrency: int | None) -> Row:
    clock = ShiftedClock()
    runtime = loom.WorkflowRuntime(store, clock=clock, timers=False)
    runtime.register(wake_at)
    target = clock.now() + 3600
    ids = [f"t{i:05d}" for i in range(n)]
    for chunk in range(0, n, 500):
        handles = await asyncio.gather(
            *(runtime.start(wake_at, target, execution_id=i) for i in ids[chunk : chunk + 500])
        )
        await asyncio.gather(*(h.settled() for h in handles))
    clock.offset = target - 1.0 - time.time()  # T is now one second away
    assert runtime.timers is not None
    service = runtime.timers
    service.batch = 1000
    if concurrency is not None:
        service.concurrency = concurrency
    if not batch_read:
        service.prepare = None
    begin = time.perf_counter()
    cpu = time.process_time()
    task = asyncio.ensure_future(service.run_forever())
    # "All done" is read from the execution index (one count query every 10 ms), not by
    # loading each execution's state: the harness must not add N loads to what it times.
    completed = ExecutionQuery(statuses=[ExecutionStatus.COMPLETED], flow_id=wake_at.id)
    try:
        while await store.count_executions(completed) < n:
            assert time.perf_counter() - begin < 600, "timers not all fired in 600 s"
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    all_done = time.perf_counter() - begin - 1.0
    cpu = time.process_time() - cpu
    lags = []
    twice = 0
    for i in ids:
        fired = [e for e in await store.read(i) if e.type is EventType.TIMER_FIRED]
        twice += len(fired) != 1
        lags.append((fired[0].recorded_at - target) * 1000 if fired else float("nan"))
    await runtime.close()
    return {
        "p50": statistics.median(lags),
        "p99": pct(lags, 0.99),
        "max": max(lags),
        "early": sum(1 for x in lags if x < 0),
        "not_once": twice,
        "all_done_s": all_done,
        "cpu_s": cpu,
    }


Row = dict[str, float]


async def sqlite_row(n: int, **options: Any) -> Row:
    with tempfile.TemporaryDirectory() as tmp:
        store = loom.SQLiteStore(Path(tmp) / "t.db")
        try:
            return await measure(store, n, **options)
        finally:
            await store.close()


async def postgres_row(n: int, **options: Any) -> Row:
    from loom.storage.postgres import PostgresStore

    dsn = os.environ.get("LOOM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"bench_timers_{os.getpid()}"
    pg = await PostgresStore.open(dsn, schema=schema)
    try:
        return await measure(pg, n, **options)
    finally:
        await pg.close()
        await PostgresStore.drop_schema(dsn, schema)


async def main(n: int, backend: str, concurrency: int | None, compare: bool) -> None:
    rows: list[tuple[str, str, Row]] = []
    variants = [("batch read", True)]
    if compare:
        variants.insert(0, ("read per wake", False))
    loads = [os.getloadavg()[0]]
    backends = {"sqlite": ("SQLite (FULL)", sqlite_row), "postgres": ("PostgreSQL", postgres_row)}
    for key in ("sqlite", "postgres"):
        if backend not in (key, "both"):
            continue
        name, run = backends[key]
        for label, batch_read in variants:
            try:
                row = await run(n, batch_read=batch_read, concurrency=concurrency)
            except Exception as exc:  # no server, or no PostgreSQL timer support
                print(f"{name} row skipped: {exc!r}")
                break
            rows.append((name, label, row))
            loads.append(os.getloadavg()[0])
    print(
        f"\nTimers: {n:,} due in the same second, one service process "
        f"(load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores)"
    )
    print("lag: ms from the due time to TIMER_FIRED; all done: s from the due time until every")
    print("execution completed; CPU: this process's CPU time over the same span")
    print(
        f"{'store':<15} {'wakes':<14} {'all done s':>10} {'CPU s':>7} {'CPU/timer':>10} "
        f"{'lag p50':>8} {'p99':>8} {'max':>8} {'early':>6} {'not once':>9}"
    )
    for name, label, r in rows:
        print(
            f"{name:<15} {label:<14} {r['all_done_s']:>10.2f} {r['cpu_s']:>7.2f} "
            f"{r['cpu_s'] / n * 1e6:>8.0f}µs {r['p50']:>8.0f} {r['p99']:>8.0f} {r['max']:>8.0f} "
            f"{int(r['early']):>6} {int(r['not_once']):>9}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timers", type=int, default=10_000)
    parser.add_argument("--backend", choices=["both", "sqlite", "postgres"], default="both")
    parser.add_argument("--concurrency", type=int, default=None, help="wakes at once")
    parser.add_argument("--compare", action="store_true", help="also without the batch read")
    args = parser.parse_args()
    asyncio.run(main(args.timers, args.backend, args.concurrency, args.compare))
