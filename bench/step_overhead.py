"""Per-step durable overhead on SQLite, next to the raw floor measured in the same run.

    python bench/step_overhead.py [--steps 200] [--rounds 9]

The floor is one sqlite3 INSERT + COMMIT per row on a WAL file with the same synchronous
setting: the physical cost of making one record durable. Loom's figure is the wall time of a
200-step flow of trivial steps divided by 200 (each step is one durable commit). Rounds
alternate floor and Loom so that disk noise hits both alike; medians are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import loom


def floor_us(path: Path, rows: int, synchronous: str) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, payload TEXT)")
    payload = '{"position":1,"step_id":"noop","attempt":1,"output":null}'
    start = time.perf_counter()
    for _ in range(rows):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO floor (payload) VALUES (?)", (payload,))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed / rows * 1e6


@loom.step(id="noop")
async def noop() -> None:
    return None


def make_flow(steps: int) -> loom.Flow[None, None]:
    @loom.flow(id=f"steps-{steps}")
    async def many(ctx: loom.WorkflowContext) -> None:
        for _ in range(steps):
            await ctx.run(noop)

    return many


async def loom_us(runtime: loom.WorkflowRuntime, flow: loom.Flow[None, None], steps: int) -> float:
    start = time.perf_counter()
    handle = await runtime.start(flow)
    await handle.result()
    return (time.perf_counter() - start) / steps * 1e6


async def main(steps: int, rounds: int) -> None:
    flow = make_flow(steps)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for synchronous in ("FULL", "NORMAL"):
            store = loom.SQLiteStore(Path(tmp) / f"loom-{synchronous}.db", synchronous=synchronous)  # type: ignore[arg-type]
            runtime = loom.WorkflowRuntime(store)
            runtime.register(flow)
            await loom_us(runtime, flow, steps)  # warm-up
            floor_us(Path(tmp) / f"floor-{synchronous}.db", steps, synchronous)
            floors, looms = [], []
            for _ in range(rounds):
                floors.append(floor_us(Path(tmp) / f"floor-{synchronous}.db", steps, synchronous))
                looms.append(await loom_us(runtime, flow, steps))
            await runtime.close()
            rows.append((synchronous, floors, looms))
    print(
        f"\nPer-step durable overhead, {steps}-step flow of trivial steps, {rounds} rounds "
        "(median, min-max), SQLite WAL"
    )
    print(f"{'synchronous':<12} {'raw floor µs/row':>22} {'Loom µs/step':>22} {'Loom / floor':>13}")
    for synchronous, floors, looms in rows:
        f_med, l_med = statistics.median(floors), statistics.median(looms)
        print(
            f"{synchronous:<12} {f_med:>8.1f} ({min(floors):.0f}-{max(floors):.0f}){'':>4} "
            f"{l_med:>8.1f} ({min(looms):.0f}-{max(looms):.0f}){'':>4} {l_med / f_med:>12.2f}x"
        )
    print("Target: one durable commit per step and at most 1.2x the floor (synchronous=FULL).")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.rounds))
