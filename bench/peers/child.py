"""A recovery-workload child process: ``run`` (to be SIGKILLed) or ``recover`` (to be timed).

Invoked by :mod:`bench.peers.recovery` as ``python -m bench.peers.child ...``. It imports only
the adapter of the system it runs. On success, ``recover`` prints one line
``BENCH-RESULT {json}`` with CLOCK_MONOTONIC stamps that the parent compares with its own.
"""

from __future__ import annotations

import time

T_START = time.monotonic()  # as early as this process can stamp anything of its own

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

MARKER = "BENCH-RESULT "
ENV_PROFILE = "BENCH_PROFILE_OUT"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peers.child")
    p.add_argument("--system", required=True)
    p.add_argument("--backend", required=True, choices=("sqlite", "postgres"))
    p.add_argument("--location", required=True)
    p.add_argument("--peer-api", default="sync", choices=("sync", "async"))
    p.add_argument("--mode", required=True, choices=("run", "recover"))
    p.add_argument("--execution-id", required=True)
    p.add_argument("--steps", type=int, required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    profiler: Any = None
    if os.environ.get(ENV_PROFILE) and args.mode == "recover":
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        profiler.start()
    from bench.peers.systems import Target, load

    system_cls = load(args.system)
    t_imported = time.monotonic()
    system = system_cls(Target(args.backend, args.location, args.peer_api))
    if args.mode == "run":
        system.child_run(args.execution_id, args.steps)
        print(f"{MARKER}{json.dumps({'finished': True})}", flush=True)
        return 0
    result = system.child_recover(args.execution_id, args.steps)
    t_done = time.monotonic()
    if profiler is not None:
        profiler.stop()
        with open(os.environ[ENV_PROFILE], "w") as fh:
            fh.write(profiler.output_text(unicode=True, color=False, show_all=False))
    report = {"t_start": T_START, "t_imported": t_imported, "t_done": t_done, "result": result}
    sys.stdout.write(f"{MARKER}{json.dumps(report)}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: library threads must not hold the parent up
