"""How Loom's costs grow: log length, snapshots, suspended executions, worker processes.

    python -m bench.scale [--lengths 100,1000,10000] [--suspended 2000] [--procs 1,2,4]
    python -m bench.scale --suspended 0 --procs '' --listing ''   # the log-length table only

Tables (printed) and plots (``bench/results/scale-*.png``, when matplotlib from the ``bench``
extra is installed):

* **load / recover vs log length**, SQLite, with snapshots (every 256 events, the default) as
  chained segments whose ops are stored compactly (columns), the same chain with one object
  per op (how ops were stored before, same build), the whole-state snapshots of before
  segments (same build, the store's segments hidden from the runtime, ops as objects), and
  without snapshots. *load* is ``runtime.load_state`` from a fresh store object (median of 5).
  *recover* is a fresh runtime's ``recover(id)`` until the flow's result is in hand (the log
  holds N completed steps of a process that died before step N+1), median of 3, each on a
  copy of the crashed log: loading, taking over, replaying N steps from the log, running the
  new one and recording the flow's completion (two commits). Wall and CPU
  (``time.process_time``: the process, all threads) milliseconds.
* **snapshot bytes** written while the N-step log was written, and their ratio to the log's
  own bytes (linear growth keeps the ratio flat); **write cpu/step**: the process's CPU per
  step while the N steps were written (``synchronous=NORMAL``, so the commits' share is
  small): what snapshots add to a step as the log grows.
* **memory per suspended execution**: Python heap (tracemalloc) per execution after starting
  N executions that suspend at a gate, with the runtime still holding them.
* **listing vs execution count**: the execution index's first and next page (keyset cursor) of
  suspended executions, and a count, as the store grows to each of ``--listing`` executions
  (filled through the real write path, every other one suspended), on SQLite and PostgreSQL.
* **throughput vs processes** on PostgreSQL: P processes each running 3-step flows for a fixed
  time; total flows/s (skipped without a server).

Every row also prints the machine's load average: the machine may be shared, so compare rows
of one run, not runs of different days.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import loom
from loom.model import encode_json
from loom.model._state import merge_stored_ops
from loom.storage import Snapshot

RESULTS = Path(__file__).parent / "results"
PG_DSN = os.environ.get("LOOM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")

#: Set by the recovering runtime: the step after the logged ones stops blocking.
_release = asyncio.Event()
#: Set when that step starts: every step before it is durable.
_reached = asyncio.Event()


@loom.step(id="noop")
async def noop(i: int) -> int:
    return i


@loom.step(id="next")
async def next_step() -> str:
    _reached.set()
    await _release.wait()
    return "new"


@loom.flow(id="scale-long", version="1")
async def long_flow(ctx: loom.WorkflowContext, n: int) -> str:
    for i in range(n):
        await ctx.run(noop, i)
    return await ctx.run(next_step)


@loom.flow(id="scale-gate", version="1")
async def gate_flow(ctx: loom.WorkflowContext) -> Any:
    await ctx.run(noop, 0)
    return await ctx.suspend("Go")


@loom.flow(id="scale-three", version="1")
async def three_flow(ctx: loom.WorkflowContext, n: int) -> int:
    a = await ctx.run(noop, n)
    b = await ctx.run(noop, a)
    return await ctx.run(noop, b)


class CountingStore:
    """Counts the bytes of every snapshot written through it (a wrapper over a store).

    ``segments=False`` hides the inner store's snapshot segments from the runtime, which then
    writes the whole state every time: how snapshots worked before segments (the "before"
    rows, measured on the same build).
    """

    def __init__(self, inner: Any, *, segments: bool = True, objects: bool = False) -> None:
        self.inner = inner
        self.segments = segments
        self.objects = objects
        self.snapshot_bytes = 0
        self.snapshots = 0

    def _form(self, snapshot: Any) -> Any:
        if not self.objects:
            return snapshot
        # The ops as one object per op, as snapshots stored them before the compact form (a
        # chain of one compact piece merges into that form).
        state = dict(snapshot.state, ops=merge_stored_ops([{}, snapshot.state["ops"]]))
        return Snapshot(snapshot.execution_id, snapshot.sequence, state)

    async def save_snapshot(self, snapshot: Any) -> None:
        snapshot = self._form(snapshot)
        self.snapshot_bytes += len(encode_json(snapshot.state, limits=_BIG).encode())
        self.snapshots += 1
        await self.inner.save_snapshot(snapshot)

    async def _save_segment(self, segment: Any, base: int) -> bool:
        segment = self._form(segment)
        kept = bool(await self.inner.save_snapshot_segment(segment, base))
        if kept:
            self.snapshot_bytes += len(encode_json(segment.state, limits=_BIG).encode())
            self.snapshots += 1
        return kept

    def __getattr__(self, name: str) -> Any:
        if name == "save_snapshot_segment":
            if not self.segments:
                raise AttributeError(name)
            return self._save_segment
        return getattr(self.inner, name)


_BIG = loom.model.PayloadLimits(max_bytes=1 << 30, max_depth=900)


async def _write_log(
    path: Path, n: int, snapshot_every: int, segments: bool, objects: bool
) -> tuple[str, int, int, float]:
    """Write an execution with ``n`` completed steps whose step n+1 never finishes; return
    (id, snapshot bytes, log bytes, process CPU µs per step while writing them)."""
    _release.clear()
    _reached.clear()
    store = CountingStore(
        loom.SQLiteStore(path, synchronous="NORMAL"), segments=segments, objects=objects
    )
    runtime = loom.WorkflowRuntime(store, snapshot_every=snapshot_every, timers=False)  # type: ignore[arg-type]
    runtime.register(long_flow)
    cpu = time.process_time()
    handle = await runtime.start(long_flow, n)
    eid = handle.execution_id
    # The n steps are durable once the (n+1)-th has started running (awaited, not polled:
    # a poll per append would cost the write as much CPU again).
    await asyncio.wait_for(_reached.wait(), timeout=600)
    written = time.process_time() - cpu
    state = await runtime.load_state(eid)
    assert state is not None and len(state.ops) >= n and state.last_sequence >= n, state
    log_bytes = sum(len(e.payload_json) for e in await store.inner.read(eid))
    await runtime.close()  # the "process" dies: step n+1 never completes
    return eid, store.snapshot_bytes, log_bytes, written / n * 1e6


async def _load_ms(path: Path, eid: str, reps: int = 5) -> tuple[float, float]:
    """Median wall and CPU (this process's, all threads) milliseconds of a load."""
    walls, cpus = [], []
    for _ in range(reps):
        store = loom.SQLiteStore(path)
        runtime = loom.WorkflowRuntime(store, timers=False)
        runtime.register(long_flow)
        t0, c0 = time.perf_counter(), time.process_time()
        await runtime.load_state(eid)
        cpus.append((time.process_time() - c0) * 1e3)
        walls.append((time.perf_counter() - t0) * 1e3)
        await runtime.close()
    return statistics.median(walls), statistics.median(cpus)


def _copy_db(path: Path, copy: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{path}{suffix}").exists():
            shutil.copyfile(f"{path}{suffix}", f"{copy}{suffix}")


async def _recover_ms(
    path: Path, eid: str, snapshot_every: int, segments: bool, reps: int = 3
) -> tuple[float, float]:
    """Median wall and CPU milliseconds of a recovery, each from a copy of the crashed log."""
    walls, cpus = [], []
    for rep in range(reps):
        copy = path.with_name(f"{path.stem}-recover-{rep}.db")
        _copy_db(path, copy)
        store = CountingStore(loom.SQLiteStore(copy), segments=segments)
        runtime = loom.WorkflowRuntime(store, snapshot_every=snapshot_every, timers=False)  # type: ignore[arg-type]
        runtime.register(long_flow)
        before = await store.last_sequence(eid)
        _release.set()
        t0, c0 = time.perf_counter(), time.process_time()
        handle = await runtime.recover(eid)
        assert await handle.result() == "new"
        cpus.append((time.process_time() - c0) * 1e3)
        walls.append((time.perf_counter() - t0) * 1e3)
        assert await store.last_sequence(eid) > before
        await runtime.close()
    return statistics.median(walls), statistics.median(cpus)


#: (label, snapshot_every, segments, objects): today's chained snapshots with compact ops, the
#: same chain with one object per op (how ops were stored before), the whole-state snapshots
#: of before segments (same build, segments hidden), and none at all.
MODES = (
    ("segments", 256, True, False),
    ("segments, objects", 256, True, True),
    ("whole, objects", 256, False, True),
    ("no snapshots", 10**9, True, False),
)


async def log_length(lengths: list[int], tmp: Path) -> list[dict[str, Any]]:
    rows = []
    print(
        f"  {'':>6}       {'':<17}  {'load wall':>9} {'cpu':>7}  {'recover wall':>12} {'cpu':>7}"
        f"  {'snapshot bytes':>14}            {'write cpu/step':>14}"
    )
    for n in lengths:
        for label, every, segments, objects in MODES:
            path = tmp / f"len-{n}-{every}-{segments}-{objects}.db"
            eid, snap_bytes, log_bytes, write_cpu = await _write_log(
                path, n, every, segments, objects
            )
            load, load_cpu = await _load_ms(path, eid)
            recover, recover_cpu = await _recover_ms(path, eid, every, segments)
            rows.append(
                {
                    "steps": n,
                    "mode": label,
                    "load_ms": load,
                    "load_cpu_ms": load_cpu,
                    "recover_ms": recover,
                    "recover_cpu_ms": recover_cpu,
                    "snapshot_bytes": snap_bytes,
                    "log_bytes": log_bytes,
                    "write_cpu_us_per_step": write_cpu,
                }
            )
            print(
                f"  {n:>6} steps {label:<17}  {load:7.2f}ms {load_cpu:5.2f}ms  "
                f"{recover:10.2f}ms {recover_cpu:5.2f}ms  "
                f"{snap_bytes:>12,} B ({snap_bytes / max(1, log_bytes):4.1f}x log)  "
                f"{write_cpu:9.1f} µs",
                flush=True,
            )
    return rows


async def memory_per_suspended(n: int, tmp: Path) -> dict[str, float]:
    store = loom.SQLiteStore(tmp / "mem.db", synchronous="NORMAL")
    runtime = loom.WorkflowRuntime(store, timers=False)
    runtime.register(gate_flow)
    warm = await runtime.start(gate_flow)
    await warm.wait_for_suspend()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(0, n, 250):
        handles = await asyncio.gather(*(runtime.start(gate_flow) for _ in range(250)))
        await asyncio.gather(*(h.wait_for_suspend() for h in handles))
        del handles
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    await runtime.close()
    return {"executions": n, "bytes_per_execution": used / n}


async def _listing_rows(
    name: str, store: Any, counts: list[int], rounds: int
) -> list[dict[str, Any]]:
    from bench.index import _batch, timed

    from loom.storage import ExecutionQuery

    now = time.time() - max(counts) * 1e-3
    rows: list[dict[str, Any]] = []
    filled = 0
    suspended = ExecutionQuery(statuses=["suspended"], limit=50)
    for n in counts:
        for lo in range(filled, n, 500):
            await asyncio.gather(
                *(
                    store.take_over(_batch(i, now), from_fence=0)
                    for i in range(lo, min(n, lo + 500))
                )
            )
        filled = n
        first = await store.list_executions(suspended)
        nxt = ExecutionQuery(statuses=["suspended"], limit=50, cursor=first.next_cursor)
        row: dict[str, Any] = {"store": name, "executions": n}
        for key, fn in (
            ("first_page_ms", lambda: store.list_executions(suspended)),
            ("next_page_ms", lambda q=nxt: store.list_executions(q)),
            ("count_ms", lambda: store.count_executions(suspended)),
        ):
            await fn()  # warm
            row[key] = (await timed(fn, rounds))[0]
        rows.append(row)
        print(
            f"  {name:<10} {n:>9,} executions   first page {row['first_page_ms']:7.2f} ms"
            f"   next page {row['next_page_ms']:7.2f} ms   count {row['count_ms']:8.2f} ms",
            flush=True,
        )
    return rows


async def listing_by_count(counts: list[int], rounds: int = 30) -> list[dict[str, Any]]:
    """Listing's cost as the index grows: it should stay flat (a page is one index range)."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = loom.SQLiteStore(Path(tmp) / "listing.db", synchronous="NORMAL")
        try:
            rows += await _listing_rows("sqlite", store, counts, rounds)
        finally:
            await store.close()
    try:
        from loom.storage.postgres import PostgresStore

        schema = f"bench_listing_{os.getpid()}"
        await PostgresStore.drop_schema(PG_DSN, schema)
        pg = await PostgresStore.open(PG_DSN, schema=schema)
    except Exception as exc:
        print(f"  PostgreSQL rows skipped: {exc!r}")
        return rows
    try:
        rows += await _listing_rows("postgres", pg, counts, rounds)
    finally:
        await pg.close()
        await PostgresStore.drop_schema(PG_DSN, schema)
    return rows


_CHILD = """
import asyncio, sys, time
import loom
from loom.storage.postgres import PostgresStore
from bench.scale import three_flow
async def main(dsn, schema, seconds, tag):
    store = await PostgresStore.open(dsn, schema=schema)
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(three_flow)
    print("ready", flush=True)
    sys.stdin.readline()
    done = 0
    end = time.perf_counter() + seconds
    async def worker(w):
        nonlocal done
        k = 0
        while time.perf_counter() < end:
            h = await rt.start(three_flow, k, execution_id=f"{tag}-{w}-{k}")
            await h.result()
            k += 1
            done += 1
    await asyncio.gather(*(worker(w) for w in range(32)))
    print(done, flush=True)
    await rt.close()
asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]))
"""


async def _create_schema(schema: str) -> None:
    from loom.storage.postgres import PostgresStore

    await (await PostgresStore.open(PG_DSN, schema=schema)).close()


async def _drop_schema(schema: str) -> None:
    from loom.storage.postgres import PostgresStore

    await PostgresStore.drop_schema(PG_DSN, schema)


def throughput_by_processes(procs: list[int], seconds: float) -> list[dict[str, Any]]:
    schema = f"bench_scale_{os.getpid()}"
    try:
        asyncio.run(_create_schema(schema))
    except Exception as exc:
        print(f"  PostgreSQL rows skipped: {exc!r}")
        return []
    rows = []
    try:
        for p in procs:
            children = [
                subprocess.Popen(
                    [sys.executable, "-c", _CHILD, PG_DSN, schema, str(seconds), f"p{p}-{i}"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for i in range(p)
            ]
            for c in children:
                assert c.stdout is not None and c.stdout.readline().strip() == "ready"
            for c in children:
                assert c.stdin is not None
                c.stdin.write("go\n")
                c.stdin.flush()
            done = sum(int(c.communicate(timeout=seconds + 120)[0].strip()) for c in children)
            rows.append({"processes": p, "flows_per_s": done / seconds})
            print(f"  {p} process(es): {done / seconds:8.0f} three-step flows/s", flush=True)
    finally:
        asyncio.run(_drop_schema(schema))
    return rows


def plot(
    length_rows: list[dict[str, Any]],
    proc_rows: list[dict[str, Any]],
    listing_rows: list[dict[str, Any]] | None = None,
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: pip install -e '.[bench]' for the plots)")
        return
    RESULTS.mkdir(exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for mode in [m[0] for m in MODES]:
        rows = [r for r in length_rows if r["mode"] == mode]
        xs = [r["steps"] for r in rows]
        axes[0].plot(xs, [r["load_ms"] for r in rows], marker="o", label=mode)
        axes[1].plot(xs, [r["recover_ms"] for r in rows], marker="o", label=mode)
    for mode in ("segments", "whole, objects"):
        snap = [r for r in length_rows if r["mode"] == mode]
        axes[2].plot(
            [r["steps"] for r in snap],
            [r["snapshot_bytes"] for r in snap],
            marker="o",
            label=f"snapshots, {mode}",
        )
    axes[2].plot(
        [r["steps"] for r in snap], [r["log_bytes"] for r in snap], marker="o", label="log"
    )
    titles = ("load_state (ms)", "recover to next new step (ms)", "bytes written")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("completed steps in the log")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "scale-log-length.png", dpi=110)
    if proc_rows:
        fig, ax = plt.subplots(figsize=(5, 4))
        ax.plot([r["processes"] for r in proc_rows], [r["flows_per_s"] for r in proc_rows], "o-")
        ax.set_xlabel("worker processes (PostgreSQL)")
        ax.set_ylabel("three-step flows/s")
        fig.tight_layout()
        fig.savefig(RESULTS / "scale-processes.png", dpi=110)
    if listing_rows:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name in sorted({r["store"] for r in listing_rows}):
            rows = [r for r in listing_rows if r["store"] == name]
            xs = [r["executions"] for r in rows]
            ax.plot(xs, [r["first_page_ms"] for r in rows], "o-", label=f"{name}, first page")
            ax.plot(xs, [r["next_page_ms"] for r in rows], "s--", label=f"{name}, next page")
        ax.set_xscale("log")
        ax.set_xlabel("executions in the store")
        ax.set_ylabel("ms per page of 50 suspended")
        ax.set_ylim(bottom=0)
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "scale-listing.png", dpi=110)
    print(f"plots written to {RESULTS}/scale-*.png")


async def sqlite_part(
    lengths: list[int], suspended: int
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        length_rows = await log_length(lengths, Path(tmp))
        mem = await memory_per_suspended(suspended, Path(tmp)) if suspended else {}
    return length_rows, mem


def main(args: argparse.Namespace) -> None:
    lengths = [int(x) for x in args.lengths.split(",")]
    procs = [int(x) for x in args.procs.split(",") if x]
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(
        "Load and recovery against log length (SQLite, synchronous=FULL when timed; median "
        "wall and CPU ms, CPU = time.process_time, all threads; stdlib json):",
        flush=True,
    )
    length_rows, mem = asyncio.run(sqlite_part(lengths, args.suspended))
    if mem:
        print(
            f"\nMemory per suspended execution (Python heap, {mem['executions']:,} held by one "
            f"runtime): {mem['bytes_per_execution'] / 1024:.1f} KiB"
        )
    listing = [int(x) for x in args.listing.split(",") if x]
    listing_rows: list[dict[str, Any]] = []
    if listing:
        print("\nListing against execution count (the execution index, page of 50):")
        listing_rows = asyncio.run(listing_by_count(listing))
    proc_rows: list[dict[str, Any]] = []
    if procs:
        print("\nThroughput against worker processes (PostgreSQL):")
        proc_rows = throughput_by_processes(procs, args.seconds)
    print(f"load average {os.getloadavg()[0]:.1f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scale.json").write_text(
        json.dumps(
            {
                "log_length": length_rows,
                "memory": mem,
                "listing": listing_rows,
                "processes": proc_rows,
            },
            indent=1,
        )
    )
    plot(length_rows, proc_rows, listing_rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lengths", default="100,1000,10000")
    parser.add_argument("--suspended", type=int, default=2000)
    parser.add_argument("--listing", default="1000,10000,100000")
    parser.add_argument("--procs", default="1,2,4")
    parser.add_argument("--seconds", type=float, default=5.0)
    main(parser.parse_args())
