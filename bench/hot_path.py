"""CPU per new durable step, and how much of it is Loom's Python rather than SQLite's statements.

    python -m bench.hot_path [--steps 200] [--flows 5] [--reps 5] [--build NAME=SRC ...]

A flow of ``--steps`` trivial steps (``await ctx.run(noop)``: one STEP_COMPLETED record each)
runs ``--flows`` times per repetition; a row's figure is the median over the repetitions of the
process CPU time (``time.process_time``: every thread) divided by the steps run, flow start and
end included (amortised over the steps, as ``bench.peers`` counts them).

Columns, per build and store:

* ``cpu``: CPU µs per step, no instrumentation.
* ``execute``: CPU µs per step spent inside ``sqlite3``'s ``execute``/``executemany`` (the
  statements: BEGIN, the checks, INSERT, COMMIT), measured in a second pass whose connections
  time every call (a ``sqlite3.connect`` factory installed by this script only, never by Loom),
  less what the two clock reads add inside the timed interval (calibrated per process on
  ``SELECT 1``).
* ``python``: ``cpu - execute``: what the Python path costs around the statements.
* ``stmts``: statements executed per step.

PostgreSQL has no such split (the statements run in the server process): its row is the client
process's CPU per step (psycopg, asyncio and Loom), skipped when no server answers at
``--pg-dsn``.

Builds: ``--build before=/tmp/base/src --build after=src`` runs each measurement in a child
process whose ``loom`` is imported from that source tree, alternating builds repetition by
repetition so that a machine whose load drifts moves both alike. Without ``--build`` the
installed ``loom`` is measured. The load average is printed with the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PG_DSN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
STORES = ("sqlite-NORMAL", "sqlite-FULL", "postgres")


class _TimedCursor(sqlite3.Cursor):
    """A cursor of a :class:`_Timed` connection: its execute/executemany are timed too (a
    store may reuse a cursor rather than call the connection's execute)."""

    def execute(self, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        start = time.process_time_ns()
        try:
            return super().execute(*args)
        finally:
            _Timed.spent += time.process_time_ns() - start
            _Timed.calls += 1

    def executemany(self, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        start = time.process_time_ns()
        try:
            return super().executemany(*args)
        finally:
            _Timed.spent += time.process_time_ns() - start
            _Timed.calls += 1


class _Timed(sqlite3.Connection):
    """A connection that adds the CPU time of every execute/executemany (its own and its
    cursors') to ``spent``."""

    spent = 0
    calls = 0

    def cursor(self, factory: Any = _TimedCursor) -> sqlite3.Cursor:  # type: ignore[override]
        return super().cursor(factory)

    def execute(self, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        start = time.process_time_ns()
        try:
            return super().execute(*args)
        finally:
            _Timed.spent += time.process_time_ns() - start
            _Timed.calls += 1

    def executemany(self, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        start = time.process_time_ns()
        try:
            return super().executemany(*args)
        finally:
            _Timed.spent += time.process_time_ns() - start
            _Timed.calls += 1


def _shim_bias(calls: int = 20000) -> float:
    """CPU ns per call that the timing itself adds inside the timed interval (half of the two
    clock reads), measured on a trivial statement: subtracted from ``execute``."""
    plain = sqlite3.connect(":memory:")
    timed = sqlite3.connect(":memory:", factory=_Timed)
    best = float("inf")
    for _ in range(3):
        start = time.process_time_ns()
        for _ in range(calls):
            plain.execute("SELECT 1")
        bare = (time.process_time_ns() - start) / calls
        _Timed.spent = 0
        for _ in range(calls):
            timed.execute("SELECT 1")
        best = min(best, _Timed.spent / calls - bare)
    _Timed.spent = _Timed.calls = 0
    return max(best, 0.0)


def _install_shim() -> None:
    plain = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", _Timed)
        return plain(*args, **kwargs)

    sqlite3.connect = connect  # type: ignore[assignment]


async def _measure(store_name: str, steps: int, flows: int, shim: bool) -> dict[str, float]:
    import loom

    bias = 0.0
    if shim:
        bias = _shim_bias()
        _install_shim()

    @loom.step(id="noop")
    async def noop() -> None:
        return None

    @loom.flow(id=f"hot-{steps}")
    async def many(ctx: loom.WorkflowContext) -> None:
        for _ in range(steps):
            await ctx.run(noop)

    schema = None
    workdir = tempfile.mkdtemp(prefix="loom-hot-")
    store: Any
    if store_name == "postgres":
        from loom.storage.postgres import PostgresStore

        schema = f"bench_hot_{os.getpid()}_{secrets.token_hex(3)}"
        store = PostgresStore(PG_DSN, schema=schema)
    else:
        sync = store_name.split("-", 1)[1]
        store = loom.SQLiteStore(Path(workdir) / "hot.db", synchronous=sync)  # type: ignore[arg-type]
    runtime = loom.WorkflowRuntime(store)
    runtime.register(many)
    try:
        for _ in range(2):  # warm: connections, statement caches, the WAL
            await (await runtime.start(many)).result()
        _Timed.spent = _Timed.calls = 0
        cpu = time.process_time()
        wall = time.perf_counter()
        for _ in range(flows):
            await (await runtime.start(many)).result()
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - wall
    finally:
        await runtime.close()
        if schema is not None:
            from loom.storage.postgres import PostgresStore

            await PostgresStore.drop_schema(PG_DSN, schema)
    n = steps * flows
    return {
        "cpu": cpu / n * 1e6,
        "wall": wall / n * 1e6,
        "execute": (_Timed.spent - _Timed.calls * bias) / n / 1e3,
        "stmts": _Timed.calls / n,
        "loom": str(Path(loom.__file__).parent),  # type: ignore[dict-item]
    }


def _child(args: argparse.Namespace) -> None:
    result = asyncio.run(_measure(args.store, args.steps, args.flows, args.shim))
    print(json.dumps(result))


def _run_child(src: str | None, store: str, steps: int, flows: int, shim: bool) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--store", store]
    cmd += ["--steps", str(steps), "--flows", str(flows)] + (["--shim"] if shim else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr else "child failed")
    data: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return data


def _pg_reason() -> str | None:
    try:
        import psycopg

        with psycopg.connect(PG_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def main() -> None:
    global PG_DSN
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--flows", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--build", action="append", default=[], metavar="NAME=SRC")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--pg-dsn", default=PG_DSN)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--shim", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    PG_DSN = args.pg_dsn
    if args.child:
        _child(args)
        return
    builds: list[tuple[str, str | None]] = [
        (b.split("=", 1)[0], b.split("=", 1)[1]) for b in args.build
    ] or [("installed", None)]
    stores = [s for s in args.stores.split(",") if s]
    skipped: dict[str, str] = {}
    if "postgres" in stores and (reason := _pg_reason()) is not None:
        skipped["postgres"] = reason
    samples: dict[tuple[str, str], dict[str, list[float]]] = {}
    load_before = os.getloadavg()
    for _ in range(args.reps):
        for store in stores:
            if store in skipped:
                continue
            for name, src in builds:
                into = samples.setdefault((name, store), {})
                plain = _run_child(src, store, args.steps, args.flows, shim=False)
                into.setdefault("cpu", []).append(plain["cpu"])
                into.setdefault("wall", []).append(plain["wall"])
                if store != "postgres":
                    timed = _run_child(src, store, args.steps, args.flows, shim=True)
                    into.setdefault("execute", []).append(timed["execute"])
                    into.setdefault("python", []).append(plain["cpu"] - timed["execute"])
                    into.setdefault("stmts", []).append(timed["stmts"])
    load_after = os.getloadavg()

    def med(values: list[float] | None) -> str:
        return "-" if not values else f"{statistics.median(values):.1f}"

    def spread(values: list[float] | None) -> str:
        return "-" if not values else f"{min(values):.0f}-{max(values):.0f}"

    print(
        f"\nCPU per new durable step: {args.flows} flows x {args.steps} trivial steps, "
        f"median of {args.reps} repetitions"
    )
    print(
        f"load average before {load_before[0]:.2f}/{load_before[1]:.2f}, "
        f"after {load_after[0]:.2f}/{load_after[1]:.2f} (1/5 min), {os.cpu_count()} CPUs\n"
    )
    header = (
        f"| {'build':<10} | {'store':<13} | {'cpu µs':>7} | {'(range)':>9} | {'execute µs':>10} "
        f"| {'python µs':>9} | {'(range)':>9} | {'stmts':>5} | {'wall µs':>7} |"
    )
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for store in stores:
        if store in skipped:
            print(f"| {'':<10} | {store:<13} | skipped: {skipped[store]}")
            continue
        for name, _ in builds:
            s = samples[(name, store)]
            print(
                f"| {name:<10} | {store:<13} | {med(s.get('cpu')):>7} | {spread(s.get('cpu')):>9} "
                f"| {med(s.get('execute')):>10} | {med(s.get('python')):>9} "
                f"| {spread(s.get('python')):>9} | {med(s.get('stmts')):>5} "
                f"| {med(s.get('wall')):>7} |"
            )
    print(
        "\ncpu: process CPU per step; execute: CPU inside sqlite3 execute/executemany (timed "
        "pass); python: cpu - execute; postgres: client-process CPU (statements run in the server)"
    )


if __name__ == "__main__":
    main()
