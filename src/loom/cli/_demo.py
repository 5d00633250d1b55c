"""The main demo: a schema-migration guard that survives a SIGKILL and waits for a DBA.

inspect -> assess risk -> durable approval gate -> apply. The demo runs the flow in a worker
process that kills itself (SIGKILL) mid-flight, recovers it from this process without re-running
the committed step, refuses a malformed approval, approves, and prints the timeline.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pydantic

import loom


class TableRef(pydantic.BaseModel):
    name: str


class Stats(pydantic.BaseModel):
    rows: int
    indexes: int
    hot: bool


class Risk(pydantic.BaseModel):
    level: str
    reason: str


class MigrationInput(pydantic.BaseModel):
    table: str
    ddl: str


class ApprovalDecision(pydantic.BaseModel):
    approved: bool
    approved_by: str
    note: str = ""


def _ledger_path() -> str:
    return os.environ.get("LOOM_DEMO_LEDGER", "loom-demo-effects.db")


def record_effect(name: str) -> None:
    """Every effect writes a durable row, so the demo can prove what ran how often."""
    info = loom.current_step()
    with sqlite3.connect(_ledger_path(), timeout=30) as conn:
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE IF NOT EXISTS effects (execution_id TEXT, step TEXT, pid INT)")
        conn.execute(
            "INSERT INTO effects VALUES (?, ?, ?)",
            (info.execution_id if info else "", name, os.getpid()),
        )


def effect_counts(ledger: str, execution_id: str) -> dict[str, int]:
    if not Path(ledger).exists():
        return {}
    with sqlite3.connect(ledger) as conn:
        rows = conn.execute(
            "SELECT step, COUNT(*) FROM effects WHERE execution_id = ? GROUP BY step",
            (execution_id,),
        ).fetchall()
    counts = dict(rows)
    order = ["inspect", "assess-risk", "apply"]
    return {step: counts[step] for step in order if step in counts}


@loom.step(id="inspect")
async def inspect(table: TableRef) -> Stats:
    record_effect("inspect")
    return Stats(rows=12_500_000, indexes=4, hot=table.name in ("orders", "payments"))


@loom.step(id="assess-risk")
def assess_risk(stats: Stats) -> Risk:
    record_effect("assess-risk")
    if stats.hot and stats.rows > 1_000_000:
        return Risk(level="high", reason=f"{stats.rows:,} rows on a hot table; needs a DBA")
    return Risk(level="low", reason="small or cold table")


@loom.step(id="apply")
async def apply_migration(ddl: str) -> str:
    record_effect("apply")
    return f"applied: {ddl}"


@loom.flow(
    id="migration-guard",
    version="1.0.0",
    resume_schemas={"ApprovalGranted": ApprovalDecision},
)
async def migration_guard(ctx: loom.WorkflowContext, inp: MigrationInput) -> dict[str, str]:
    """Inspect a table, assess the migration's risk, wait for a DBA, then apply it."""
    stats = await ctx.run(inspect, TableRef(name=inp.table))
    risk = await ctx.run(assess_risk, stats)
    ctx.ui.set("risk", risk.model_dump())
    ctx.ui.set("phase", "awaiting-approval")
    decision: ApprovalDecision = await ctx.suspend(
        "ApprovalGranted", correlation_key=inp.table, timeout=timedelta(hours=24)
    )
    if not decision.approved:
        ctx.ui.set("phase", "rejected")
        return {"outcome": "rejected", "by": decision.approved_by}
    result = await ctx.run(apply_migration, inp.ddl)
    ctx.ui.set("phase", "applied")
    return {"outcome": result, "risk": risk.level, "approved_by": decision.approved_by}


FLOWS = [migration_guard]


async def _worker(db: str, execution_id: str, table: str) -> None:
    runtime = loom.WorkflowRuntime(loom.SQLiteStore(db))
    runtime.register(migration_guard)
    inp = MigrationInput(table=table, ddl=f"ALTER TABLE {table} ADD COLUMN note text")
    handle = await runtime.start(migration_guard, inp, execution_id=execution_id)
    await handle.settled(timeout=60)
    await runtime.close()


def run_worker_process(db: str, execution_id: str, table: str, ledger: str) -> int:
    """Start the flow in a child process armed to SIGKILL itself after the risk assessment's
    effect ran but before it was recorded (the worst moment); return its exit code."""
    env = {
        **os.environ,
        "LOOM_FAULTS": "after_effect_before_record=kill@2",
        "LOOM_DEMO_LEDGER": ledger,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "loom.cli._demo", db, execution_id, table],
        env=env,
        timeout=120,
    )
    return proc.returncode


KILLED = -signal.SIGKILL

if __name__ == "__main__":
    import asyncio

    asyncio.run(_worker(*sys.argv[1:4]))
