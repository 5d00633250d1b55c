"""Child executions: fan-out of N children against N sequential steps and N independent starts.

    python bench/orchestration.py [--n 100] [--reps 3] [--backends sqlite,postgres]

Three workloads, each doing the same trivial work (one step returning ``x * 2``) N times:

* ``fan-out``: one parent flow runs ``ctx.fan_out`` over N children (each its own execution
  with its own log), start of the parent to its result;
* ``sequential steps``: one flow runs N ``ctx.run`` steps one after the other (no children);
* ``independent starts``: N executions of the one-step flow started at once with
  ``runtime.start`` and awaited with ``runtime.wait``.

Child dispatch overhead per child = (fan-out - independent starts) / N: what a child costs the
parent beyond running it as an independent execution (its start record, the durable wait, the
wake-up through the mailbox, the parent's replays). Each cell is the median of ``--reps`` runs
[min..max], after one warm-up. PostgreSQL rows need a server at $LOOM_TEST_PG_DSN (default
postgresql://postgres@127.0.0.1:5432/test); each repetition uses a fresh schema, dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import loom
from loom.storage import SQLiteStore

PG_DSN = os.environ.get("LOOM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@loom.step(id="bench-double")
async def double(x: int) -> int:
    return x * 2


@loom.flow(id="bench-one-step", version="1")
async def one_step(ctx: loom.WorkflowContext, x: int) -> int:
    return await ctx.run(double, x)


@loom.flow(id="bench-fan-out", version="1")
async def fan(ctx: loom.WorkflowContext, n: int) -> int:
    results = await ctx.fan_out([(one_step, i) for i in range(n)])
    return sum(results)


@loom.flow(id="bench-sequential", version="1")
async def sequential(ctx: loom.WorkflowContext, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.run(double, i)
    return total


async def w_fan_out(rt: loom.WorkflowRuntime, n: int) -> None:
    handle = await rt.start(fan, n)
    assert await handle.result(timeout=600) == n * (n - 1)


async def w_sequential(rt: loom.WorkflowRuntime, n: int) -> None:
    handle = await rt.start(sequential, n)
    assert await handle.result(timeout=600) == n * (n - 1)


async def w_independent(rt: loom.WorkflowRuntime, n: int) -> None:
    handles = await asyncio.gather(*(rt.start(one_step, i) for i in range(n)))
    states = await asyncio.gather(*(rt.wait(h.execution_id, timeout=600) for h in handles))
    assert sum(s.output for s in states) == n * (n - 1)


WORKLOADS: dict[str, Callable[[loom.WorkflowRuntime, int], Awaitable[None]]] = {
    "fan-out": w_fan_out,
    "sequential steps": w_sequential,
    "independent starts": w_independent,
}


async def open_store(backend: str, tmp: Path) -> tuple[Any, Callable[[], Awaitable[None]]]:
    if backend == "sqlite":
        store = SQLiteStore(tmp / f"{uuid.uuid4().hex}.db")

        async def nothing() -> None:
            return None

        return store, nothing
    from loom.storage.postgres import PostgresStore

    schema = f"bench_orch_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(PG_DSN, schema=schema)

    async def drop() -> None:
        await PostgresStore.drop_schema(PG_DSN, schema)

    return store, drop


async def once(backend: str, name: str, n: int, tmp: Path) -> float:
    store, cleanup = await open_store(backend, tmp)
    rt = loom.WorkflowRuntime(store=store, timers=False)
    rt.register(one_step, fan, sequential)
    try:
        await w_independent(rt, 2)  # open connections, create the schema: not timed
        begin = time.perf_counter()
        await WORKLOADS[name](rt, n)
        return time.perf_counter() - begin
    finally:
        await rt.close()
        await cleanup()


def pg_ok() -> str | None:
    try:
        import psycopg

        with psycopg.connect(PG_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    n = args.n
    rows: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for backend in args.backends.split(","):
            if backend == "postgres" and (why := pg_ok()) is not None:
                rows.append((backend, "all", f"skipped: {why}", ""))
                continue
            medians: dict[str, float] = {}
            for name in WORKLOADS:
                await once(backend, name, max(2, n // 10), tmp)  # warm-up
                times = [await once(backend, name, n, tmp) for _ in range(args.reps)]
                med = statistics.median(times)
                medians[name] = med
                cell = f"{med * 1000:8.1f} ms [{min(times) * 1000:.1f}..{max(times) * 1000:.1f}]"
                rows.append((backend, name, cell, f"{med / n * 1e6:8.0f} µs/item"))
            ratio = medians["fan-out"] / medians["independent starts"]
            overhead = (medians["fan-out"] - medians["independent starts"]) / n
            rows.append(
                (
                    backend,
                    "fan-out ÷ independent",
                    f"{ratio:8.2f} x  (target on postgres: <= 3)",
                    f"{overhead * 1e6:8.0f} µs/child overhead",
                )
            )
    width = [max(len(r[i]) for r in rows) for i in range(4)]
    header = ("backend", f"workload (N={n})", "wall time, median [min..max]", "per item")
    width = [max(w, len(h)) for w, h in zip(width, header, strict=True)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, width, strict=True))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, width, strict=True)))


if __name__ == "__main__":
    asyncio.run(main())
