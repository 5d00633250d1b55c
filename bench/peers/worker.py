"""One system on one backend, in a process of its own: ``python -m bench.peers.worker ...``.

A process per (system, backend) keeps the systems from sharing anything: DBOS is a process-wide
singleton, each library installs its own threads and hooks, and every system starts from a
fresh interpreter. The worker writes its results as JSON to ``--out`` and its progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers.config import WORKLOADS, Sizes
from bench.peers.stats import Series
from bench.peers.systems import SkipError, System, Target, load

__all__ = ["main", "run_system"]


def _log(prefix: str, message: str) -> None:
    print(f"  [{prefix}] {message}", file=sys.stderr, flush=True)


def _fmt(value: float) -> str:
    return f"{value:,.3g}" if value < 100 else f"{value:,.0f}"


class _Runner:
    """Runs a system's workloads with warm-up and repetitions, collecting :class:`Series`."""

    def __init__(self, system: System, sizes: Sizes, prefix: str, profile_dir: Path | None) -> None:
        self.system = system
        self.sizes = sizes
        self.prefix = prefix
        self.profile_dir = profile_dir
        self.series: dict[str, Series] = {}
        self._run = uuid.uuid4().hex[:8]
        self._count = 0

    def run_id(self, what: str) -> str:
        self._count += 1
        return f"{what}-{self._run}-{self._count}"

    def measure(
        self,
        key: str,
        sample: Callable[[], float],
        *,
        derived: dict[str, Callable[[float], float]] | None = None,
        warmup: Callable[[], object] | None = None,
    ) -> None:
        """Warm up once (``warmup()``, else one unrecorded ``sample()``), then record ``reps``
        samples of ``sample()``, each already in the workload's unit."""
        unit = WORKLOADS[key].unit
        series = self.series[key] = Series(unit)
        extra = {name: Series(WORKLOADS[name].unit) for name in derived or {}}
        self.series.update(extra)
        try:
            (warmup or sample)()
            for rep in range(self.sizes.reps):
                value = sample()
                series.samples.append(value)
                for name, fn in (derived or {}).items():
                    extra[name].samples.append(fn(value))
                _log(self.prefix, f"{key} rep {rep + 1}/{self.sizes.reps}: {_fmt(value)} {unit}")
        except Exception as exc:
            series.error = f"{type(exc).__name__}: {exc}"
            for s in extra.values():
                s.error = series.error
            _log(self.prefix, f"{key} FAILED: {series.error}")
            traceback.print_exc(file=sys.stderr)

    def profile(self, key: str, work: Callable[[], object]) -> None:
        if self.profile_dir is None:
            return
        try:
            from pyinstrument import Profiler
        except ImportError:
            _log(self.prefix, "profile skipped: pyinstrument is not installed")
            return
        profiler = Profiler(interval=0.0005, async_mode="disabled")
        profiler.start()
        try:
            work()
        finally:
            profiler.stop()
        path = self.profile_dir / f"{self.prefix.replace('/', '-')}-{key}.txt"
        path.write_text(profiler.output_text(unicode=True, color=False, show_all=False))
        _log(self.prefix, f"profile of {key} written to {path}")


def paired_floor(target: Target) -> System:
    """A raw-floor writer beside ``target``: a sibling SQLite file, or the same PG database."""
    location = f"{target.location}.floor.db" if target.backend == "sqlite" else target.location
    floor = load("floor")(Target(target.backend, location))
    floor.open()
    return floor


def run_system(
    name: str,
    target: Target,
    sizes: Sizes,
    workdir: Path,
    profile_dir: Path | None = None,
) -> dict[str, Any]:
    """Run every workload ``name`` supports on ``target`` and return the JSON-ready result."""
    from bench.peers.recovery import run_recovery

    prefix = f"{name}/{target.backend}"
    result: dict[str, Any] = {
        "system": name,
        "backend": target.backend,
        "peer_api": target.peer_api,
        "status": "ok",
        "reason": None,
        "describe": {},
        "workloads": {},
    }
    try:
        system = load(name)(target)
        system.open()
    except SkipError as skip:
        reason = " ".join(str(skip).split())
        print(f"skipped: {name} on {target.backend}: {reason}", file=sys.stderr, flush=True)
        result.update(status="skipped", reason=reason)
        return result
    runner = _Runner(system, sizes, prefix, profile_dir)
    try:
        result["describe"] = system.describe()
        _log(prefix, f"settings: {json.dumps(result['describe'])}")
        supported = system.workloads
        steps = sizes.floor_rows if name == "floor" else sizes.steps
        if "per_step" in supported and name != "floor":
            # The fsync floor drifts by 2x within minutes on a shared VM, so each repetition is
            # bracketed by raw-floor samples on the same backend and reported as a ratio too.
            floor = paired_floor(target)
            floor.per_step(sizes.floor_rows, "warm")  # reach the WAL's steady state first
            last_floor = [0.0]

            def bracketed() -> float:
                before = floor.per_step(steps, "f")
                value = system.per_step(steps, runner.run_id("seq"))
                after = floor.per_step(steps, "f")
                last_floor[0] = (before + after) / 2
                return value / steps * 1e6

            def warm_up() -> None:
                # As many steps as the floor's warm-up rows: a SQLite commit costs about twice
                # as much while the WAL file still grows as once a checkpoint lets it be reused,
                # and the floor is measured in that steady state, so the system is too (one
                # 200-step warm-up left Loom's WAL growing through the first repetitions:
                # ~2.1x the floor there against ~1.4x once it was reused).
                for _ in range(max(1, -(-sizes.floor_rows // steps))):
                    bracketed()

            try:
                runner.measure(
                    "per_step",
                    bracketed,
                    # The ratio mixes the disk's speed (the floor) with the CPU's (Loom's own
                    # work beside the commit), which drift independently on a shared VM; the
                    # difference isolates Loom's part. Both are kept.
                    derived={
                        "per_step_floor_ratio": lambda v: v / (last_floor[0] / steps * 1e6),
                        "per_step_above_floor": lambda v: v - last_floor[0] / steps * 1e6,
                    },
                    warmup=warm_up,
                )
            finally:
                floor.close()
        elif "per_step" in supported:
            runner.measure(
                "per_step", lambda: system.per_step(steps, runner.run_id("seq")) / steps * 1e6
            )
        for key, n_steps in (("throughput", 3), ("one_step", 1)):
            if key not in supported:
                continue

            def flows_per_s(n_steps: int = n_steps) -> float:
                return sizes.flows / system.throughput(sizes.flows, n_steps, runner.run_id("thr"))

            def warm(n_steps: int = n_steps) -> float:
                return system.throughput(sizes.warmup_flows, n_steps, runner.run_id("warm"))

            derived = {"throughput_steps": lambda v: v * 3} if key == "throughput" else None
            runner.measure(key, flows_per_s, derived=derived, warmup=warm)
        if "gate" in supported:
            runner.measure(
                "gate",
                lambda: (
                    statistics.median(system.gate(sizes.gate_trips, runner.run_id("gate"))) * 1e3
                ),
            )
        if runner.profile_dir is not None and name == "loom":
            runner.profile("per_step", lambda: system.per_step(steps, runner.run_id("prof")))
            runner.profile(
                "throughput", lambda: system.throughput(sizes.flows, 3, runner.run_id("prof"))
            )
            runner.profile(
                "one_step", lambda: system.throughput(sizes.flows, 1, runner.run_id("prof"))
            )
            runner.profile("gate", lambda: system.gate(sizes.gate_trips, runner.run_id("prof")))
    finally:
        system.close()

    if "recovery" in system.workloads:
        reexec = Series(WORKLOADS["recovery_reexec"].unit)
        details: list[dict[str, Any]] = []

        def recover_ms() -> float:
            rec = run_recovery(
                name,
                target,
                execution_id=runner.run_id("rec"),
                steps=sizes.recovery_steps,
                kill_at=sizes.kill_at,
                workdir=workdir,
                timeout=sizes.child_timeout,
            )
            if rec.result != sizes.recovery_steps:
                raise RuntimeError(f"recovered flow returned {rec.result!r}")
            details.append(rec.to_dict())
            reexec.samples.append(float(rec.re_executed))
            _log(
                prefix,
                f"recovery: killed after {rec.killed_at} effects; re-executed "
                f"{rec.re_executed}; in-flight step re-run: {rec.in_flight_rerun}; "
                f"import {rec.import_time * 1e3:.0f} ms + open/recover/finish "
                f"{rec.recover_time * 1e3:.0f} ms",
            )
            return rec.spawn_to_done * 1e3

        runner.measure("recovery", recover_ms)
        if details:
            # Timings skip the warm-up run; the re-execution count keeps it (it is correctness).
            runner.series["recovery"].extra = {"warmup": details[:1], "reps": details[1:]}
            reexec.extra = {"includes_warmup_run": True}
        runner.series["recovery_reexec"] = reexec
        if profile_dir is not None and name == "loom":
            out = profile_dir / f"{prefix.replace('/', '-')}-recovery.txt"
            try:
                run_recovery(
                    name,
                    target,
                    execution_id=runner.run_id("rec-prof"),
                    steps=sizes.recovery_steps,
                    kill_at=sizes.kill_at,
                    workdir=workdir,
                    timeout=sizes.child_timeout,
                    profile_out=out,
                )
                _log(prefix, f"profile of recovery written to {out}")
            except Exception as exc:
                _log(prefix, f"profile of recovery failed: {exc}")

    result["workloads"] = {k: s.to_dict() for k, s in runner.series.items()}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers.worker")
    p.add_argument("--system", required=True)
    p.add_argument("--backend", required=True, choices=("sqlite", "postgres"))
    p.add_argument("--location", required=True)
    p.add_argument("--peer-api", default="sync", choices=("sync", "async"))
    p.add_argument("--sizes", required=True, help="JSON of bench.peers.config.Sizes")
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--profile-dir", type=Path)
    args = p.parse_args(argv)
    sizes = Sizes(**json.loads(args.sizes))
    target = Target(args.backend, args.location, args.peer_api)
    started = time.monotonic()
    try:
        result = run_system(args.system, target, sizes, args.workdir, args.profile_dir)
    except Exception as exc:  # SkipError from load(); anything else is this system's failure
        status = "skipped" if isinstance(exc, SkipError) else "error"
        reason = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{status}: {args.system} on {args.backend}: {reason}", file=sys.stderr)
        if status == "error":
            traceback.print_exc(file=sys.stderr)
        result = {
            "system": args.system,
            "backend": args.backend,
            "peer_api": args.peer_api,
            "status": status,
            "reason": reason,
            "describe": {},
            "workloads": {},
        }
    result["seconds"] = time.monotonic() - started
    args.out.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
