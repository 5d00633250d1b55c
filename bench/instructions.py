"""Where a durable step's CPU goes, counted rather than timed: ``python -m bench.instructions``.

    python -m bench.instructions [--build NAME=SRC ...] [--rows floor,statements,...]

Each row runs a child process under valgrind (``cachegrind``, no cache simulation), which
counts every user-space instruction the process executes: a count does not move with the
machine's load, its CPU frequency or its neighbours, where a timing on a shared VM moves by
10-40% from one minute to the next (which is why ``bench.peers`` brackets every repetition with
the floor). A row's figure is the difference between a long and a short run of the same work,
divided by the steps in between, so start-up, imports and warm-up cancel out. The kernel's work
(the commit's write and fsync) is not counted: these are the instructions of the process itself,
the part of a step that a leaner code path can remove.

Rows (SQLite files in a temporary directory, PostgreSQL at ``BENCH_PG_DSN``):

* ``floor``: ``BEGIN IMMEDIATE; INSERT; COMMIT`` of one ~90-byte row into an ``INTEGER PRIMARY
  KEY`` table through ``sqlite3``, what ``bench.peers``' SQLite floor commits.
* ``statements``: the four statements of Loom's lone append (``BEGIN IMMEDIATE``, ``PRAGMA
  data_version``, the event ``INSERT``, ``COMMIT``) with a step's row, on Loom's own schema.
* ``ideal``: the least an async durable step can run in Python: await the step's coroutine,
  read the clock twice, build the record's JSON and checksum as Loom does, and the four
  statements; no runtime, no store layer, no typed event, no folded state.
* ``sqlite``: a 200-step flow of trivial steps through ``WorkflowRuntime`` on ``SQLiteStore``.
* ``postgres``: the same flow on ``PostgresStore``: the client process only (the statement runs
  in the server); skipped when no server answers.

Under valgrind a process runs ~50x slower, so the stores' turn of the event loop (once every
5 ms of writes, see ``loom._aio.LoopShare``) would come every step or two instead of every few
dozen: the children switch it off, and what is counted is the steady stepping path.

``--build before=/tmp/base/src --build after=src`` counts each row with ``loom`` imported from
each tree. Needs valgrind (``apt install valgrind``); without it the script says so and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PG_DSN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
ROWS = ("floor", "statements", "ideal", "sqlite", "postgres")
#: (short run, long run) in steps: the figure is their difference over the steps between.
LENGTHS = {"floor": (500, 2500), "statements": (500, 2500), "ideal": (500, 2500)}
FLOW_STEPS = (100, 300)  # steps per flow, 6 flows a run
_CHECKSUM = hashlib.blake2b(digest_size=12)
_PAYLOAD = '{"position":12,"step_id":"inc","attempt":1,"output":13,"started_at":1796609443.643}'


# ---------------------------------------------------------------------------- the children


def _loom_file(workdir: str) -> str:
    """A file with Loom's schema (made by SQLiteStore itself), for the raw statement rows."""
    import loom

    path = os.path.join(workdir, "loom.db")

    async def make() -> None:
        store = loom.SQLiteStore(path)
        await store.acquire_fence("e" * 32)
        await store.close()

    asyncio.run(make())
    return path


def _raw(row: str, steps: int) -> None:
    from loom.storage._sqlite_sql import INSERT_EVENT

    workdir = tempfile.mkdtemp(prefix="loom-instr-")
    if row == "floor":
        conn = sqlite3.connect(os.path.join(workdir, "floor.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE floor_rows (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
    else:
        conn = sqlite3.connect(_loom_file(workdir), isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    cur = conn.cursor()
    eid = "e" * 32

    async def step(x: int) -> int:
        return x + 1

    async def run() -> None:
        x = 0
        for seq in range(1, steps + 1):
            if row == "floor":
                cur.execute("BEGIN IMMEDIATE")
                cur.execute("INSERT INTO floor_rows (id, payload) VALUES (?, ?)", (seq, "x" * 90))
                cur.execute("COMMIT")
                continue
            if row == "statements":
                payload, now, digest = _PAYLOAD, 1796609443.643, "0" * 24
            else:  # ideal
                started = time.time()
                x = await step(x)
                now = time.time()
                payload = (
                    f'{{"position":{seq - 1},"step_id":"inc","attempt":1,"output":{x},'
                    f'"started_at":{started!r}}}'
                )
                h = _CHECKSUM.copy()
                h.update(
                    f"{eid}#{seq}.1\x1f{eid}\x1f{seq}\x1fSTEP_COMPLETED\x1f{payload}\x1f"
                    f"{now!r}\x1f1".encode()
                )
                digest = h.hexdigest()
            cur.execute("BEGIN IMMEDIATE")
            cur.execute("PRAGMA data_version").fetchone()
            cur.execute(INSERT_EVENT, (eid, seq, "", "STEP_COMPLETED", payload, now, 1, digest))
            cur.execute("COMMIT")

    asyncio.run(run())
    conn.close()
    shutil.rmtree(workdir, ignore_errors=True)


def _flows(row: str, steps: int) -> None:
    import loom
    import loom._aio

    loom._aio.SHARE_LOOP_EVERY = 1e9  # see the module doc

    from bench.peers.systems.loom_system import seq_flow  # the flow bench.peers times

    async def run() -> None:
        workdir = tempfile.mkdtemp(prefix="loom-instr-")
        schema = None
        store: Any
        if row == "postgres":
            from loom.storage.postgres import PostgresStore

            schema = f"bench_instr_{os.getpid()}"
            store = await PostgresStore.open(PG_DSN, schema=schema)
        else:
            store = loom.SQLiteStore(os.path.join(workdir, "flows.db"))
        runtime = loom.WorkflowRuntime(store)
        runtime.register(seq_flow)
        try:
            for i in range(6):  # all counted: the runs differ only in their flows' length
                assert await (await runtime.start(seq_flow, steps, execution_id=f"f{i}")).result()
        finally:
            await runtime.close()
            if schema is not None:
                await PostgresStore.drop_schema(PG_DSN, schema)
            shutil.rmtree(workdir, ignore_errors=True)

    asyncio.run(run())


# ---------------------------------------------------------------------------- the parent


def _count(row: str, length: int, src: str | None) -> int:
    env = dict(os.environ)
    paths = [str(Path(__file__).resolve().parent.parent)]
    if src is not None:
        paths.insert(0, str(Path(src).resolve()))
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    cmd = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "bench.instructions",
        "--child",
        row,
        str(length),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or found is None:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{row} ({length} steps) failed under valgrind: {tail}")
    return int(found.group(1).replace(",", ""))


def _per_step(row: str, src: str | None) -> float:
    if row in LENGTHS:
        short, long = LENGTHS[row]
        steps = long - short
    else:
        short, long = FLOW_STEPS
        steps = 6 * (long - short)  # every flow of the run, warm-up ones included
    return (_count(row, long, src) - _count(row, short, src)) / steps


def _pg_reason() -> str | None:
    from bench.hot_path import _pg_reason as reason  # the same server check, at BENCH_PG_DSN

    return reason()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions")
    parser.add_argument("--build", action="append", default=[], metavar="NAME=SRC")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--child", nargs=2, metavar=("ROW", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        row, steps = args.child[0], int(args.child[1])
        (_raw if row in LENGTHS else _flows)(row, steps)
        return 0
    if shutil.which("valgrind") is None:
        print("bench.instructions needs valgrind (apt install valgrind); it is not on PATH")
        return 2
    builds: list[tuple[str, str | None]] = [
        (b.split("=", 1)[0], b.split("=", 1)[1]) for b in args.build
    ] or [("installed", None)]
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    skipped: dict[str, str] = {}
    if "postgres" in rows and (reason := _pg_reason()) is not None:
        skipped["postgres"] = reason
    print("user-space instructions per step (valgrind cachegrind; kernel work not counted)\n")
    header = f"| {'build':<10} | {'row':<10} | {'instructions':>12} | {'x floor':>7} |"
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    floor: float | None = None
    for name, src in builds:
        for row in rows:
            if row in skipped:
                print(f"| {name:<10} | {row:<10} | skipped: {skipped[row]}")
                continue
            n = _per_step(row, src)
            if row == "floor" and floor is None:
                floor = n
            ratio = f"{n / floor:.2f}" if floor else "-"
            print(f"| {name:<10} | {row:<10} | {n:>12,.0f} | {ratio:>7} |", flush=True)
    print(
        "\nfloor: BEGIN IMMEDIATE; INSERT; COMMIT of one row (INTEGER PRIMARY KEY); statements: "
        "Loom's lone append alone; ideal: an async step + its JSON, checksum and those "
        "statements; sqlite/postgres: WorkflowRuntime (postgres: client process only)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
