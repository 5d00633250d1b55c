"""The bus and graph executor's cost over a bare dispatch, on SQLite.

    python bench/bus.py [--n 100] [--reps 3]

Each workload runs the same trivial flow (one step returning ``x * 2``) N times:

* ``dispatch``: N ``LocalDispatcher.dispatch`` of start packages, one after the other;
* ``bus.send``: N ``InProcessA2ABus.send`` (the same dispatch plus the task lookup before it
  and the A2A mapping after it), one after the other;
* ``graph, N independent nodes``: one ``execute_graph`` whose N nodes all run in parallel;
* ``graph, chain of N``: one ``execute_graph`` of N nodes each depending on the one before.

Overhead per task = (workload - dispatch) / N. Each cell is the median of ``--reps`` runs
[min..max], after one warm-up, each on a fresh SQLite file.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import loom
from loom.orchestration import Graph, InProcessA2ABus, Node, execute_graph
from loom.placement import ExecutionPackage, LocalDispatcher, LocalWorkerRuntime
from loom.storage import SQLiteStore


@loom.step(id="bench-bus-double")
async def double(x: int) -> int:
    return x * 2


@loom.flow(id="bench-bus-one", version="1")
async def one(ctx: loom.WorkflowContext, x: int) -> int:
    return await ctx.run(double, x)


Workload = Callable[[loom.WorkflowRuntime, int], Awaitable[None]]


async def dispatch(rt: loom.WorkflowRuntime, n: int) -> None:
    dispatcher = LocalDispatcher(LocalWorkerRuntime(rt))
    for i in range(n):
        await dispatcher.dispatch(ExecutionPackage(f"d-{i}", "bench-bus-one", input=i))


async def bus_send(rt: loom.WorkflowRuntime, n: int) -> None:
    bus = InProcessA2ABus(rt)
    bus.register(one)
    for i in range(n):
        await bus.send("bench-bus-one", i, task_id=f"t-{i}")


async def graph_wide(rt: loom.WorkflowRuntime, n: int) -> None:
    graph = Graph([Node(f"n{i}", "bench-bus-one", constant=i) for i in range(n)])
    run = await execute_graph(
        LocalDispatcher(LocalWorkerRuntime(rt)), graph, None, store=rt.store, run_id="w"
    )
    assert run.status == "completed"


async def graph_chain(rt: loom.WorkflowRuntime, n: int) -> None:
    nodes = [Node("n0", "bench-bus-one", constant=1)]
    nodes += [Node(f"n{i}", "bench-bus-one", deps=(f"n{i - 1}",), constant=1) for i in range(1, n)]
    run = await execute_graph(
        LocalDispatcher(LocalWorkerRuntime(rt)), Graph(nodes), None, store=rt.store, run_id="c"
    )
    assert run.status == "completed"


async def timed(work: Workload, n: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        rt = loom.WorkflowRuntime(SQLiteStore(Path(tmp) / "bench.db"), timers=False)
        rt.register(one)
        try:
            began = time.perf_counter()
            await work(rt, n)
            return time.perf_counter() - began
        finally:
            await rt.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rows: list[tuple[str, list[float]]] = []
    for name, work in [
        ("dispatch", dispatch),
        ("bus.send", bus_send),
        (f"graph, {args.n} independent nodes", graph_wide),
        (f"graph, chain of {args.n}", graph_chain),
    ]:
        await timed(work, min(args.n, 5))  # warm-up
        rows.append((name, [await timed(work, args.n) for _ in range(args.reps)]))
    base = statistics.median(rows[0][1])
    print(f"N = {args.n}, SQLite, median of {args.reps} [min..max]")
    print(f"{'workload':<32} {'wall (s)':>22} {'per task (ms)':>14} {'over dispatch (ms)':>19}")
    for name, times in rows:
        med = statistics.median(times)
        span = f"{med:.3f} [{min(times):.3f}..{max(times):.3f}]"
        over = (med - base) / args.n * 1000
        print(f"{name:<32} {span:>22} {med / args.n * 1000:>14.2f} {over:>19.2f}")


if __name__ == "__main__":
    asyncio.run(main())
