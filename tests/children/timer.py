"""`python -m tests.children.timer set|fire DB EID`: set a durable sleep and die, or fire it."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

import loom
from tests.support.flows import ledger


@loom.step(id="after-sleep")
async def after_sleep() -> str:
    ledger().record("after-sleep")
    return "woke"


@loom.flow(id="sleeper", version="1")
async def sleeper(ctx: loom.WorkflowContext) -> str:
    await ctx.sleep(timedelta(seconds=0.4))
    return await ctx.run(after_sleep)


async def main(mode: str, db: str, eid: str) -> None:
    runtime = loom.WorkflowRuntime(loom.SQLiteStore(db))
    runtime.register(sleeper)
    if mode == "set":
        # LOOM_FAULTS=after_suspend_recorded=kill kills this process once the sleep is durable.
        handle = await runtime.start(sleeper, execution_id=eid)
        await handle.settled(timeout=30)
        raise SystemExit("the fault should have killed this process")
    result = await runtime.handle(eid).result(timeout=30)  # the built-in timer loop fires it
    print(result)
    await runtime.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
