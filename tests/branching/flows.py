"""Flows the branching tests fork: two steps, an approval gate with a timeout, one effect."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

import loom

#: How many times each effect ran in this process (the oracle for "served from the log").
EFFECTS: Counter[str] = Counter()


@loom.step(id="prepare")
async def prepare(x: int) -> int:
    EFFECTS["prepare"] += 1
    return x + 1


@loom.step(id="apply")
async def apply_plan(plan: str) -> str:
    info = loom.current_step()
    EFFECTS[f"apply:{plan}"] += 1
    if info is not None and info.simulation:
        return f"would apply {plan}"
    return f"applied {plan}"


@loom.flow(id="guarded", version="1")
async def guarded(ctx: loom.WorkflowContext, n: int) -> dict[str, Any]:
    a = await ctx.run(prepare, n)
    b = await ctx.run(prepare, a)
    decision = await ctx.suspend("Approve", timeout=timedelta(hours=1))
    out = await ctx.run(apply_plan, str(decision["plan"]))
    return {"out": out, "prepared": b, "simulation": ctx.simulation}


#: Set by a test to let the slow step finish.
RELEASE: asyncio.Event | None = None


@loom.step(id="slow", record_start=True)
async def slow_step(x: int) -> int:
    assert RELEASE is not None
    await RELEASE.wait()
    return x


@loom.flow(id="slow-flow", version="1")
async def slow_flow(ctx: loom.WorkflowContext, n: int) -> int:
    return await ctx.run(slow_step, n)
