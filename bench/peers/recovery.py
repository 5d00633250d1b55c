"""The recovery workload, parent side: start a long flow in a child, SIGKILL it mid-run, then
time a fresh child from spawn to the flow's result and count re-executed steps in the ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.peers import ledger
from bench.peers.child import ENV_PROFILE, MARKER
from bench.peers.systems.base import Target

__all__ = ["RecoveryResult", "run_recovery"]

ROOT = Path(__file__).resolve().parents[2]
POLL = 0.0002  # seconds between looks at the ledger while waiting for the kill point


@dataclass(frozen=True)
class RecoveryResult:
    spawn_to_done: float  # seconds, parent's spawn of the recovering child to its result
    import_time: float  # seconds, child's first stamp to the adapter (and library) imported
    recover_time: float  # seconds, library imported to the result (open, recover, finish)
    killed_at: int  # effects the killed child had run
    re_executed: int
    in_flight_rerun: bool
    missing: int
    result: Any

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RecoveryError(RuntimeError):
    pass


def _cmd(system: str, target: Target, mode: str, execution_id: str, steps: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.peers.child",
        "--system",
        system,
        "--backend",
        target.backend,
        "--location",
        target.location,
        "--peer-api",
        target.peer_api,
        "--mode",
        mode,
        "--execution-id",
        execution_id,
        "--steps",
        str(steps),
    ]


def _env(ledger_path: Path, tag: str, profile_out: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env[ledger.ENV_PATH] = str(ledger_path)
    env[ledger.ENV_TAG] = tag
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop(ENV_PROFILE, None)
    if profile_out is not None:
        env[ENV_PROFILE] = str(profile_out)
    return env


def run_recovery(
    system: str,
    target: Target,
    *,
    execution_id: str,
    steps: int,
    kill_at: int,
    workdir: Path,
    timeout: float,
    profile_out: Path | None = None,
) -> RecoveryResult:
    ledger_path = workdir / f"ledger-{execution_id}.txt"
    ledger_path.unlink(missing_ok=True)
    log_path = workdir / f"child-{execution_id}.log"

    # 1. The victim: run the flow until about `kill_at` effects are in the ledger, then SIGKILL.
    with open(log_path, "wb") as log:
        victim = subprocess.Popen(
            _cmd(system, target, "run", execution_id, steps),
            cwd=ROOT,
            env=_env(ledger_path, "c", None),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        try:
            while ledger.progress(ledger_path) < kill_at:
                if victim.poll() is not None:
                    raise RecoveryError(
                        f"{system}: the child exited ({victim.returncode}) before step {kill_at}; "
                        f"see {log_path}: {log_path.read_text()[-2000:]}"
                    )
                if time.monotonic() > deadline:
                    raise RecoveryError(f"{system}: no step {kill_at} within {timeout}s")
                time.sleep(POLL)
            os.kill(victim.pid, signal.SIGKILL)
        finally:
            if victim.poll() is None:
                victim.kill()
            victim.wait()

    # 2. The rescuer: a fresh process that continues the execution; timed from spawn to done.
    t_spawn = time.monotonic()
    rescuer = subprocess.Popen(
        _cmd(system, target, "recover", execution_id, steps),
        cwd=ROOT,
        env=_env(ledger_path, "r", profile_out),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = rescuer.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        rescuer.kill()
        out, err = rescuer.communicate()
        raise RecoveryError(f"{system}: recovery took over {timeout}s") from None
    report = None
    for line in out.decode(errors="replace").splitlines():
        if line.startswith(MARKER):
            report = json.loads(line[len(MARKER) :])
    if rescuer.returncode != 0 or report is None:
        raise RecoveryError(
            f"{system}: the recovering child failed ({rescuer.returncode}): "
            f"{err.decode(errors='replace')[-3000:]}"
        )
    counted = ledger.count(ledger_path, steps)
    result = RecoveryResult(
        spawn_to_done=report["t_done"] - t_spawn,
        import_time=report["t_imported"] - report["t_start"],
        recover_time=report["t_done"] - report["t_imported"],
        killed_at=counted.crash_effects,
        re_executed=counted.re_executed,
        in_flight_rerun=counted.in_flight_rerun,
        missing=counted.missing,
        result=report["result"],
    )
    if result.missing:
        raise RecoveryError(f"{system}: {result.missing} steps never ran; result {result.result}")
    return result
