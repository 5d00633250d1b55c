"""Shared by the crash test slice and `python -m tests.chaos`: SIGKILL a run at a fault point,
recover it from a fresh process, and check the effect ledger and the log."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import loom
from loom.model import EventType
from tests.support.flows import EffectLedger
from tests.support.proc import run_child

STEPS = [f"step-{i}" for i in range(1, 6)]


@dataclass
class CrashOutcome:
    point: str
    on_hit: int
    killed: bool
    started: bool
    counts: dict[str, int]
    result: object


def _run_child(
    mode: str, db: Path, eid: str, ledger: Path, faults: str | None
) -> subprocess.CompletedProcess[str]:
    env = {"LOOM_TEST_LEDGER": str(ledger), **({"LOOM_FAULTS": faults} if faults else {})}
    return run_child("crash", mode, db, eid, env=env)


def crash_and_recover(workdir: Path, point: str, on_hit: int) -> CrashOutcome:
    """Kill a start at the ``on_hit``-th crossing of ``point``, then recover; check invariants."""
    db = workdir / f"{point}-{on_hit}.db"
    ledger = workdir / f"{point}-{on_hit}.ledger"
    eid = f"crash-{point}-{on_hit}"
    first = _run_child("start", db, eid, ledger, f"{point}=kill@{on_hit}")
    killed = first.returncode == -signal.SIGKILL
    if not killed:
        assert first.returncode == 0, first.stderr
    state = asyncio.run(_load(db, eid))
    started = state is not None
    result: object = None
    if started:
        second = _run_child("recover", db, eid, ledger, None)
        assert second.returncode == 0, (
            f"recover failed after kill at {point}@{on_hit}:\n{second.stderr}"
        )
        result = second.stdout.strip()
    counts = EffectLedger(ledger).counts(eid)
    outcome = CrashOutcome(point, on_hit, killed, started, counts, result)
    check_invariants(outcome, db, eid)
    return outcome


async def _load(db: Path, eid: str) -> loom.ExecutionState | None:
    async with loom.WorkflowRuntime(loom.SQLiteStore(db)) as rt:
        return await rt.load_state(eid)


def check_invariants(outcome: CrashOutcome, db: Path, eid: str) -> None:
    where = f"kill at {outcome.point}@{outcome.on_hit}"
    if not outcome.started:
        # The start never became durable: nothing may have run.
        assert outcome.counts == {}, f"{where}: effects ran for an execution that never started"
        return
    events = asyncio.run(_events(db, eid))
    assert [e.sequence for e in events] == list(range(len(events))), f"{where}: sequences not dense"
    assert sum(e.type is EventType.EXECUTION_STARTED for e in events) == 1, f"{where}: starts"
    assert events[-1].type is EventType.EXECUTION_COMPLETED, f"{where}: not completed"
    assert events[-1].payload["output"] == 6, f"{where}: wrong output"
    completions = [e.payload["position"] for e in events if e.type is EventType.STEP_COMPLETED]
    assert sorted(completions) == list(range(5)), f"{where}: completions {completions}"
    fences = [e.fence for e in events]
    assert fences == sorted(fences), f"{where}: fences went backwards"
    # G3: every committed step ran once; only the interrupted one may have run twice.
    twice = [s for s in STEPS if outcome.counts.get(s, 0) == 2]
    assert all(outcome.counts.get(s, 0) in (1, 2) for s in STEPS), f"{where}: {outcome.counts}"
    assert len(twice) <= 1, f"{where}: more than the interrupted step re-ran: {outcome.counts}"
    if twice and outcome.point not in (
        "after_effect_before_record",
        "before_append",
        "before_commit",
    ):
        raise AssertionError(f"{where}: {twice[0]} ran twice though no effect was in flight")


async def _events(db: Path, eid: str) -> list[loom.Envelope]:
    store = loom.SQLiteStore(db)
    try:
        return await store.read(eid)
    finally:
        await store.close()
