"""Per-step durable overhead and a human gate on SQLite, next to the raw floor of the same run.

    python -m bench.step_overhead [--steps 200] [--rounds 9] [--pause 1.0] [--gates 5]

**Floor.** One ``BEGIN IMMEDIATE; INSERT; COMMIT`` per row on a WAL file with the same
``synchronous`` setting: the physical cost of making one record durable. The floor keeps ONE
long-lived connection, warmed before the first measurement (reopening it each round deletes the
WAL on close and roughly doubles its cost: an earlier version of this script did that and
flattered Loom by the same factor). Each Loom repetition is bracketed by a floor sample before
and after it; the ratio of a repetition is Loom over the mean of its two brackets, so a disk
whose speed drifts during the run moves both alike. Medians over the repetitions are reported.

**Loom.** Wall time of an N-step flow of trivial steps divided by N (each step is one durable
commit: one STEP_COMPLETED record), and the CPU time of the process (every thread) per step: on
a shared machine whose scheduler inflates wall times, the CPU column still compares two builds.
``CPU above floor`` is that less the floor's own CPU per row in the brackets (the commit's
fsync costs CPU too: tens of µs at ``FULL``): what Loom's Python and extra statements add.
Loom is warmed with as many steps as the floor's warm-up rows, so both WALs are reused, not
growing, when measured.

**Gate, as a person uses it.** A flow runs a step, suspends on a gate, and after the decision
runs one more step. The decision arrives ``--pause`` seconds after the suspension (a person
reads the question first; the WAL and the page cache go cold meanwhile), and the figure is from
``resume()`` until the flow's result is in hand, so it includes the step after the gate. The
``immediate`` row resumes at once (the best case, which is what the peer harness's gate measures).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import loom

PAYLOAD = '{"position":1,"step_id":"noop","attempt":1,"output":null}'


class Floor:
    """One long-lived, warmed raw-SQLite writer: the commit floor."""

    def __init__(self, path: Path, synchronous: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.cpu = 0.0
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self.conn.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, payload TEXT)")

    def us_per_row(self, rows: int) -> float:
        """Wall µs per row; the CPU µs per row (this process) is left in ``cpu``."""
        conn = self.conn
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(rows):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO floor (payload) VALUES (?)", (PAYLOAD,))
            conn.execute("COMMIT")
        self.cpu = (time.process_time() - cpu) / rows * 1e6
        return (time.perf_counter() - start) / rows * 1e6

    def close(self) -> None:
        self.conn.close()


@loom.step(id="noop")
async def noop() -> None:
    return None


def make_flow(steps: int) -> loom.Flow[None, None]:
    @loom.flow(id=f"steps-{steps}")
    async def many(ctx: loom.WorkflowContext) -> None:
        for _ in range(steps):
            await ctx.run(noop)

    return many


@loom.flow(id="gate-as-used")
async def gate_flow(ctx: loom.WorkflowContext) -> Any:
    await ctx.run(noop)
    decision = await ctx.suspend("Approve")
    await ctx.run(noop)
    return decision


#: CPU seconds (this process, every thread) of the last ``loom_us`` call.
_cpu = [0.0]


async def loom_us(runtime: loom.WorkflowRuntime, flow: loom.Flow[None, None], steps: int) -> float:
    start, cpu = time.perf_counter(), time.process_time()
    handle = await runtime.start(flow)
    await handle.result()
    _cpu[0] = (time.process_time() - cpu) / steps * 1e6
    return (time.perf_counter() - start) / steps * 1e6


async def gate_ms(runtime: loom.WorkflowRuntime, pause: float) -> float:
    handle = await runtime.start(gate_flow)
    await handle.wait_for_suspend()
    if pause:
        await asyncio.sleep(pause)  # a person reading the question; not inside the timing
    start = time.perf_counter()
    resumed = await runtime.resume(handle.execution_id, "Approve", {"ok": True})
    await resumed.result()
    return (time.perf_counter() - start) * 1e3


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):>8.1f} ({min(values):.0f}-{max(values):.0f})"


async def main(steps: int, rounds: int, pause: float, gates: int) -> None:
    flow = make_flow(steps)
    per_step: list[tuple[str, list[float], list[float], list[float], list[float]]] = []
    gate_rows: list[tuple[str, float, list[float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        syncs: tuple[Literal["FULL", "NORMAL"], ...] = ("FULL", "NORMAL")
        for synchronous in syncs:
            store = loom.SQLiteStore(Path(tmp) / f"loom-{synchronous}.db", synchronous=synchronous)
            runtime = loom.WorkflowRuntime(store)
            runtime.register(flow)
            runtime.register(gate_flow)
            floor = Floor(Path(tmp) / f"floor-{synchronous}.db", synchronous)
            floor.us_per_row(1000)  # reach the WAL's steady state first
            # Warm-up: as many steps as the floor's warm-up rows, so that Loom's WAL too is
            # reused rather than still growing (a commit costs about twice as much then).
            for _ in range(max(1, -(-1000 // steps))):
                await loom_us(runtime, flow, steps)
            floors, looms, ratios, cpus, above = [], [], [], [], []
            for _ in range(rounds):
                before = floor.us_per_row(steps)
                cpu_before = floor.cpu
                value = await loom_us(runtime, flow, steps)
                cpus.append(_cpu[0])
                after = floor.us_per_row(steps)
                above.append(_cpu[0] - (cpu_before + floor.cpu) / 2)
                floors.append((before + after) / 2)
                looms.append(value)
                ratios.append(value / ((before + after) / 2))
            per_step.append((synchronous, floors, looms, ratios, cpus, above))
            if synchronous == "FULL":
                await gate_ms(runtime, 0)  # warm-up
                for label, wait in (("immediate", 0.0), (f"after {pause:g} s", pause)):
                    samples = [await gate_ms(runtime, wait) for _ in range(gates)]
                    gate_rows.append((label, statistics.median(floors), samples))
            await runtime.close()
            floor.close()
    load = os.getloadavg()
    print(
        f"\nPer-step durable overhead, {steps}-step flow of trivial steps, {rounds} rounds, each "
        f"bracketed by the floor (median, min-max); load average {load[0]:.1f}"
    )
    print(
        f"{'synchronous':<12} {'raw floor µs/row':>22} {'Loom µs/step':>22} "
        f"{'Loom / floor':>22} {'Loom CPU µs/step':>22} {'CPU above floor':>22}"
    )
    for synchronous, floors, looms, ratios, cpus, above in per_step:
        r = statistics.median(ratios)
        print(
            f"{synchronous:<12} {_fmt(floors):>22} {_fmt(looms):>22} "
            f"{r:>8.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) {_fmt(cpus):>22} "
            f"{_fmt(above):>22}"
        )
    print("Target: one durable commit per step and at most 1.2x the floor (synchronous=FULL).")
    print(
        f"\nGate resume -> result, step before and step after the gate, synchronous=FULL, "
        f"{gates} trips (median, min-max)"
    )
    print(f"{'decision':<12} {'ms':>22} {'÷ floor commit':>22}")
    for label, floor_us, samples in gate_rows:
        ratio = statistics.median(samples) * 1e3 / floor_us
        print(f"{label:<12} {_fmt(samples):>22} {ratio:>21.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--pause", type=float, default=1.0, help="seconds before the decision")
    parser.add_argument("--gates", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.rounds, args.pause, args.gates))
