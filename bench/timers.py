"""Timer firing lag with many timers due in the same second.

    python bench/timers.py [--timers 10000]

Starts N executions that each sleep until the same instant T, then lets the runtime's
TimerService fire them. Lag is TIMER_FIRED's recorded time minus T, per timer (p50/p99/max),
plus the time from the due time until every execution completed (read from the execution
index). The clock is real time shifted so that T comes one second after setup finishes,
however long setup took. PostgreSQL rows run when
`loom.storage.postgres` and a server at $LOOM_TEST_PG_DSN (default 127.0.0.1:5432/test) exist.
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


async def measure(store: Any, n: int) -> dict[str, float]:
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
    begin = time.perf_counter()
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
    lags = []
    for i in ids:
        fired = [e for e in await store.read(i) if e.type is EventType.TIMER_FIRED]
        assert len(fired) == 1, f"{i} fired {len(fired)} times"
        lags.append((fired[0].recorded_at - target) * 1000)
    await runtime.close()
    return {
        "p50": statistics.median(lags),
        "p99": pct(lags, 0.99),
        "max": max(lags),
        "early": sum(1 for x in lags if x < 0),
        "all_done_s": all_done,
    }


async def main(n: int) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(("SQLite (FULL)", await measure(loom.SQLiteStore(Path(tmp) / "t.db"), n)))
    try:
        from loom.storage.postgres import PostgresStore

        dsn = os.environ.get("LOOM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
        schema = f"bench_timers_{os.getpid()}"
        pg = await PostgresStore.open(dsn, schema=schema)
        try:
            rows.append(("PostgreSQL", await measure(pg, n)))
        finally:
            await PostgresStore.drop_schema(dsn, schema)
    except Exception as exc:  # no server, or no PostgreSQL timer support
        print(f"PostgreSQL row skipped: {exc!r}")
    print(f"\nTimer firing lag, {n:,} timers due in the same second (ms after the due time)")
    print(f"{'store':<16} {'p50':>9} {'p99':>9} {'max':>9} {'early':>6} {'all done (s)':>13}")
    for name, r in rows:
        print(
            f"{name:<16} {r['p50']:>9.1f} {r['p99']:>9.1f} {r['max']:>9.1f} "
            f"{int(r['early']):>6} {r['all_done_s']:>13.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timers", type=int, default=10_000)
    asyncio.run(main(parser.parse_args().timers))
