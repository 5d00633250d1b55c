"""The incident war room's story through a :class:`Placement`: every agent task goes through
an ``InProcessA2ABus`` whose dispatcher is the placement's (a LocalDispatcher, or HTTP worker
processes). Each act prints what happened and returns the facts the tests check."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from examples._support import Ledger, Placement, crash_and_continue, executed_lines
from examples.incident_war_room.app import (
    AGENTS,
    COMMAND_FLOW,
    advance_clock,
    incident_command,
)
from loom.orchestration import (
    GraphRun,
    InProcessA2ABus,
    Plan,
    dispatch_plan,
    node_execution_id,
)
from loom.placement import (
    TIMER_WAKE,
    ExecutionPackage,
    Intent,
    ResumeEvent,
    is_superseded_refusal,
)

APP = "examples.incident_war_room.app:make_runtime"
Print = Callable[[str], None]

ALERT = "checkout-api: 5xx rate 12% and orders/min down 55% since 14:04"
FALSE_ALARM = "batch-7: queue depth above threshold"


def make_bus(placement: Placement) -> InProcessA2ABus:
    bus = InProcessA2ABus(placement.runtime, dispatcher=placement.dispatcher)
    for agent in AGENTS:
        bus.register(agent)
    bus.register(incident_command)
    return bus


def incident_counts(incident: str) -> Counter[str]:
    """The effects of one incident only: its commander run (execution id = the incident),
    the investigators and the commander agent it started, its plan's steps and its
    postmortem (all ``<incident>.…``)."""
    return Counter(name for eid, name, _ in Ledger().rows() if of_incident(eid, incident))


def of_incident(execution_id: str, incident: str) -> bool:
    return execution_id == incident or execution_id.startswith(incident + ".")


async def investigate_and_plan(
    bus: InProcessA2ABus, incident: str, alert: str, say: Print
) -> tuple[list[dict[str, Any]], Plan, GraphRun]:
    """Start the commander's run for the incident (a durable flow that fans out to the three
    investigators and has the commander agent plan), then dispatch its plan. The run's task
    id is the incident and the plan's run id derives from it, so running this again for the
    same incident continues it (or reads its outcome), re-running nothing."""
    state = await bus.runtime.load_state(incident)
    if state is None:
        command = await bus.send(COMMAND_FLOW, {"alert": alert}, task_id=incident)
    else:  # started before: its outcome (or, when it is still running, once it settles)
        command = await bus.wait(incident, timeout=120)
    if command.output is None:
        raise RuntimeError(f"the commander's run {incident} ended {command.state}")
    findings = list(command.output["findings"])
    for f in findings:
        say(f"  [{f['source']}] {f['summary']}")
    plan = Plan.model_validate(command.output["plan"])
    say(f"  commander's plan: {plan.goal}: " + ", ".join(s.id for s in plan.steps))
    run = await dispatch_plan(plan, bus, run_id=f"{incident}.plan")
    for name, node in run.nodes.items():
        say(f"    {name}: {node.state}")
    return findings, plan, run


async def vote(
    bus: InProcessA2ABus,
    run_id: str,
    step: str,
    agent: str,
    by: str,
    approve: bool,
    reason: str = "",
) -> str:
    message: dict[str, Any] = {"vote": "approve" if approve else "reject", "by": by}
    if reason:
        message["reason"] = reason
    task = await bus.send(
        agent, message, task_id=node_execution_id(run_id, step), message_id=f"{run_id}.{step}:{by}"
    )
    return str(task.state)


async def act_incident(placement: Placement, workdir: Path, say: Print = print) -> dict[str, Any]:
    """The checkout incident, end to end; and a false alarm the operator cancels."""
    say(f"== incident war room ({placement.kind} placement)")
    bus = make_bus(placement)
    facts: dict[str, Any] = {}
    incident = "inc-checkout"
    say(f"ALERT {ALERT}")
    findings, plan, run = await investigate_and_plan(bus, incident, ALERT, say)
    facts["waiting"] = sorted(n for n, r in run.nodes.items() if str(r.state) == "input-required")
    run_id = run.run_id
    # Quorum 2: one vote leaves the gate open; the second runs the tool.
    first = await vote(bus, run_id, "flag-off", "flag-operator", "oncall", True)
    second = await vote(bus, run_id, "flag-off", "flag-operator", "incident-lead", True)
    say(f"  flag-off: oncall approves -> {first}; incident-lead approves -> {second}")
    facts["flag-off.votes"] = [first, second]
    await vote(bus, run_id, "rollback", "deploy-operator", "oncall", True)
    rejected = await vote(
        bus, run_id, "rollback", "deploy-operator", "incident-lead", False,
        "the flag is off and errors are gone; a rollback now is riskier than waiting",
    )  # fmt: skip
    say(f"  rollback: oncall approves, incident-lead rejects -> {rejected}")

    # A second alert, a false alarm: the operator cancels the incident while its plan waits.
    say(f"ALERT {FALSE_ALARM}")
    _, other_plan, other = await investigate_and_plan(bus, "inc-batch", FALSE_ALARM, say)
    for node in other.nodes.values():
        if not node.state.is_terminal:
            await bus.cancel(node.execution_id, reason="false alarm")
    cancelled = await dispatch_plan(other_plan, bus, run_id=other.run_id)
    say(f"  the operator cancels inc-batch: plan {cancelled.status}")
    facts["cancelled.status"] = str(cancelled.status)

    # Nobody votes on the scale-out; fifteen minutes pass: the deadline rejects the call and
    # the agent escalates (pages the incident manager).
    advance_clock(16 * 60)
    scale_id = node_execution_id(run_id, "scale")
    state = await placement.runtime.load_state(scale_id)
    assert state is not None and state.waiting is not None
    wake = ExecutionPackage(
        execution_id=scale_id,
        flow_id=state.flow_id,
        resume_event=ResumeEvent(TIMER_WAKE, {"position": state.waiting.position}),
        intent=Intent.WAKE,
    )
    try:
        await placement.dispatcher.dispatch(wake)
    except Exception as exc:
        # A timer service (this process's or a worker's) fired the same due timer first:
        # that holder's outcome is ours, awaited by id below.
        if not is_superseded_refusal(exc, scale_id):
            raise
    await bus.wait(scale_id, timeout=60)
    final = await dispatch_plan(plan, bus, run_id=run_id)
    outcomes = {name: str((node.output or {}).get("output")) for name, node in final.nodes.items()}
    for name, text in outcomes.items():
        say(f"  {name}: {text}")
    facts["plan.status"] = str(final.status)
    facts["outcomes"] = outcomes

    post = await bus.send(
        "postmortem-writer",
        {"alert": ALERT, "findings": findings, "remediation": outcomes},
        task_id=f"{incident}.postmortem",
    )
    report = str(post.output["output"])
    (workdir / f"postmortem-{incident}.md").write_text(report + "\n")
    say(f"  postmortem written to {workdir / f'postmortem-{incident}.md'}:")
    for line in report.splitlines():
        say("    | " + line)
    # This act's effects only (its two incidents), so "paid once" shows per incident.
    facts["counts"] = {}
    for name in (incident, "inc-batch"):
        counts = incident_counts(name)
        say(f"  {name}:")
        for line in executed_lines(counts):
            say("  " + line)
        facts["counts"][name] = dict(counts)
    facts["postmortem"] = report
    return facts


async def act_crash(placement: Placement, workdir: Path, say: Print = print) -> dict[str, Any]:
    """The logs investigator's worker is SIGKILLed right after its first model answer (the
    tool call) is recorded; another process continues the task by id: the tool runs once and
    the model is asked once per turn."""
    say(f"== SIGKILL an investigator ({placement.kind} placement)")
    eid = "inc-crash.logs"
    crash = await crash_and_continue(
        placement,
        app=APP,
        flow_id="logs-investigator",
        input={"alert": ALERT},
        execution_id=eid,
        fault="agents.after_model_recorded=kill@1",
        workdir=workdir,
    )
    say(f"  worker exit code {crash.exit_code}; left {crash.left}; continued: {crash.after}")
    counts = Ledger().counts(eid)
    for line in executed_lines(counts):
        say(line)
    state = await placement.runtime.load_state(eid)
    assert state is not None
    return {
        "exit_code": crash.exit_code,
        "left": crash.left,
        "after": crash.after,
        "counts": dict(counts),
        "output": (state.output or {}).get("output"),
    }


async def act_commander_crash(workdir: Path, say: Print = print) -> dict[str, Any]:
    """The commander's process is SIGKILLed in the middle of its fan-out: right after the
    5th investigator answer is recorded (three investigators answer twice each, at the same
    time), so at least two have all their answers and one still needs its last. Run again,
    it recovers the runs it left running (the commander's flow and the unfinished
    investigator) and carries on: the finished investigators are not asked again, the new
    process asks the model exactly the one answer missing, and the plan is asked for once.
    (Local placement: the commander's process hosts its runtime and the bus.)"""
    import subprocess
    import sys

    from examples._support import ROOT, worker_env

    say("== SIGKILL the commander's process (local placement)")
    incident = "inc-commander"
    args = [sys.executable, "-m", "examples.incident_war_room.commander", "--incident", incident]
    dead = await asyncio.to_thread(
        subprocess.run,
        args,
        env=worker_env(LOOM_FAULTS="agents.after_model_recorded=kill@5"),
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    say(f"  commander exit code {dead.returncode} (SIGKILL is -9)")
    again = await asyncio.to_thread(
        subprocess.run,
        args,
        env=worker_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if again.returncode != 0:
        raise RuntimeError(f"the commander failed on its second run:\n{again.stderr}")
    for line in again.stdout.splitlines():
        say("  " + line)
    counts = incident_counts(incident)
    for line in executed_lines(counts):
        say(line)
    rows = [r for r in Ledger().rows() if of_incident(r[0], incident)]
    redone = Counter(name for _, name, pid in rows if pid == again_pid(again.stdout))
    say("  of which the new process: " + ", ".join(f"{n} x{c}" for n, c in sorted(redone.items())))
    first = {pid for _, _, pid in rows if pid != again_pid(again.stdout)}
    return {
        "exit_code": dead.returncode,
        "stdout": again.stdout,
        "counts": dict(counts),
        "rows": rows,
        "second_pid": again_pid(again.stdout),
        "first_pids": sorted(first),
    }


def again_pid(stdout: str) -> int:
    """The pid the commander process prints on its first line (``pid N``)."""
    for line in stdout.splitlines():
        if line.startswith("pid "):
            return int(line.split()[1])
    raise ValueError(f"no pid line in {stdout!r}")
