"""A bus task (a parent flow) whose fanned-out child ends but whose process is SIGKILLed
before the child's outcome reaches the waiting parent, for tests/orchestration.

    python -m tests.children.bus_lost_child MODE DIR PARENT_ID

MODE ``start`` sends the parent task through an InProcessA2ABus; the second child waits until
the parent is durably suspended on it, ends, and the process kills itself (SIGKILL) as the
child is about to tell its parent. MODE ``recover`` is the restarted process: ``bus.recover``,
then it waits for the task and prints ``{"claimed": [...], "status": ..., "output": ...}``.
The effect ledger is DIR/ledger: one line per effect run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import loom
from loom.model import ExecutionState, ExecutionStatus
from loom.orchestration import InProcessA2ABus
from loom.runtime import _children
from loom.storage import SQLiteStore
from tests.support.poll import until

DIR = Path(".")
RT: loom.WorkflowRuntime | None = None


def ledger(entry: str) -> None:
    fd = os.open(DIR / "ledger", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{entry}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@loom.step(id="lost-probe")
async def probe(n: int) -> int:
    me = loom.current_step().execution_id
    if n == 1:
        # End only once the parent waits on this child durably: its outcome must then come
        # by message (the one the SIGKILL below loses), not by the parent reading the store.
        assert RT is not None
        rt, parent = RT, me.rsplit(".", 1)[0]

        async def parent_waits() -> bool:
            state = await rt.load_state(parent)
            gate = None if state is None else state.waiting
            return (
                state is not None
                and state.status is ExecutionStatus.SUSPENDED
                and gate is not None
                and gate.event_type == f"{_children.CHILD_GATE_PREFIX}{me}"
            )

        await until(parent_waits, "the parent to wait on the second child", timeout=30)
    ledger(me)
    return n * 10


@loom.flow(id="lost-investigator", version="1")
async def investigator(ctx: loom.WorkflowContext, n: int) -> int:
    return await ctx.run(probe, n)


@loom.step(id="lost-summary")
async def summary(values: list[int]) -> int:
    ledger(f"{loom.current_step().execution_id}:summary")
    return sum(values)


@loom.flow(id="lost-commander", version="1")
async def commander(ctx: loom.WorkflowContext, k: int) -> int:
    values = await ctx.fan_out([(investigator, i) for i in range(k)])
    return await ctx.run(summary, values)


def kill_before_telling(parent_id: str) -> None:
    """SIGKILL this process when the second child, having ended, is about to tell its parent."""
    told = _children.notify_parent

    async def notify(rt: loom.WorkflowRuntime, state: ExecutionState) -> None:
        if state.execution_id.startswith(parent_id) and state.execution_id.endswith(".1"):
            os.kill(os.getpid(), signal.SIGKILL)
        await told(rt, state)

    _children.notify_parent = notify  # type: ignore[assignment]


async def main(mode: str, parent_id: str) -> None:
    global RT
    RT = rt = loom.WorkflowRuntime(store=SQLiteStore(DIR / "loom.db"))
    rt.register(investigator)
    bus = InProcessA2ABus(rt)
    bus.register(commander)
    out: dict[str, Any] = {}
    try:
        if mode == "start":
            kill_before_telling(parent_id)
            await bus.send("lost-commander", 2, task_id=parent_id)
            out["unexpected"] = "the process was not killed"
        else:
            out["claimed"] = await bus.recover(is_abandoned=lambda state: True)
            task = await bus.wait(parent_id, timeout=30)
            state = await rt.load_state(parent_id)
            assert state is not None
            out.update(task=task.state.value, status=state.status.value, output=state.output)
        print(json.dumps(out))
    finally:
        await rt.close()


if __name__ == "__main__":
    DIR = Path(sys.argv[2])
    asyncio.run(main(sys.argv[1], sys.argv[3]))
