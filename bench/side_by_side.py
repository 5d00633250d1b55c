"""Executions stepping side by side on one store: ``python -m bench.side_by_side``.

    python -m bench.side_by_side [--executions 1,2,4,8] [--steps 200] [--rounds 5]
                                 [--backends postgres,sqlite]

What a worker meets when it runs a few executions at once (an HTTP worker's concurrent
requests, a dispatcher's fan-out): K flows of ``--steps`` trivial steps started together on one
``WorkflowRuntime`` and one store, per round. Columns, medians over the rounds:

* *wall/step*: the round's wall time over all K x steps steps (lower is better: with more
  executions, their commits should share round trips and fsyncs);
* *cpu/step*: this process's CPU (``time.process_time``) over the same steps;
* *fairness*: when the first execution has taken all its steps, the fewest any other one has
  taken, as a share of the steps (100%: they advance together; a writer that holds the loop
  while another's answer waits unseen shows here first).

PostgreSQL at ``BENCH_PG_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/test``), skipped
with a note when no server answers; SQLite in a temporary file (``synchronous=FULL``). To compare
builds, run it once per build with ``PYTHONPATH=<that build's src>``, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any

import loom

PG_DSN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
_taken: dict[str, int] = {}


@loom.step(id="side-tick")
async def tick(execution: str) -> int:
    _taken[execution] = _taken.get(execution, 0) + 1
    return _taken[execution]


@loom.flow(id="side-by-side", version="1")
async def stepping(ctx: loom.WorkflowContext, job: dict[str, Any]) -> int:
    for _ in range(job["steps"]):
        await ctx.run(tick, job["execution"])
    return int(job["steps"])


async def _open(backend: str, workdir: str) -> Any:
    if backend == "sqlite":
        return loom.SQLiteStore(os.path.join(workdir, "side.db"))
    from loom.storage.postgres import PostgresStore

    return await PostgresStore.open(PG_DSN, schema=f"bench_side_{os.getpid()}")


async def _round(
    runtime: loom.WorkflowRuntime, tag: str, k: int, steps: int
) -> tuple[float, float, float]:
    _taken.clear()
    ids = [f"{tag}-{i}" for i in range(k)]
    t0, c0 = time.perf_counter(), time.process_time()
    handles = [
        await runtime.start(stepping, {"execution": eid, "steps": steps}, execution_id=eid)
        for eid in ids
    ]
    await next(asyncio.as_completed([h.result() for h in handles]))
    fewest = min(_taken.get(eid, 0) for eid in ids)
    await asyncio.gather(*(h.result() for h in handles))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall / (k * steps) * 1e6, cpu / (k * steps) * 1e6, fewest / steps


async def _backend(backend: str, ks: list[int], steps: int, rounds: int) -> list[str]:
    workdir = tempfile.mkdtemp(prefix="loom-side-")
    try:
        store = await _open(backend, workdir)
    except Exception as exc:  # no server: say so, measure the rest
        return [f"{backend:<9} skipped: {exc}"]
    runtime = loom.WorkflowRuntime(store)
    runtime.register(stepping)
    lines = []
    try:
        await _round(runtime, "warm", max(ks), steps)
        for k in ks:
            rows = [await _round(runtime, f"k{k}-r{r}", k, steps) for r in range(rounds)]
            wall = statistics.median(r[0] for r in rows)
            cpu = statistics.median(r[1] for r in rows)
            fair = statistics.median(r[2] for r in rows)
            lines.append(
                f"{backend:<9} {k:>10} {wall:>12.1f} {cpu:>11.1f} {fair:>9.0%}"
                f"   {os.getloadavg()[0]:.2f}"
            )
    finally:
        await runtime.close()
        if backend == "postgres":
            from loom.storage.postgres import PostgresStore

            await PostgresStore.drop_schema(PG_DSN, f"bench_side_{os.getpid()}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.side_by_side")
    parser.add_argument("--executions", default="1,2,4,8")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", default="postgres,sqlite")
    args = parser.parse_args()
    ks = [int(k) for k in args.executions.split(",") if k]
    print(f"loom from {os.path.dirname(loom.__file__)}; {args.steps} steps each, median of "
          f"{args.rounds} rounds")  # fmt: skip
    print(f"{'backend':<9} {'executions':>10} {'wall/step µs':>12} {'cpu/step µs':>11} "
          f"{'fairness':>9}   load")  # fmt: skip
    for backend in args.backends.split(","):
        for line in asyncio.run(_backend(backend, ks, args.steps, args.rounds)):
            print(line)


if __name__ == "__main__":
    main()
