"""Store chaos loop: ``python -m tests.chaos_store --n 50``.

Each round SIGKILLs a store process inside one coalesced batch (at ``before_commit`` or
``after_append_before_ack``, a random batch shape) over SQLite and PostgreSQL, and checks that
every execution of the batch holds all of it or none of it. Then PostgreSQL sessions are
terminated under load (``--load-rounds``), and with ``--restart`` a private, throwaway
PostgreSQL cluster is restarted under load. Prints a report; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.pg import PG_DSN, drop_test_schema, new_schema_name, pg_reason
from tests.support.store_harness import (
    Target,
    kill_in_batch,
    random_batch_shape,
    terminate_under_load,
)

PG_BIN = Path("/usr/lib/postgresql/15/bin")


@contextmanager
def pg_schema(dsn: str) -> Iterator[str]:
    schema = new_schema_name()
    try:
        yield schema
    finally:
        asyncio.run(drop_test_schema(dsn, schema))


@contextmanager
def private_cluster() -> Iterator[tuple[str, str]]:
    """A throwaway PostgreSQL cluster (initdb) on a free port: (dsn, restart command)."""
    pg_ctl = PG_BIN / "pg_ctl"
    if not pg_ctl.exists():
        raise SystemExit(f"--restart needs PostgreSQL server binaries in {PG_BIN}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = Path(tempfile.mkdtemp(prefix="loom-pg-"))
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(data, "postgres")
    log = data / "server.log"
    pgdata = data / "data"
    subprocess.run(
        [*as_postgres, str(PG_BIN / "initdb"), "-D", str(pgdata), "-A", "trust", "-U", "postgres"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    ctl = [*as_postgres, str(pg_ctl), "-D", str(pgdata), "-l", str(log), "-w"]
    opts = f"-p {port} -k {data} -c listen_addresses=127.0.0.1"
    subprocess.run([*ctl, "-o", opts, "start"], check=True, stdout=subprocess.DEVNULL)
    restart = " ".join([*ctl, "-m", "fast", "-o", f"'{opts}'", "restart"]) + " > /dev/null"
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", restart
    finally:
        subprocess.run([*ctl, "-m", "immediate", "stop"], stdout=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="kill rounds per backend")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--load-rounds", type=int, default=3, help="terminate-under-load rounds")
    parser.add_argument("--restart", action="store_true", help="also restart a private cluster")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"chaos_store: seed {seed}, {args.n} kill rounds per backend")
    backends = args.backends.split(",")
    if "postgres" in backends and pg_reason() is not None:
        print(f"  postgres skipped: {pg_reason()}")
        backends.remove("postgres")

    failures: list[str] = []
    table: Counter[tuple[str, str, str]] = Counter()
    for backend in backends:
        with (
            tempfile.TemporaryDirectory() as tmp,
            pg_schema(PG_DSN) if backend == "postgres" else _nothing() as schema,
        ):
            target = (
                Target("sqlite", str(Path(tmp) / "chaos.db"))
                if backend == "sqlite"
                else Target("postgres", PG_DSN, schema or "")
            )
            for n in range(args.n):
                point, executions, count = random_batch_shape(rng)
                run = kill_in_batch(target, point, executions, count, run=f"r{n}")
                expected = "whole" if point == "after_append_before_ack" else "none"
                got = run.whole if expected == "whole" else run.none
                table[(backend, point, "runs")] += 1
                table[(backend, point, "killed")] += run.killed
                table[(backend, point, "executions")] += executions
                table[(backend, point, expected)] += got
                table[(backend, point, "partial")] += len(run.partial)
                if not run.killed or run.partial or got != executions:
                    failures.append(f"{backend} round {n}: {run}")
    print(f"\n{'backend':9} {'point':24} {'runs':>5} {'killed':>6} {'execs':>6} "
          f"{'whole':>6} {'none':>6} {'partial':>7}")  # fmt: skip
    for backend in backends:
        for point in ("before_commit", "after_append_before_ack"):
            t = {k: table[(backend, point, k)] for k in
                 ("runs", "killed", "executions", "whole", "none", "partial")}  # fmt: skip
            print(f"{backend:9} {point:24} {t['runs']:5} {t['killed']:6} {t['executions']:6} "
                  f"{t['whole']:6} {t['none']:6} {t['partial']:7}")  # fmt: skip

    for r in range(args.load_rounds if "postgres" in backends else 0):
        with pg_schema(PG_DSN) as schema:
            run = terminate_under_load(Target("postgres", PG_DSN, schema), run=f"load{r}")
            print(f"\nload/terminate: acked {run.acked}, failed {run.failed} (outcome unknown "
                  f"{run.unknown}), sessions terminated {run.terminated}, "
                  f"violations {len(run.violations)}")  # fmt: skip
            failures += run.violations
    if args.restart:
        with private_cluster() as (dsn, restart_cmd):
            for r in range(max(1, args.load_rounds)):
                with pg_schema(dsn) as schema:
                    run = terminate_under_load(
                        Target("postgres", dsn, schema), every=60, restart_cmd=restart_cmd,
                        run=f"restart{r}",
                    )  # fmt: skip
                    print(f"\nload/restart: acked {run.acked}, failed {run.failed} (outcome "
                          f"unknown {run.unknown}), server restarts {run.terminated}, "
                          f"violations {len(run.violations)}")  # fmt: skip
                    failures += run.violations
    if failures:
        print("\nVIOLATIONS:")
        for failure in failures:
            print(" ", failure)
        return 1
    print("\nno violations")
    return 0


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    sys.exit(main())
