"""A process driving a parent flow with three children, for the SIGKILL crash tests.

    python -m tests.children.parent_with_children MODE KIND WHERE SCHEMA DIR PARENT_ID

MODE ``start`` starts the parent (LOOM_CHILD_CRASH picks where the process kills itself with
SIGKILL; LOOM_FAULTS may arm a fault point instead); ``recover`` recovers every abandoned
execution of the store and waits for the parent. The effect ledger is DIR/ledger: one line per
effect run, so a count above one is an effect that ran twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import loom
from loom.model import ExecutionState, OpStatus
from loom.storage import SQLiteStore, Store
from loom.storage.postgres import PostgresStore
from tests.support.poll import until

DIR = Path(".")
RT: loom.WorkflowRuntime | None = None
CRASH = os.environ.get("LOOM_CHILD_CRASH", "")


def ledger(entry: str) -> None:
    fd = os.open(DIR / "ledger", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{entry}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@loom.step(id="leaf-work")
async def leaf_work(n: int) -> int:
    me = loom.current_step().execution_id
    parent = me.rsplit(".", 1)[0]
    if CRASH == "children-running":
        # Every child is inside its effect (none recorded) when the process dies.
        (DIR / f"arrived-{n}").touch()

        async def all_arrived() -> bool:
            return all((DIR / f"arrived-{i}").exists() for i in range(3))

        await until(all_arrived, "all three children to arrive", timeout=30)
        if n == 0:
            kill()
        await asyncio.sleep(60)
    if CRASH == "one-finished" and n > 0:
        # Die once the first child ended and the parent took its outcome.
        assert RT is not None
        rt = RT

        async def first_taken() -> bool:
            state = await rt.load_state(parent)
            return state is not None and _gate_resolved(state, f"{parent}.1")

        await until(first_taken, "the parent to take the first child's outcome", timeout=30)
        if n == 1:
            kill()
        await asyncio.sleep(60)
    ledger(me)
    return n * 10


def _gate_resolved(state: ExecutionState, child_id: str) -> bool:
    return any(
        op.kind == "gate" and op.name == f"loom.child:{child_id}" and op.status is OpStatus.RESOLVED
        for op in state.ops.values()
    )


@loom.flow(id="crash-leaf", version="1")
async def crash_leaf(ctx: loom.WorkflowContext, n: int) -> int:
    return await ctx.run(leaf_work, n)


@loom.step(id="parent-prep")
async def parent_prep() -> str:
    ledger(f"{loom.current_step().execution_id}:prep")
    return "ready"


@loom.step(id="parent-total")
async def parent_total(values: list[int]) -> int:
    ledger(f"{loom.current_step().execution_id}:total")
    return sum(values)


@loom.flow(id="crash-parent", version="1")
async def crash_parent(ctx: loom.WorkflowContext) -> int:
    await ctx.run(parent_prep)
    handles = [ctx.start_child(crash_leaf, i) for i in range(3)]
    values = [await h for h in handles]
    return await ctx.run(parent_total, values)


def open_store(kind: str, where: str, schema: str) -> Store:
    if kind == "sqlite":
        return SQLiteStore(where)
    return PostgresStore(where, schema=schema)


async def main(mode: str, kind: str, where: str, schema: str, parent_id: str) -> None:
    global RT
    RT = rt = loom.WorkflowRuntime(store=open_store(kind, where, schema), snapshot_every=4)
    rt.register(crash_parent, crash_leaf)
    try:
        if mode == "start":
            await rt.start(crash_parent, execution_id=parent_id)
        else:

            async def abandoned(state: ExecutionState) -> bool:
                return True  # the process that drove everything was SIGKILLed

            await loom.recover_abandoned(rt, is_abandoned=abandoned, wait=False)
        state = await rt.wait(parent_id, timeout=60)
        print(json.dumps({"status": state.status.value, "output": state.output}))
    finally:
        await rt.close()


if __name__ == "__main__":
    DIR = Path(sys.argv[5])
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[6]))
