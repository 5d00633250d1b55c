"""The acts of the schema-migration planner's story, each through a :class:`Placement` (so the
same code runs on a LocalDispatcher and on HTTP worker processes). Each act prints what
happened and returns the facts the tests check."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from examples._support import (
    ROOT,
    Ledger,
    Placement,
    WorkerProcess,
    executed_lines,
    remote_dispatcher,
    worker_env,
)
from examples.schema_migration_planner.app import (
    CATALOG,
    FLOW_ID,
    GATE,
    LOGGING_POLICY,
    STRATEGIES,
    TARGET_POLICY,
    MigrationJob,
)
from loom.learning import PolicyReport, Trajectory, evaluate_policy, trajectories_from_envelopes
from loom.model import ExecutionStatus
from loom.placement import ExecutionPackage

APP = "examples.schema_migration_planner.app:make_runtime"
ORDER = ["inspect", "model:risk", "apply"]
Print = Callable[[str], None]


def _job(change: str, **kw: Any) -> dict[str, Any]:
    return MigrationJob(change=change, **kw).model_dump()


# ------------------------------------------------------------------------------ act 1: gate


async def act_gate(placement: Placement, say: Print = print) -> dict[str, str]:
    """Four migrations: the low-risk one applies at once, three wait for the DBA at the gate;
    the DBA approves one (choosing the strategy), rejects one, and the operator cancels one."""
    say(f"== act 1: the DBA's gate ({placement.kind} placement)")
    ids = {kind: f"gate-{kind}" for kind in CATALOG}
    for kind, eid in ids.items():
        result = await placement.start(FLOW_ID, _job(kind), eid)
        risk = result.folded.ui.get("risk", {}).get("risk")
        say(f"  {eid:<28} risk {risk:<6} -> {result.status}")
    await placement.resume(
        ids["add-index"], GATE, {"approved": True, "by": "dba-maria", "strategy": "online-ddl"}
    )
    await placement.resume(
        ids["drop-column"],
        GATE,
        {"approved": False, "by": "dba-maria", "note": "needs a maintenance window"},
    )
    await placement.runtime.cancel(ids["backfill"], reason="postponed by the operator")
    statuses: dict[str, str] = {}
    for kind, eid in ids.items():
        state = await placement.runtime.load_state(eid)
        assert state is not None
        statuses[kind] = str(state.status)
        output = state.output if state.status is ExecutionStatus.COMPLETED else None
        shown = (output or {}).get("outcome", "") if isinstance(output, dict) else ""
        extra = (output or {}).get("strategy", "") if isinstance(output, dict) else ""
        say(f"  {eid:<28} {state.status:<10} {shown} {extra}".rstrip())
        for line in executed_lines(Ledger().counts(eid), ORDER):
            say("  " + line)
    return statuses


# ------------------------------------------------------------------------------ act 2: crash


async def act_crash(placement: Placement, workdir: Path, say: Print = print) -> dict[str, Any]:
    """The 120M-row backfill: the worker process is SIGKILLed right after the model's answer
    is recorded; a new process, given only the database and the id, continues to the gate
    without asking the model again; the DBA approves; the change is applied once."""
    say(f"== act 2: SIGKILL the worker ({placement.kind} placement)")
    eid = "crash-backfill"
    faults = {"LOOM_FAULTS": "agents.after_model_recorded=kill@1"}
    if placement.kind == "local":
        dead = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "examples.schema_migration_planner.worker", "--id", eid,
             "--change", "backfill"],
            env=worker_env(**faults), cwd=ROOT, capture_output=True, timeout=120,
        )  # fmt: skip
        exit_code = dead.returncode
    else:
        armed = WorkerProcess(APP, workdir, "worker-armed", worker_env(**faults))
        try:
            url = await armed.ready()
            async with remote_dispatcher([url]) as dispatcher:
                try:
                    await dispatcher.dispatch(
                        ExecutionPackage(execution_id=eid, flow_id=FLOW_ID, input=_job("backfill"))
                    )
                except Exception as exc:  # the worker died mid-request: a failed attempt
                    say(f"  dispatch failed as the worker died: {type(exc).__name__}")
            exit_code = await armed.exited()
        finally:
            armed.kill()
    say(f"  worker exit code {exit_code} (SIGKILL is -9)")
    state = await placement.runtime.load_state(eid)
    assert state is not None
    say(f"  left behind: {state.status} at sequence {state.last_sequence}")
    if placement.kind == "local":
        again = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "examples.schema_migration_planner.worker", "--id", eid],
            env=worker_env(), cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        status = again.stdout.strip()
        assert again.returncode == 0, again.stderr
    else:
        status = str((await placement.proceed(eid)).status)
    say(f"  a new process with only the database and the id: {status}")
    done = await placement.resume(
        eid, GATE, {"approved": True, "by": "dba-maria", "strategy": "chunked"}
    )
    say(f"  the DBA approves (chunked): {done.status} {done.output}")
    counts = Ledger().counts(eid)
    for line in executed_lines(counts, ORDER):
        say(line)
    return {"exit_code": exit_code, "status": str(done.status), "counts": dict(counts)}


# ------------------------------------------------------------------------------ act: branches


async def act_branches(placement: Placement, say: Print = print) -> dict[str, Any]:
    """The 48M-row index waits at the DBA's gate. Fork it there once per strategy, resume the
    three branches in parallel through the dispatcher as simulations (``apply`` is a dry run;
    the risk assessment is served from the log: 0 model calls; the parent is only read), pick
    the strategy with the best simulated reward and promote its branch: the parent's gate is
    closed, so approving the parent now is refused."""
    from loom.errors import GateSupersededError
    from loom.orchestration import simulate

    say(f"== act 3: fork / simulate / promote ({placement.kind} placement)")
    eid = "branch-add-index"
    parked = await placement.start(FLOW_ID, _job("add-index"), eid)
    say(f"  {eid}: {parked.status} at sequence {parked.last_sequence} (risk medium)")
    runtime = placement.runtime
    await runtime.store.put_ref("main", eid, parked.last_sequence)  # type: ignore[attr-defined]
    variants = {s: {"approved": True, "by": "simulator", "strategy": s} for s in STRATEGIES}
    sim = await simulate(runtime, eid, GATE, variants, dispatcher=placement.dispatcher)
    for b in sim.branches:
        out = b.output or {}
        say(
            f"  {b.ref:<16} {b.status:<10} reward {out.get('reward', 0):.4f} "
            f"(effects {b.effects}, model calls {b.model_calls}, dry runs {b.dry_runs})"
        )
    say(f"  {sim.summary}")
    winner = max(sim.branches, key=lambda b: (b.output or {}).get("reward", -1.0))
    moved = await runtime.promote(winner.ref, "main", by="dba-maria", reason="best simulated")
    say(f"  promoted {winner.ref} -> main (now {moved.execution_id})")
    refused = ""
    try:
        await runtime.resume(eid, GATE, {"approved": True, "by": "dba-maria"})
    except GateSupersededError as exc:
        refused = type(exc).__name__
    say(f"  approving the parent now: {refused or 'accepted?!'}")
    counts = Ledger().counts(eid)
    for b in sim.branches:
        counts.update(Ledger().counts(b.execution_id))
    for line in executed_lines(counts, [*ORDER, "apply:dry-run"]):
        say(line)
    return {
        "summary": sim.summary,
        "parent_unchanged": sim.parent_unchanged,
        "rewards": {b.variant: (b.output or {}).get("reward") for b in sim.branches},
        "winner": winner.variant,
        "promoted": moved.execution_id,
        "winner_id": winner.execution_id,
        "refused": refused,
        "counts": dict(counts),
    }


# ------------------------------------------------------------------------------ act 3: propensity


def batch(logging: str, per_kind: int = 12) -> list[tuple[str, dict[str, Any]]]:
    """The jobs of one batch: ``per_kind`` migrations of each catalog change, with their
    random numbers drawn stratified ((i + 0.5) / per_kind): each strategy is logged exactly
    as often as the logging policy's probability says, so the estimate equals the catalog's
    value instead of wandering around it (i.i.d. draws would give the same estimate on
    average, with noise)."""
    jobs = []
    for kind in CATALOG:
        for i in range(per_kind):
            draw = (i + 0.5) / per_kind
            jobs.append((f"{logging}-{kind}-{i:02d}", _job(kind, draw=draw, logging=logging)))
    return jobs


async def run_batch(placement: Placement, logging: str, per_kind: int = 12) -> list[str]:
    """Serve a batch; the DBA on autopilot approves each gated one and leaves the strategy to
    the policy. Sixteen at a time, as a service would."""
    jobs = batch(logging, per_kind)
    gate = asyncio.Semaphore(16)

    async def one(eid: str, job: dict[str, Any]) -> None:
        async with gate:
            result = await placement.start(FLOW_ID, job, eid)
            if result.status is ExecutionStatus.SUSPENDED:
                await placement.resume(eid, GATE, {"approved": True, "by": "dba-autopilot"})

    await asyncio.gather(*(one(eid, job) for eid, job in jobs))
    return [eid for eid, _ in jobs]


async def logged(placement: Placement, ids: list[str]) -> list[Trajectory]:
    out: list[Trajectory] = []
    for eid in ids:
        found = trajectories_from_envelopes(await placement.runtime.store.read(eid))
        out.extend(t for t in found if t.decision_id == "strategy")
    return out


def _with_inputs(items: list[Trajectory], jobs: dict[str, dict[str, Any]]) -> list[Trajectory]:
    """A blind log names the action only: the context comes from each execution's input (the
    alternatives are known), but no propensity can be recovered."""
    out = []
    for t in items:
        job = jobs[t.execution_id]
        context = {
            "change": job["change"],
            "rows": CATALOG[job["change"]].rows,
            "draw": job["draw"],
        }
        out.append(dataclasses.replace(t, context=context, actions=tuple(STRATEGIES)))
    return out


async def act_propensity(
    placement: Placement, say: Print = print, per_kind: int = 12
) -> tuple[PolicyReport, PolicyReport]:
    """48 migrations through the epsilon-greedy logging policy, the never-run size-aware
    policy evaluated from that log with SNIPS; then the same batch logged blind."""
    n = per_kind * len(CATALOG)
    say(f"== act 4: propensity ({placement.kind} placement)")
    say(
        f"  {n} migrations; logging policy {LOGGING_POLICY.id} (epsilon "
        f"{LOGGING_POLICY.epsilon}, greedy {LOGGING_POLICY.greedy}); candidate {TARGET_POLICY.id}"
    )
    ids = await run_batch(placement, "policy", per_kind)
    report = evaluate_policy(await logged(placement, ids), TARGET_POLICY, seed=0)
    say(
        f"  SNIPS {TARGET_POLICY.id}: value {report.value:.4f}, logged {report.logged_value:.4f}, "
        f"lift {report.lift:+.4f}, effective samples {report.ess:.2f} of {report.evaluated}"
    )
    for line in _report_lines(report):
        say(line)
    blind_ids = await run_batch(placement, "blind", per_kind)
    jobs = dict(batch("blind", per_kind))
    blind = evaluate_policy(_with_inputs(await logged(placement, blind_ids), jobs), TARGET_POLICY)
    agreement = blind.agreement if blind.agreement is not None else float("nan")
    say(
        f"  blind log of the same batch: agreement {agreement:.4f}, value "
        f"{'n/a (agreement only)' if blind.value is None else f'{blind.value:.4f}'}"
    )
    for line in _report_lines(blind):
        say(line)
    every = set(ids) | set(blind_ids)
    totals: dict[str, int] = {}
    for eid, name, _ in Ledger().rows():
        if eid in every:
            totals[name] = totals.get(name, 0) + 1
    say(
        f"  {len(every)} executions: EXECUTED model:risk x{totals.get('model:risk', 0)}, "
        f"apply x{totals.get('apply', 0)}"
    )
    return report, blind


def _report_lines(report: PolicyReport) -> list[str]:
    from loom.learning import format_report

    return ["    " + line for line in format_report(report).splitlines()]
