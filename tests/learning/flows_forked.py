"""A flow that decides with a policy and scores it before a gate, then decides again after it:
what the fork-aware trajectory tests fork."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import loom


class Fixed:
    id, version = "fixed", "1"

    def __init__(self, action: str, propensity: float) -> None:
        self.action, self.propensity = action, propensity

    def select(self, context: Any, actions: Sequence[Any]) -> tuple[Any, float]:
        return self.action, self.propensity


@loom.flow(id="decide-gate-decide", version="1")
async def decide_gate_decide(ctx: loom.WorkflowContext, n: int) -> str:
    await ctx.decide_with_policy("first", Fixed("a", 0.5), {"n": n}, ["a", "b"])
    await ctx.record_outcome("click", 1.0)
    choice = await ctx.suspend("Choose")
    second = str(choice["arm"])
    await ctx.decide_with_policy("second", Fixed(second, 0.25), {"n": n}, ["a", "b", "c"])
    await ctx.record_outcome("click", float(choice["score"]))
    return second
