"""A child for the decision crash test: `python -m tests.children.decision DB DIR MODE`.

The policy appends a line to DIR/select.log every time it is consulted. The step after the
decision SIGKILLs this process the first time it runs (DIR/killed marks that it did), so the
decision is durable and nothing after it is. MODE is `start` or `recover`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import loom

DIR = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(".")


class CountingPolicy:
    id = "greedy"
    version = "1"

    def select(self, context: Any, actions: Sequence[Any]) -> tuple[Any, float]:
        with open(DIR / "select.log", "a") as f:
            f.write("select\n")
            f.flush()
            os.fsync(f.fileno())
        return actions[1], 0.8


@loom.step(id="serve")
async def serve(action: str) -> str:
    marker = DIR / "killed"
    if not marker.exists():
        marker.write_text("1")
        os.kill(os.getpid(), signal.SIGKILL)
    return f"served {action}"


@loom.flow(id="offer", version="1")
async def offer(ctx: loom.WorkflowContext, user: str) -> dict[str, Any]:
    action = await ctx.decide_with_policy(
        "offer", CountingPolicy(), {"user": user}, ["a", "b", "c"]
    )
    served = await ctx.run(serve, action)
    await ctx.record_outcome("click", 1.0)
    return {"action": action, "served": served}


async def main(db: str, mode: str) -> None:
    runtime = loom.WorkflowRuntime(loom.SQLiteStore(db))
    runtime.register(offer)
    try:
        if mode == "start":
            handle = await runtime.start(offer, "u1", execution_id="d1")
        else:
            handle = await runtime.recover("d1")
        print(json.dumps(await handle.result(timeout=60)))
    finally:
        await runtime.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[3]))
