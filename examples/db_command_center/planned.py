"""The same command center with ``loom.orchestration.dispatch_plan``: the planner answers with
a :class:`loom.orchestration.Plan` whose steps name the two SQL agents registered on an
``InProcessA2ABus`` (``sql-query`` and ``sql-write``, flows with a JSON input schema on their
cards). ``dispatch_plan`` checks the plan against those cards before anything is dispatched
(an unknown agent or a wrongly shaped input: one ``PlanValidationError``, nothing run),
records it, and runs each step as its own execution ``<run>.<step>`` through the bus's
dispatcher; a write step waits at its own gate, with its row count in its UI projection.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic

import loom
from examples._support import provider
from examples.db_command_center.app import (
    GATE,
    PLANS,
    SCHEMA,
    WriteDecision,
    WriteRequest,
    execute_write,
    preview_write,
    run_query,
    sql_problem,
)
from loom.llm import CompletionRequest, reply
from loom.orchestration import Plan, PlanStep, TaskRejectedError


class SqlStep(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    sql: str


@loom.flow(id="sql-query", version="1")
async def sql_query(ctx: loom.WorkflowContext, step: SqlStep) -> dict[str, Any]:
    """Run one read-only SELECT against the shop database."""
    problem = sql_problem("query", step.sql)
    if problem is not None:
        raise TaskRejectedError(problem, execution_id=ctx.execution_id)
    result = await ctx.run(run_query, step.sql)
    ctx.ui.set("result", result.model_dump())
    return result.model_dump()


@loom.flow(id="sql-write", version="1", resume_schemas={GATE: WriteDecision})
async def sql_write(ctx: loom.WorkflowContext, step: SqlStep) -> dict[str, Any]:
    """Preview one UPDATE/DELETE/INSERT (rows it would change), wait for approval, write."""
    problem = sql_problem("write", step.sql)
    if problem is not None:
        raise TaskRejectedError(problem, execution_id=ctx.execution_id)
    affected = await ctx.run(preview_write, step.sql)
    ctx.ui.set("pending", {"sql": step.sql, "affected_rows": affected})
    decision: WriteDecision = await ctx.suspend(GATE, correlation_key=ctx.execution_id)
    ctx.ui.set("pending", None)
    if not decision.approved:
        return {"sql": step.sql, "rejected_by": decision.by, "reason": decision.reason}
    done = await ctx.run(execute_write, WriteRequest(sql=step.sql, expected_rows=affected))
    return {"sql": step.sql, "written": done.rows, "by": decision.by}


def plan_for(text: str) -> Plan:
    """The offline planner's plan for a request: the same SQL as the flow version, as steps of
    the registered agents (writes after the reads before them)."""
    lowered = text.lower()
    steps: list[PlanStep] = []
    for keyword, planned in PLANS.items():
        if keyword in lowered:
            reads: list[str] = []
            for i, s in enumerate(planned):
                sid = f"step-{i + 1}"
                if keyword == "truncate":  # a plan naming an agent nobody registered
                    steps.append(PlanStep(id=sid, agent="sql-admin", input={"sql": s.sql}))
                elif s.tool == "query":
                    steps.append(PlanStep(id=sid, agent="sql-query", input={"sql": s.sql}))
                    reads.append(sid)
                else:
                    steps.append(
                        PlanStep(id=sid, agent="sql-write", input={"sql": s.sql}, depends_on=reads)
                    )
            break
    return Plan(goal=text, steps=steps)


def _scripted(request: CompletionRequest) -> Any:
    return reply(plan_for(request.messages[0].text).model_dump_json())


_PROVIDER, _MODEL = provider("plan-planner", _scripted)

_EXAMPLE = {
    "goal": "<the request>",
    "steps": [
        {"id": "step-1", "agent": "sql-query", "input": {"sql": "<one SELECT>"}},
        {
            "id": "step-2",
            "agent": "sql-write",
            "input": {"sql": "<one UPDATE or DELETE>"},
            "depends_on": ["step-1"],
        },
    ],
}

PLAN_PLANNER = loom.agent(
    id="sql-plan-planner",
    provider=_PROVIDER,
    model=_MODEL,
    instructions=(
        f"You turn an operator's request about the shop database into a plan. Schema: {SCHEMA} "
        f"Answer with JSON only, like {json.dumps(_EXAMPLE)}. Use sql-write only when the "
        "operator asks for a change."
    ),
    output_type=Plan,
    max_turns=3,
)

FLOWS = [sql_query, sql_write, PLAN_PLANNER]
