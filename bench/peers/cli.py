"""``python -m bench.peers``: every workload on Loom, DBOS and LangGraph, SQLite and PostgreSQL.

The orchestrator installs nothing. It creates a scratch directory for the SQLite files and one
PostgreSQL database per system (dropped afterwards), runs each (system, backend) in a worker
process of its own, one after another, then prints the table and writes JSON and a PNG chart.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.peers import pg, report
from bench.peers.config import BACKENDS, DEFAULT_PG_DSN, SYSTEMS, Sizes

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RESULTS = ROOT / "bench" / "results"
PACKAGES = (
    "loom-runtime",
    "dbos",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "sqlalchemy",
    "aiosqlite",
    "psycopg",
    "psycopg-pool",
    "matplotlib",
    "pyinstrument",
)


def _csv(choices: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
        return items

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description="Loom vs DBOS Transact vs LangGraph, same workloads, SQLite and PostgreSQL.",
    )
    p.add_argument("--reps", type=int, help="repetitions per workload (default 5; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 rep, 200 workflows")
    p.add_argument(
        "--only",
        type=_csv(SYSTEMS),
        help="comma-separated systems to run (loom,dbos,langgraph); the raw floor always runs",
    )
    p.add_argument("--backends", type=_csv(BACKENDS), default=list(BACKENDS))
    p.add_argument("--pg-dsn", default=DEFAULT_PG_DSN, help="postgresql:// URL of an admin login")
    p.add_argument(
        "--peer-api",
        choices=("sync", "async"),
        default="sync",
        help="API used for DBOS and LangGraph (sync was the faster one in our runs)",
    )
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS)
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the timed runs, profile Loom's workloads with pyinstrument (not timed)",
    )
    p.add_argument("--worker-timeout", type=float, help="seconds per (system, backend) worker")
    p.add_argument("--keep-workdir", action="store_true", help="keep the SQLite files and logs")
    args = p.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        p.error("--reps must be at least 1")
    return args


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _run_worker(
    system: str,
    backend: str,
    location: str,
    args: argparse.Namespace,
    sizes: Sizes,
    workdir: Path,
    timeout: float,
    profile_dir: Path | None,
) -> dict[str, Any]:
    out = workdir / f"result-{system}-{backend}.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.peers.worker",
        "--system",
        system,
        "--backend",
        backend,
        "--location",
        location,
        "--peer-api",
        args.peer_api,
        "--sizes",
        json.dumps(sizes.to_dict()),
        "--workdir",
        str(workdir),
        "--out",
        str(out),
    ]
    if profile_dir is not None:
        cmd += ["--profile-dir", str(profile_dir)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    base = {"system": system, "backend": backend, "peer_api": args.peer_api, "workloads": {}}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {**base, "status": "error", "reason": f"worker timed out after {timeout:.0f}s"}
    if not out.exists():
        return {**base, "status": "error", "reason": f"worker exited {proc.returncode}, no result"}
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def compile_bytecode() -> list[str]:
    """Compile Loom's and this harness's sources to bytecode; return the directories compiled.

    The peers come from wheels, whose ``.pyc`` files pip wrote at install; Loom is installed
    editable from ``src/`` and the harness runs from the checkout, whose bytecode Python writes
    on first import, unless ``PYTHONDONTWRITEBYTECODE`` is set (as on our CI machines). Then
    every Loom child process compiled ~70 modules from source, ~180 ms of its spawn-to-done
    recovery time that no user who installed Loom meets. Compiling here, as pip does, measures
    every system with its bytecode in place.
    """
    spec = importlib.util.find_spec("loom")
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    dirs.append(str(ROOT / "bench"))
    for directory in dirs:
        compileall.compile_dir(directory, quiet=1)
    return dirs


def _skipped(system: str, backend: str, peer_api: str, reason: str) -> dict[str, Any]:
    reason = " ".join(reason.split())
    print(f"skipped: {system} on {backend}: {reason}", file=sys.stderr, flush=True)
    return {
        "system": system,
        "backend": backend,
        "peer_api": peer_api,
        "status": "skipped",
        "reason": reason,
        "describe": {},
        "workloads": {},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = Sizes.quick(args.reps) if args.quick else Sizes(reps=args.reps or 5)
    chosen = args.only or [s for s in SYSTEMS if s != "floor"]
    systems = ["floor", *[s for s in SYSTEMS if s in chosen and s != "floor"]]
    timeout = args.worker_timeout or (300.0 if args.quick else 1800.0)
    results_dir: Path = args.results_dir
    profile_dir = results_dir / "profiles" if args.profile else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="loom-peers-"))
    started = time.monotonic()
    meta: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.peers", *(argv or sys.argv[1:])]),
        "sizes": sizes.to_dict(),
        "systems": systems,
        "backends": args.backends,
        "peer_api": args.peer_api,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "versions": versions(),
        "bytecode_compiled": compile_bytecode(),
    }
    print(
        f"bench.peers: {', '.join(systems)} on {', '.join(args.backends)}; "
        f"reps={sizes.reps}, flows={sizes.flows}, steps={sizes.steps}, "
        f"recovery={sizes.recovery_steps} (kill at ~{sizes.kill_at}); peer api={args.peer_api}",
        file=sys.stderr,
        flush=True,
    )
    results: list[dict[str, Any]] = []
    try:
        for backend in args.backends:
            pg_names: list[str] = []
            pg_problem: str | None = None
            if backend == "postgres":
                try:
                    meta["postgres"] = pg.server_info(args.pg_dsn)
                    pg_names = [f"bench_{s}" for s in systems]
                    pg.create_databases(args.pg_dsn, pg_names)
                except Exception as exc:  # no psycopg, no server, no rights: skip, say why
                    pg_problem = f"PostgreSQL at {args.pg_dsn}: {type(exc).__name__}: {exc}"
            try:
                for system in systems:
                    if pg_problem is not None:
                        results.append(_skipped(system, backend, args.peer_api, pg_problem))
                        continue
                    if backend == "sqlite":
                        location = str(workdir / f"{system}.db")
                    else:
                        location = pg.dsn_for(args.pg_dsn, f"bench_{system}")
                    print(f"-- {system} on {backend}", file=sys.stderr, flush=True)
                    results.append(
                        _run_worker(
                            system, backend, location, args, sizes, workdir, timeout, profile_dir
                        )
                    )
            finally:
                if pg_names:
                    try:
                        pg.drop_databases(args.pg_dsn, pg_names)
                    except Exception as exc:
                        print(f"could not drop {pg_names}: {exc}", file=sys.stderr)
    finally:
        if args.keep_workdir:
            print(f"scratch files kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    meta["seconds"] = round(time.monotonic() - started, 1)
    targets = report.evaluate_targets(results, args.backends)
    table = report.render_table(results, args.backends)
    print()
    print(table)
    print()
    print(report.render_targets(targets))
    print()
    print(report.render_settings(results))
    print()
    versions_line = ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v)
    print(f"versions: {versions_line}; Python {meta['python']}; SQLite {meta['sqlite']}")
    if "postgres" in meta:
        print(f"postgres: {meta['postgres']}")

    json_path = results_dir / "peers.json"
    report.write_json(
        json_path,
        {
            "meta": meta,
            "results": results,
            "targets": [t.to_dict() for t in targets],
            "table": table,
        },
    )
    png_path = results_dir / "peers.png"
    charted = report.write_chart(png_path, results, args.backends)
    print(f"wrote {json_path}" + (f" and {png_path}" if charted else " (no matplotlib: no chart)"))
    print(f"total {meta['seconds']} s")
    return 0
