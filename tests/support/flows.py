"""Flows shared by the tests (importable by subprocesses as `tests.support.flows`)."""

from __future__ import annotations

import os
import sqlite3
from datetime import timedelta
from pathlib import Path

import pydantic

import loom


class TableRef(pydantic.BaseModel):
    name: str


class Stats(pydantic.BaseModel):
    rows: int
    locks: int


class MigrationInput(pydantic.BaseModel):
    table: str
    ddl: str


class ApprovalDecision(pydantic.BaseModel):
    approved: bool
    approved_by: str


class EffectLedger:
    """Counts effects in their own SQLite file (synchronous=FULL): the oracle for 'ran N times'.

    Each effect appends (execution, position, step, attempt, pid) in its own durable commit, so
    a SIGKILL right after the effect still leaves its row.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        with self._conn() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS effects (execution_id TEXT, position INTEGER, "
                "step_id TEXT, attempt INTEGER, pid INTEGER)"
            )

    def _conn(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def record(self, step_id: str) -> None:
        info = loom.current_step()
        assert info is not None, "EffectLedger.record() must be called inside a step"
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO effects VALUES (?, ?, ?, ?, ?)",
                (info.execution_id, info.position, step_id, info.attempt, os.getpid()),
            )

    def counts(self, execution_id: str) -> dict[str, int]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT step_id, COUNT(*) FROM effects WHERE execution_id = ? GROUP BY step_id",
                (execution_id,),
            ).fetchall()
        return {step: n for step, n in rows}


def ledger() -> EffectLedger:
    return EffectLedger(Path(os.environ["LOOM_TEST_LEDGER"]))


def _make_step(name: str) -> loom.Step[[int], int]:
    @loom.step(id=name)
    async def effect(x: int) -> int:
        ledger().record(name)
        return x + 1

    return effect


FIVE_STEPS = [_make_step(f"step-{i}") for i in range(1, 6)]


@loom.flow(id="five-steps", version="1")
async def five_steps(ctx: loom.WorkflowContext, start: int) -> int:
    value = start
    for step in FIVE_STEPS:
        value = await ctx.run(step, value)
    return value


@loom.step(id="inspect")
async def inspect_table(table: TableRef) -> Stats:
    return Stats(rows=len(table.name) * 1000, locks=1)


@loom.step(id="assess-risk")
def assess_risk(stats: Stats) -> str:
    return "high" if stats.rows > 5000 else "low"


@loom.step(id="apply")
async def apply_ddl(ddl: str) -> str:
    return f"applied: {ddl}"


@loom.flow(id="migration-guard", version="1", resume_schemas={"ApprovalGranted": ApprovalDecision})
async def migration_guard(ctx: loom.WorkflowContext, inp: MigrationInput) -> dict[str, str]:
    stats = await ctx.run(inspect_table, TableRef(name=inp.table))
    risk = await ctx.run(assess_risk, stats)
    ctx.ui.set("phase", "awaiting-approval")
    decision = await ctx.suspend(
        "ApprovalGranted", correlation_key=inp.table, timeout=timedelta(hours=24)
    )
    if not decision.approved:
        ctx.ui.set("phase", "rejected")
        return {"status": "rejected", "risk": risk}
    result = await ctx.run(apply_ddl, inp.ddl)
    ctx.ui.set("phase", "done")
    return {"status": result, "risk": risk, "approved_by": decision.approved_by}
