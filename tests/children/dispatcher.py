"""A dispatcher process that wedges mid-flight: `python -m tests.children.dispatcher DB EID`.

It dispatches the `orphanable` flow; step B blocks forever, so the parent can SIGKILL it with
the execution left running and no holder alive.
"""

from __future__ import annotations

import asyncio
import sys

import loom
from loom.placement import ExecutionPackage, LocalDispatcher, LocalWorkerRuntime
from tests.support.flows import ledger


@loom.step(id="orphan-a")
async def orphan_a() -> str:
    ledger().record("orphan-a")
    return "a"


@loom.step(id="orphan-b")
async def orphan_b() -> str:
    ledger().record("orphan-b")
    if loom.current_step() is not None and _WEDGE:
        await asyncio.Event().wait()  # wedged for good: only SIGKILL ends this process
    return "b"


@loom.flow(id="orphanable", version="1")
async def orphanable(ctx: loom.WorkflowContext) -> str:
    return await ctx.run(orphan_a) + await ctx.run(orphan_b)


_WEDGE = False


async def main(db: str, execution_id: str) -> None:
    global _WEDGE
    _WEDGE = True
    runtime = loom.WorkflowRuntime(loom.SQLiteStore(db))
    runtime.register(orphanable)
    dispatcher = LocalDispatcher(LocalWorkerRuntime(runtime), max_attempts=3)
    await dispatcher.dispatch(ExecutionPackage(execution_id=execution_id, flow_id="orphanable"))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
