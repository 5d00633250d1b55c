"""The DB command center: plain-language requests turned into a plan of SQL steps by a planner
agent, run against a real SQLite sample database (a small shop this module creates).

Read-only queries run at once; a write is previewed first (the rows it would change, counted
inside a rolled-back transaction), then waits for an operator's approval at a gate, and runs
only if the row count still matches. Every result goes to the UI projection as it arrives;
an analyst agent writes the answer at the end. Worker processes load
``examples.db_command_center.app:make_runtime``.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from datetime import date, timedelta
from pathlib import Path
from typing import Any, Literal

import pydantic

import loom
from examples._support import Ledger, open_store, provider
from loom.llm import CompletionRequest, reply

FLOW_ID = "db-command-center"
GATE = "WriteApproval"
SAMPLE_DB_ENV = "LOOM_EXAMPLE_SAMPLE_DB"
#: The sample shop's "today": fixed, so every run (and every test) sees the same data.
TODAY = date(2026, 11, 30)
YESTERDAY = TODAY - timedelta(days=1)
TWO_YEARS_AGO = TODAY.replace(year=TODAY.year - 2)


def sample_db() -> str:
    return os.environ.get(SAMPLE_DB_ENV, "shop.db")


def create_sample_db(path: str | Path) -> dict[str, int]:
    """The sample shop: 40 customers and three years of orders, with a planted incident:
    yesterday most card payments failed (the payment provider's outage), so completed orders
    dropped. Deterministic (no randomness); returns a few counts."""
    Path(path).unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    with conn:
        conn.executescript(
            """
            CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, region TEXT);
            CREATE TABLE orders (
                id INTEGER PRIMARY KEY,
                customer_id INTEGER NOT NULL REFERENCES customers(id),
                amount_cents INTEGER NOT NULL,
                payment TEXT NOT NULL,
                status TEXT NOT NULL,
                created_at TEXT NOT NULL
            );
            """
        )
        regions = ["north", "south", "east", "west"]
        conn.executemany(
            "INSERT INTO customers VALUES (?, ?, ?)",
            [(i, f"customer-{i:02d}", regions[i % 4]) for i in range(1, 41)],
        )
        rows = []
        n = 0
        for back in range(3 * 365, 0, -1):
            day = TODAY - timedelta(days=back)
            per_day = 4 if back > 30 else 40
            for k in range(per_day):
                n += 1
                payment = "card" if k % 4 != 3 else "paypal"
                status = "completed"
                if k % 17 == 5:
                    status = "cancelled"
                if day == YESTERDAY and payment == "card" and k % 10 != 0:
                    status = "payment_failed"  # the planted incident
                rows.append(
                    (n, 1 + (n * 7) % 40, 1_000 + (n * 37) % 9_000, payment, status, str(day))
                )
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)", rows)
    conn.close()
    return {"orders": len(rows), "customers": 40}


# ------------------------------------------------------------------------------ SQL steps


class QueryResult(pydantic.BaseModel):
    sql: str
    columns: list[str]
    rows: list[list[Any]]


class WriteRequest(pydantic.BaseModel):
    sql: str
    expected_rows: int


class WriteResult(pydantic.BaseModel):
    sql: str
    rows: int


_READ = re.compile(r"^\s*(SELECT|WITH)\b", re.IGNORECASE)
_WRITE = re.compile(r"^\s*(UPDATE|DELETE|INSERT)\b", re.IGNORECASE)


def sql_problem(kind: str, sql: str) -> str | None:
    """Why a planned statement may not run as ``kind`` (None: it may)."""
    if ";" in sql.strip().rstrip(";"):
        return "one statement per step"
    if kind == "query" and not _READ.match(sql):
        return "a query step must be a SELECT"
    if kind == "write" and not _WRITE.match(sql):
        return "a write step must be an UPDATE, DELETE or INSERT"
    return None


@loom.step(id="query")
def run_query(sql: str) -> QueryResult:
    """A read-only query: the connection itself is read-only, whatever the SQL says."""
    Ledger().record("query")
    conn = sqlite3.connect(f"file:{sample_db()}?mode=ro", uri=True)
    try:
        cursor = conn.execute(sql)
        columns = [d[0] for d in cursor.description or ()]
        rows = [list(r) for r in cursor.fetchmany(50)]
    finally:
        conn.close()
    return QueryResult(sql=sql, columns=columns, rows=rows)


@loom.step(id="preview")
def preview_write(sql: str) -> int:
    """How many rows the write would change: run it in a transaction and roll it back."""
    Ledger().record("preview")
    conn = sqlite3.connect(sample_db(), isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        changed = conn.execute(sql).rowcount
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    return int(changed)


class RowCountChangedError(Exception):
    """The data moved between the preview the operator approved and the write."""


@loom.step(id="write", retry=loom.RetryPolicy(max_attempts=1))
def execute_write(request: WriteRequest) -> WriteResult:
    """The approved write, committed only if it changes exactly the rows the operator saw."""
    Ledger().record("write")
    conn = sqlite3.connect(sample_db(), isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        changed = conn.execute(request.sql).rowcount
        if changed != request.expected_rows:
            conn.execute("ROLLBACK")
            raise RowCountChangedError(
                f"the write would change {changed} rows, not the {request.expected_rows} "
                "approved; nothing was written"
            )
        conn.execute("COMMIT")
    finally:
        conn.close()
    return WriteResult(sql=request.sql, rows=changed)


# ------------------------------------------------------------------------------ the agents


class PlanStep(pydantic.BaseModel):
    tool: Literal["query", "write"]
    sql: str
    purpose: str


class Plan(pydantic.BaseModel):
    steps: list[PlanStep]


SCHEMA = (
    "customers(id, name, region); orders(id, customer_id, amount_cents, payment "
    "['card'|'paypal'], status ['completed'|'cancelled'|'payment_failed'|'archived'], "
    f"created_at 'YYYY-MM-DD'). Today is {TODAY}."
)

#: The offline planner's plans, by a keyword of the request.
PLANS: dict[str, list[PlanStep]] = {
    "drop": [
        PlanStep(
            tool="query",
            sql="SELECT created_at AS day, COUNT(*) AS orders, SUM(status = 'completed') AS "
            f"completed FROM orders WHERE created_at >= '{TODAY - timedelta(days=7)}' "
            "GROUP BY created_at ORDER BY created_at",
            purpose="daily orders over the last week",
        ),
        PlanStep(
            tool="query",
            sql="SELECT payment, status, COUNT(*) AS n FROM orders "
            f"WHERE created_at = '{YESTERDAY}' GROUP BY payment, status ORDER BY n DESC",
            purpose="yesterday's orders by payment method and status",
        ),
    ],
    "archive": [
        PlanStep(
            tool="query",
            sql=f"SELECT COUNT(*) AS old_orders FROM orders WHERE created_at < '{TWO_YEARS_AGO}'",
            purpose="how many orders are older than two years",
        ),
        PlanStep(
            tool="write",
            sql="UPDATE orders SET status = 'archived' "
            f"WHERE created_at < '{TWO_YEARS_AGO}' AND status != 'archived'",
            purpose="archive orders older than two years",
        ),
    ],
    "cancelled": [
        PlanStep(
            tool="write",
            sql="DELETE FROM orders WHERE status = 'cancelled'",
            purpose="delete cancelled orders",
        )
    ],
    "truncate": [  # a plan the check refuses before anything runs
        PlanStep(tool="write", sql="DROP TABLE orders", purpose="empty the orders table")
    ],
    "region": [
        PlanStep(
            tool="write",
            sql="UPDATE customers SET region = 'central' WHERE region = 'east'",
            purpose="merge the east region into central",
        )
    ],
}


def _scripted_planner(request: CompletionRequest) -> Any:
    text = request.messages[0].text.lower()
    for keyword, steps in PLANS.items():
        if keyword in text:
            return reply(Plan(steps=steps).model_dump_json())
    return reply(Plan(steps=[]).model_dump_json())


def _scripted_analyst(request: CompletionRequest) -> Any:
    facts = json.loads(request.messages[0].text)
    lines = []
    for r in facts["results"]:
        if "rows" in r and "columns" in r and r["columns"][:2] == ["payment", "status"]:
            failed = sum(n for p, s, n in r["rows"] if s == "payment_failed")
            card = sum(n for p, s, n in r["rows"] if p == "card")
            lines.append(
                f"Yesterday {failed} of {card} card payments failed (status payment_failed); "
                "PayPal orders were unaffected: a card payment provider outage, not demand."
            )
        elif "written" in r:
            lines.append(f"{r['written']} row(s) changed by: {r['sql']}")
        elif "rejected_by" in r:
            lines.append(f"Not run (rejected by {r['rejected_by']}): {r['sql']}")
    return reply(" ".join(lines) or "Nothing to report.")


_PLANNER_PROVIDER, _PLANNER_MODEL = provider("planner", _scripted_planner)
_ANALYST_PROVIDER, _ANALYST_MODEL = provider("analyst", _scripted_analyst)

PLANNER = loom.agent(
    id="sql-planner",
    provider=_PLANNER_PROVIDER,
    model=_PLANNER_MODEL,
    instructions=(
        "You turn an operator's request about the shop database into a plan of SQL steps. "
        f"Schema: {SCHEMA} Answer with JSON only: "
        '{"steps": [{"tool": "query"|"write", "sql": "<one SQLite statement>", '
        '"purpose": "<why>"}]}. Use "query" (SELECT) to investigate and "write" '
        "(UPDATE/DELETE/INSERT) only when the operator asks for a change."
    ),
    output_type=Plan,
    max_turns=3,
)

ANALYST = loom.agent(
    id="sql-analyst",
    provider=_ANALYST_PROVIDER,
    model=_ANALYST_MODEL,
    instructions=(
        "You get an operator's request and the results of the SQL steps run for it (JSON). "
        "Answer the request in two or three plain sentences, citing the numbers."
    ),
    max_turns=2,
)


# ------------------------------------------------------------------------------ the flow


class Request(pydantic.BaseModel):
    text: str
    operator: str = "operator"


class WriteDecision(pydantic.BaseModel):
    approved: bool
    by: str
    reason: str = ""


@loom.flow(id=FLOW_ID, version="1", resume_schemas={GATE: WriteDecision})
async def command(ctx: loom.WorkflowContext, req: Request) -> dict[str, Any]:
    """Plan, check the plan, run reads at once and each write after its approval, answer."""
    ctx.ui.set("request", req.text)
    ctx.ui.set("phase", "planning")
    planned = await ctx.agent(PLANNER, req.text)
    plan = Plan.model_validate(planned.output)
    ctx.ui.set("plan", [s.model_dump() for s in plan.steps])
    problems = [
        f"step {i + 1}: {p}"
        for i, s in enumerate(plan.steps)
        if (p := sql_problem(s.tool, s.sql)) is not None
    ]
    if problems:  # checked before anything runs: a bad plan runs nothing
        ctx.ui.set("phase", "plan refused")
        return {"outcome": "plan refused", "problems": problems}
    results: list[dict[str, Any]] = []
    for i, step in enumerate(plan.steps):
        if step.tool == "query":
            result = await ctx.run(run_query, step.sql)
            results.append(result.model_dump())
        else:
            affected = await ctx.run(preview_write, step.sql)
            ctx.ui.set("pending", {"step": i, "sql": step.sql, "affected_rows": affected})
            ctx.ui.set("phase", "awaiting approval")
            decision: WriteDecision = await ctx.suspend(
                GATE, correlation_key=f"{ctx.execution_id}:step-{i}"
            )
            ctx.ui.set("pending", None)
            if decision.approved:
                ctx.ui.set("phase", "writing")
                done = await ctx.run(
                    execute_write, WriteRequest(sql=step.sql, expected_rows=affected)
                )
                results.append({"sql": step.sql, "written": done.rows, "by": decision.by})
            else:
                results.append(
                    {"sql": step.sql, "rejected_by": decision.by, "reason": decision.reason}
                )
        ctx.ui.set("results", results)  # each result reaches the UI as soon as it exists
    ctx.ui.set("phase", "answering")
    answer = await ctx.agent(ANALYST, json.dumps({"request": req.text, "results": results}))
    ctx.ui.set("answer", answer.output)
    ctx.ui.set("phase", "done")
    return {"outcome": "answered", "answer": answer.output, "results": results}


FLOWS = [command]


def make_runtime() -> loom.WorkflowRuntime:
    """The runtime a worker process serves (store from ``LOOM_EXAMPLE_STORE``): the request
    flow, and the SQL agents and planner of the ``dispatch_plan`` version (planned.py)."""
    from examples.db_command_center import planned

    runtime = loom.WorkflowRuntime(open_store())
    runtime.register(*FLOWS, *planned.FLOWS)
    return runtime
