"""What a fused step path could save: ``python -m bench.fused_step [--rounds 9]``.

``floor`` is ``bench.step_overhead``'s: ``BEGIN IMMEDIATE; INSERT; COMMIT`` of one row into an
``INTEGER PRIMARY KEY`` table, synchronously, on one warm connection.
``ideal`` is an async loop that awaits the step's coroutine, builds the record's JSON (as
``_step_completed_json`` does) and checksum, and runs the lone append's four statements on a
table shaped like Loom's. That is the least Python an async durable step has to run, with none
of the runtime's and store's layers. ``runtime`` is a 200-step flow through ``WorkflowRuntime``
on ``SQLiteStore``; its flow start and end are amortised over the steps (~4 µs a step). Both
run in one process, at FULL and then at NORMAL, in rounds whose order alternates. Each row gives
the median wall and CPU µs per step.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable

from bench.peers.systems.loom_system import seq_flow  # the flow bench.peers times per step

import loom
from loom.storage._sqlite_sql import INSERT_EVENT

STEPS = 200
_EVENTS = (
    "CREATE TABLE loom_events (execution_id TEXT NOT NULL, sequence INTEGER NOT NULL,"
    " envelope_id TEXT NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL,"
    " recorded_at REAL NOT NULL, fence INTEGER NOT NULL, checksum TEXT NOT NULL,"
    " PRIMARY KEY (execution_id, sequence))"
)
_CHECKSUM = hashlib.blake2b(digest_size=12)


async def raw_inc(x: int) -> int:
    return x + 1


async def measure(synchronous: str, rounds: int) -> None:
    workdir = tempfile.mkdtemp(prefix="loom-fused-")
    store = loom.SQLiteStore(os.path.join(workdir, "loom.db"), synchronous=synchronous)
    runtime = loom.WorkflowRuntime(store)
    runtime.register(seq_flow)
    conn = sqlite3.connect(os.path.join(workdir, "ideal.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute(_EVENTS)
    conn.execute("CREATE TABLE floor_rows (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
    cur = conn.cursor()
    count = 0
    floor_id = 0

    async def floor(n: int) -> None:
        nonlocal floor_id
        for _ in range(n):
            floor_id += 1
            cur.execute("BEGIN IMMEDIATE")
            cur.execute("INSERT INTO floor_rows (id, payload) VALUES (?, ?)", (floor_id, "x" * 90))
            cur.execute("COMMIT")

    async def ideal(n: int) -> None:
        nonlocal count
        count += 1
        eid = f"{count:032x}"
        x = 0
        for seq in range(1, n + 1):
            x = await raw_inc(x)
            now = time.time()
            payload = (
                f'{{"position":{seq - 1},"step_id":"inc","attempt":1,"output":{x},'
                f'"started_at":{now!r}}}'
            )
            digest = _CHECKSUM.copy()
            digest.update(
                f"{eid}#{seq}.1\x1f{eid}\x1f{seq}\x1fSTEP_COMPLETED\x1f{payload}\x1f{now!r}\x1f1".encode()
            )
            cur.execute("BEGIN IMMEDIATE")
            cur.execute("PRAGMA data_version").fetchone()
            row = (eid, seq, "", "STEP_COMPLETED", payload, now, 1, digest.hexdigest())
            cur.execute(INSERT_EVENT, row)
            cur.execute("COMMIT")

    async def through_runtime(n: int) -> None:
        nonlocal count
        count += 1
        handle = await runtime.start(seq_flow, n, execution_id=f"r{count}")
        assert await handle.result() == n

    rows: list[tuple[str, Callable[[int], Awaitable[None]]]] = [
        ("floor", floor),
        ("ideal", ideal),
        ("runtime", through_runtime),
    ]
    for _ in range(5):  # warm-up: WAL reuse, statement caches
        for _, body in rows:
            await body(STEPS)
    wall: dict[str, list[float]] = {name: [] for name, _ in rows}
    cpu: dict[str, list[float]] = {name: [] for name, _ in rows}
    for i in range(rounds):
        for name, body in rows if i % 2 else rows[::-1]:
            t, c = time.perf_counter(), time.process_time()
            await body(STEPS)
            wall[name].append((time.perf_counter() - t) / STEPS * 1e6)
            cpu[name].append((time.process_time() - c) / STEPS * 1e6)
    base = statistics.median(wall["floor"])
    for name, _ in rows:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(
            f"{synchronous:7} {name:8} wall {w:7.1f} µs/step ({w / base:4.2f}x the floor)"
            f"   CPU {c:7.1f} µs/step"
        )
    await runtime.close()
    await store.close()
    conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fused_step")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds of {STEPS} steps")
    for synchronous in ("FULL", "NORMAL"):
        asyncio.run(measure(synchronous, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
