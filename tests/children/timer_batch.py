"""`python -m tests.children.timer_batch DB LEDGER [recover]`: one TimerService over a SQLite
file whose executions sleep, then (half of them) run a step.

Each step's effect appends (execution id, the holder's fence, pid, whether that holder's
take-over is committed in DB at that instant) to LEDGER (its own SQLite file,
synchronous=FULL) in a commit of its own, so a SIGKILL right after it keeps the row. The
service fires every due timer in batches (claims with a short lease, so the timers a killed
process claimed are handed out again soon) until no timer is left; with ``recover`` it first
recovers every running execution (a killed process may have left some with their take-over
written and nobody driving them), and waits for every woken execution to settle. Prints
``done`` at the end. Armed faults (LOOM_FAULTS) kill
it on the way.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys

import loom
from loom.model import ExecutionState, ExecutionStatus
from loom.storage import ExecutionQuery
from tests.support.poll import until

DB = LEDGER = ""


def record_effect(execution_id: str) -> None:
    """The effect: one ledger row, with whether this holder's take-over (its TIMER_FIRED, or a
    recovery's EXECUTION_RECOVERED: the first event at its fence) is committed in the store at
    this instant (read by a connection of its own, which sees only commits)."""
    info = loom.current_step()
    assert info is not None
    with sqlite3.connect(DB, timeout=30) as db:
        durable = db.execute(
            "SELECT count(*) > 0 FROM loom_events WHERE execution_id = ? AND fence = ?",
            (execution_id, info.fence),
        ).fetchone()[0]
    with sqlite3.connect(LEDGER, timeout=30) as conn:
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS effects (execution_id TEXT, fence INTEGER, pid INTEGER,"
            " durable INTEGER)"
        )
        conn.execute(
            "INSERT INTO effects VALUES (?, ?, ?, ?)",
            (execution_id, info.fence, os.getpid(), durable),
        )


@loom.step(id="touch")
async def touch(execution_id: str) -> str:
    record_effect(execution_id)
    return execution_id


@loom.flow(id="batch-nap", version="1")
async def batch_nap(ctx: loom.WorkflowContext, args: dict[str, object]) -> str:
    await ctx.sleep_until(float(args["when"]))  # type: ignore[arg-type]
    if args["step"]:
        return await ctx.run(touch, ctx.execution_id)
    return "woke"


def _running(state: ExecutionState) -> bool:
    return state.status is ExecutionStatus.RUNNING


async def main(db: str, ledger: str, recover: bool) -> None:
    global DB, LEDGER
    DB, LEDGER = db, ledger
    store = loom.SQLiteStore(db)
    runtime = loom.WorkflowRuntime(store, timers=False)
    runtime.register(batch_nap)
    if recover:
        await loom.recover_abandoned(runtime, is_abandoned=_running)
    service = runtime.timers
    assert service is not None
    service.batch, service.lease = 50, 1.0

    async def all_fired() -> bool:
        await service.run_due()
        return await store.next_timer_due() is None

    await until(all_fired, "every timer fired", timeout=60)
    # A fired timer's flow runs on (a step, its completion) in its own task: closing now would
    # stop it at its next write, left running for a later recovery, which is not this test's.
    running = ExecutionQuery(statuses=[ExecutionStatus.RUNNING])

    async def all_settled() -> bool:
        return await store.count_executions(running) == 0

    await until(all_settled, "every woken execution settled", timeout=60)
    await runtime.close()
    await store.close()
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "recover"))
