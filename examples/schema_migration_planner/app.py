"""The schema-migration planner: the flow, its steps, the risk agent and the strategy policies.

A migration job names a change from a simulated catalog. The flow inspects the table, asks an
LLM agent for the risk (JSON ``{risk, rationale}``), applies a low-risk change at once and
otherwise suspends for a DBA (``correlation_key`` = the table). The strategy (direct-ddl,
online-ddl, chunked) is the DBA's when they give one, else a policy's, recorded by
``ctx.decide_with_policy`` with its propensity (or by a bare ``ctx.decide``: "blind"), and the
simulated outcome is recorded as the decision's reward.

Worker processes load it with ``--app examples.schema_migration_planner.app:make_runtime``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal

import pydantic

import loom
from examples._support import Ledger, open_store, provider
from loom.llm import CompletionRequest, reply
from loom.runtime import DryRun, StepCall

FLOW_ID = "schema-migration-planner"
GATE = "DbaDecision"
STRATEGIES = ["direct-ddl", "online-ddl", "chunked"]


class Change(pydantic.BaseModel):
    kind: str
    table: str
    rows: int
    ddl: str


#: The simulated catalog: four changes, from a metadata-only column to a 120M-row backfill.
CATALOG: dict[str, Change] = {
    c.kind: c
    for c in [
        Change(
            kind="add-nullable-column",
            table="customers",
            rows=1_200_000,
            ddl="ALTER TABLE customers ADD COLUMN nickname text NULL",
        ),
        Change(
            kind="add-index",
            table="events",
            rows=48_000_000,
            ddl="CREATE INDEX events_account_idx ON events (account_id)",
        ),
        Change(
            kind="drop-column",
            table="invoices",
            rows=9_000_000,
            ddl="ALTER TABLE invoices DROP COLUMN legacy_ref",
        ),
        Change(
            kind="backfill",
            table="orders",
            rows=120_000_000,
            ddl="UPDATE orders SET region = customers.region FROM customers",
        ),
    ]
}


class Outcome(pydantic.BaseModel):
    strategy: str
    lock_seconds: float
    minutes: float
    reward: float


# Rows per second and the lock each strategy takes, per change: the simulation's whole model.
# direct-ddl rewrites under a lock (metadata-only for a nullable column), online-ddl copies in
# the background and locks only to swap, chunked walks the table in batches with no lock.
_DIRECT_LOCKS = {"add-nullable-column": False, "add-index": True, "drop-column": True}
_RATE = {"direct-ddl": 400_000, "online-ddl": 150_000, "chunked": 50_000}


def simulate(change: Change, strategy: str) -> Outcome:
    """The simulated result of applying ``change`` with ``strategy``; reward in [0, 1]: 1 is
    no lock and quick, each lost second of writes and each hour of running costs."""
    minutes = change.rows / _RATE[strategy] / 60
    if strategy == "direct-ddl":
        locks = _DIRECT_LOCKS.get(change.kind, True)
        lock = minutes * 60 if locks else 0.1
        if not locks:
            minutes = 0.01
    elif strategy == "online-ddl":
        lock = 1.0
        if change.kind == "backfill":  # a data change copied table-wide: replicas fall behind
            minutes *= 3
    else:
        lock = 0.0
        if change.kind != "backfill":  # DDL in chunks is a hand-written multi-step migration
            minutes += 90
    reward = 1.0 - 0.6 * min(1.0, lock / 60.0) - 0.4 * min(1.0, minutes / 180.0)
    return Outcome(
        strategy=strategy,
        lock_seconds=round(lock, 2),
        minutes=round(minutes, 2),
        reward=round(reward, 4),
    )


# ------------------------------------------------------------------------------ policies


class EpsilonGreedy:
    """The logging policy: the team's habit (online-ddl) with probability 1 - epsilon, a
    uniformly random strategy otherwise. The random number is the job's ``draw`` (uniform in
    [0, 1)), carried in the context so replay and audit see the same one."""

    id = "epsilon-greedy"
    version = "1"

    def __init__(self, epsilon: float = 0.25, greedy: str = "online-ddl") -> None:
        self.epsilon = epsilon
        self.greedy = greedy

    def probability(self, context: Any, actions: Sequence[str], action: str) -> float:
        share = self.epsilon / len(actions)
        return share + (1.0 - self.epsilon if action == self.greedy else 0.0)

    def select(self, context: Any, actions: Sequence[str]) -> tuple[str, float]:
        draw = float(context["draw"])
        edge = 0.0
        for action in [self.greedy, *[a for a in actions if a != self.greedy]]:
            edge += self.probability(context, actions, action)
            if draw < edge:
                return action, self.probability(context, actions, action)
        last = actions[-1] if actions[-1] != self.greedy else actions[0]
        return last, self.probability(context, actions, last)


class SizeAware:
    """The candidate nobody has run: direct DDL under 5M rows, chunked for backfills, online
    DDL otherwise (deterministic)."""

    id = "size-aware"
    version = "1"

    def select(self, context: Any, actions: Sequence[str]) -> tuple[str, float]:
        if context["change"] == "backfill":
            return "chunked", 1.0
        if int(context["rows"]) < 5_000_000:
            return "direct-ddl", 1.0
        return "online-ddl", 1.0


LOGGING_POLICY = EpsilonGreedy()
TARGET_POLICY = SizeAware()


# ------------------------------------------------------------------------------ the agent


class Risk(pydantic.BaseModel):
    risk: Literal["low", "medium", "high"]
    rationale: str


def _scripted_risk(request: CompletionRequest) -> Any:
    """The offline model: reads the table facts from the prompt, answers JSON."""
    facts = json.loads(request.messages[-1].text)
    rows = int(facts["rows"])
    if facts["kind"] == "add-nullable-column" or rows < 5_000_000:
        risk, why = "low", f"{rows:,} rows and a metadata-only change"
    elif facts["kind"] == "backfill":
        risk, why = "high", f"rewrites {rows:,} rows; long transactions and replica lag"
    else:
        risk, why = "medium", f"{rows:,} rows rebuilt; writes may block during the change"
    return reply(json.dumps({"risk": risk, "rationale": why}))


_PROVIDER, _MODEL = provider("risk", _scripted_risk)

RISK_AGENT = loom.agent(
    id="migration-risk",
    provider=_PROVIDER,
    model=_MODEL,
    instructions=(
        "You assess the risk of a database schema change on a production table. Answer with "
        'JSON only: {"risk": "low"|"medium"|"high", "rationale": "<one sentence>"}. A change '
        "that rewrites or locks millions of rows is not low risk."
    ),
    output_type=Risk,
    max_turns=3,
)


# ------------------------------------------------------------------------------ the flow


class MigrationJob(pydantic.BaseModel):
    change: str
    #: This job's uniform random number for the logging policy (see EpsilonGreedy).
    draw: float = 0.0
    #: "policy": decide_with_policy (propensity logged); "blind": a bare ctx.decide.
    logging: Literal["policy", "blind"] = "policy"


class DbaDecision(pydantic.BaseModel):
    approved: bool
    by: str
    strategy: Literal["direct-ddl", "online-ddl", "chunked"] | None = None
    note: str = ""


class ApplyRequest(pydantic.BaseModel):
    change: Change
    strategy: str


@loom.step(id="inspect")
def inspect_table(kind: str) -> Change:
    Ledger().record("inspect")
    return CATALOG[kind]


@loom.step(id="apply")
def apply_migration(request: ApplyRequest) -> Outcome:
    Ledger().record("apply")
    return simulate(request.change, request.strategy)


@loom.flow(id=FLOW_ID, version="1", resume_schemas={GATE: DbaDecision})
async def plan_migration(ctx: loom.WorkflowContext, job: MigrationJob) -> dict[str, Any]:
    """Inspect, assess the risk with the agent, wait for the DBA unless low risk, choose the
    strategy, apply, and score the choice."""
    change = await ctx.run(inspect_table, job.change)
    ctx.ui.set("table", {"name": change.table, "rows": change.rows, "change": change.kind})
    facts = {"kind": change.kind, "table": change.table, "rows": change.rows, "ddl": change.ddl}
    assessed = await ctx.agent(RISK_AGENT, json.dumps(facts))
    risk = Risk.model_validate(assessed.output)
    ctx.ui.set("risk", risk.model_dump())
    strategy: str | None = None
    approved_by = "auto (low risk)"
    if risk.risk != "low":
        ctx.ui.set("phase", "awaiting-dba")
        decision: DbaDecision = await ctx.suspend(
            GATE, correlation_key=change.table, timeout=timedelta(hours=24)
        )
        if not decision.approved:
            ctx.ui.set("phase", "rejected")
            return {"outcome": "rejected", "by": decision.by, "risk": risk.risk}
        strategy, approved_by = decision.strategy, decision.by
    chosen_by = "dba"
    if strategy is None:
        context = {"change": change.kind, "rows": change.rows, "draw": job.draw}
        if job.logging == "blind":
            strategy = await ctx.decide(
                "strategy", lambda: LOGGING_POLICY.select(context, STRATEGIES)[0]
            )
        else:
            strategy = await ctx.decide_with_policy("strategy", LOGGING_POLICY, context, STRATEGIES)
        chosen_by = "policy"
    ctx.ui.set("phase", "applying")
    outcome = await ctx.run(apply_migration, ApplyRequest(change=change, strategy=strategy))
    if chosen_by == "policy":
        await ctx.record_outcome("reward", outcome.reward, decision_id="strategy")
    ctx.ui.set("phase", "applied")
    ctx.ui.set("outcome", outcome.model_dump())
    return {
        "outcome": "applied",
        "risk": risk.risk,
        "strategy": strategy,
        "chosen_by": chosen_by,
        "approved_by": approved_by,
        "reward": outcome.reward,
    }


FLOWS = [plan_migration]


def _dry_apply(call: StepCall) -> Outcome:
    """In a simulated branch the change is not applied: its outcome is computed instead."""
    request: ApplyRequest = call.args[0]
    Ledger().record("apply:dry-run")
    return simulate(request.change, request.strategy)


def make_runtime() -> loom.WorkflowRuntime:
    """The runtime a worker process serves (store from ``LOOM_EXAMPLE_STORE``); in branches
    forked for a simulation the ``apply`` step is a dry run."""
    runtime = loom.WorkflowRuntime(open_store(), interceptors=[DryRun({"apply": _dry_apply})])
    runtime.register(*FLOWS)
    return runtime
