"""The DB command center's story, each act through a :class:`Placement` (a LocalDispatcher or
HTTP worker processes): a question answered by read-only queries, a write approved after its
row count was shown, a write rejected, a request cancelled at its gate, and a worker SIGKILLed
mid-request. Each act prints what happened and returns the facts the tests check."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from examples._support import Ledger, Placement, crash_and_continue, executed_lines
from examples.db_command_center.app import (
    FLOW_ID,
    GATE,
    TWO_YEARS_AGO,
    Request,
    sample_db,
)
from loom.model import ExecutionStatus

APP = "examples.db_command_center.app:make_runtime"
ORDER = ["model:planner", "query", "preview", "write", "model:analyst"]
Print = Callable[[str], None]

REQUESTS = {
    "why": "Why did orders drop yesterday?",
    "archive": "Archive orders older than 2 years",
    "cleanup": "Delete all cancelled orders",
    "regions": "Merge the east region into central",
    "truncate": "Truncate the orders table",
}


def db_count(sql: str) -> int:
    conn = sqlite3.connect(sample_db())
    try:
        return int(conn.execute(sql).fetchone()[0])
    finally:
        conn.close()


def _show(say: Print, eid: str) -> None:
    for line in executed_lines(Ledger().counts(eid), ORDER):
        say("  " + line)


async def _ui(placement: Placement, eid: str) -> dict[str, Any]:
    state = await placement.runtime.load_state(eid)
    assert state is not None
    return dict(state.ui)


async def act_requests(placement: Placement, say: Print = print) -> dict[str, Any]:
    """Five requests: a question (reads only, answered at once), an archive the operator
    approves after seeing how many rows it changes, a delete they reject, a region merge
    cancelled while it waits, and a plan refused before anything runs (DROP TABLE)."""
    say(f"== the operator's requests ({placement.kind} placement)")
    facts: dict[str, Any] = {}
    for key, text in REQUESTS.items():
        eid = f"cc-{key}"
        result = await placement.start(FLOW_ID, Request(text=text).model_dump(), eid)
        ui = await _ui(placement, eid)
        say(f"> {text}")
        say(f"  plan: {len(ui.get('plan', []))} step(s); {ui.get('phase')}: {result.status}")
        if result.status is ExecutionStatus.SUSPENDED:
            pending = ui["pending"]
            say(f"  waiting for approval: {pending['sql']}")
            say(f"  it would change {pending['affected_rows']} row(s)")
            facts[f"{key}.affected"] = pending["affected_rows"]
    old = f"SELECT COUNT(*) FROM orders WHERE created_at < '{TWO_YEARS_AGO}'"
    archived = "SELECT COUNT(*) FROM orders WHERE status = 'archived'"
    cancelled = "SELECT COUNT(*) FROM orders WHERE status = 'cancelled'"
    facts["before.cancelled"] = db_count(cancelled)
    await placement.resume("cc-archive", GATE, {"approved": True, "by": "ops-lead"})
    say(f"  ops-lead approves the archive: {db_count(archived)} orders archived")
    await placement.resume(
        "cc-cleanup", GATE, {"approved": False, "by": "ops-lead", "reason": "keep for audit"}
    )
    say(f"  ops-lead rejects the delete: {db_count(cancelled)} cancelled orders kept")
    await placement.runtime.cancel("cc-regions", reason="asked by mistake")
    say("  the region merge is cancelled at its gate")
    for key in REQUESTS:
        eid = f"cc-{key}"
        state = await placement.runtime.load_state(eid)
        assert state is not None
        facts[f"{key}.status"] = str(state.status)
        facts[f"{key}.counts"] = dict(Ledger().counts(eid))
        answer = state.ui.get("answer")
        say(f"{eid}: {state.status}" + (f": {answer}" if answer else ""))
        _show(say, eid)
    facts["old"] = db_count(old)
    facts["archived"] = db_count(archived)
    facts["after.cancelled"] = db_count(cancelled)
    facts["east"] = db_count("SELECT COUNT(*) FROM customers WHERE region = 'east'")
    return facts


async def act_crash(placement: Placement, workdir: Path, say: Print = print) -> dict[str, Any]:
    """The question again, in a worker SIGKILLed right after the planner's answer is recorded;
    another process continues from the id alone: the planner is not asked twice."""
    say(f"== SIGKILL mid-request ({placement.kind} placement)")
    eid = "cc-crash"
    crash = await crash_and_continue(
        placement,
        app=APP,
        flow_id=FLOW_ID,
        input=Request(text=REQUESTS["why"]).model_dump(),
        execution_id=eid,
        fault="agents.after_model_recorded=kill@1",
        workdir=workdir,
    )
    say(f"  worker exit code {crash.exit_code} (SIGKILL is -9); left {crash.left}")
    say(f"  continued from another process with only the id: {crash.after}")
    state = await placement.runtime.load_state(eid)
    assert state is not None
    say(f"  answer: {state.ui.get('answer')}")
    _show(say, eid)
    return {
        "exit_code": crash.exit_code,
        "left": crash.left,
        "after": crash.after,
        "counts": dict(Ledger().counts(eid)),
        "answer": state.ui.get("answer"),
    }


# ------------------------------------------------------------------------------ dispatch_plan


async def act_dispatch_plan(placement: Placement, say: Print = print) -> dict[str, Any]:
    """The requests again, planned into a ``loom.orchestration.Plan`` and run by
    ``dispatch_plan`` over an ``InProcessA2ABus`` (each step its own execution through the
    placement's dispatcher): reads at once, each write at its own gate with its row count,
    one approved, one rejected, and a plan naming an unregistered agent refused before
    anything runs."""
    from examples.db_command_center.planned import FLOWS as PLANNED
    from loom.orchestration import (
        InProcessA2ABus,
        Plan,
        PlanValidationError,
        dispatch_plan,
        node_execution_id,
    )

    say(f"== the requests through dispatch_plan ({placement.kind} placement)")
    bus = InProcessA2ABus(placement.runtime, dispatcher=placement.dispatcher)
    for flow in PLANNED:
        bus.register(flow)
    facts: dict[str, Any] = {}
    decisions = {
        "archive": {"approved": True, "by": "ops-lead"},
        "cleanup": {"approved": False, "by": "ops-lead", "reason": "keep for audit"},
    }
    for key in ("why", "archive", "cleanup", "truncate"):
        text = REQUESTS[key]
        say(f"> {text}")
        planned = await bus.send("sql-plan-planner", text, message_id=f"plan-{key}")
        plan = Plan.model_validate(planned.output["output"])
        run_id = f"dp-{key}"
        try:
            run = await dispatch_plan(plan, bus, run_id=run_id)
        except PlanValidationError as exc:
            say(f"  plan refused, nothing dispatched: {'; '.join(exc.problems)}")
            facts[f"{key}.refused"] = list(exc.problems)
            continue
        for step in list(run.waiting):
            state = await placement.runtime.load_state(node_execution_id(run_id, step))
            assert state is not None
            pending = state.ui["pending"]
            say(f"  {step} waits: {pending['sql']} ({pending['affected_rows']} rows)")
            facts[f"{key}.affected"] = pending["affected_rows"]
            run = await dispatch_plan(
                plan, bus, run_id=run_id, decisions={step: run.decision(step, decisions[key])}
            )
        facts[f"{key}.status"] = str(run.status)
        facts[f"{key}.outputs"] = run.outputs
        for step, out in run.outputs.items():
            shown = out.get("rows") if "columns" in out else out
            say(f"  {step}: {shown}")
    counts: dict[str, int] = {}
    for eid, name, _ in Ledger().rows():
        if eid.startswith("dp-") or name == "model:plan-planner":
            counts[name] = counts.get(name, 0) + 1
    for line in executed_lines(Counter(counts), ["model:plan-planner", *ORDER]):
        say(line)
    facts["counts"] = counts
    return facts
