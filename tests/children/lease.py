"""A holder that can be frozen: `python -m tests.children.lease DB EXECUTION_ID RELEASE_FILE`.

It starts the `frozen` flow with a short lease; step `hold` records itself in the effect ledger
(LOOM_TEST_LEDGER) and waits until RELEASE_FILE exists, so the parent can SIGSTOP it mid-step,
recover the execution elsewhere, SIGCONT it and watch its late write be refused. It exits 3
when it was superseded (fenced out), 0 if it finished the execution itself.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import loom
from tests.support.flows import ledger

RELEASE: Path | None = None


@loom.step(id="before")
async def before() -> str:
    ledger().record("before")
    return "b"


@loom.step(id="hold")
async def hold() -> str:
    ledger().record("hold")
    while RELEASE is not None and not RELEASE.exists():
        await asyncio.sleep(0.02)
    return "h"


@loom.step(id="after")
async def after() -> str:
    ledger().record("after")
    return "a"


@loom.flow(id="frozen", version="1")
async def frozen(ctx: loom.WorkflowContext) -> str:
    return await ctx.run(before) + await ctx.run(hold) + await ctx.run(after)


async def main(db: str, execution_id: str, release: str) -> int:
    global RELEASE
    RELEASE = Path(release)
    runtime = loom.WorkflowRuntime(loom.SQLiteStore(db), lease_ttl=0.6)
    runtime.register(frozen)
    try:
        handle = await runtime.start(frozen, execution_id=execution_id)
        try:
            await handle.result(timeout=120)
        except loom.ExecutionSupersededError:
            return 3
        return 0
    finally:
        await runtime.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:4])))
