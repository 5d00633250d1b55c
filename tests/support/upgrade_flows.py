"""One flow in two revisions for the upgrade check: v2 swaps two steps in branch "a" only."""

from __future__ import annotations

from typing import Any

import pydantic

import loom

EFFECTS: list[str] = []


class Order(pydantic.BaseModel):
    kind: str


class Decision(pydantic.BaseModel):
    approved: bool
    approved_by: str


@loom.step(id="reserve")
async def reserve(kind: str) -> str:
    EFFECTS.append("reserve")
    return f"reserved-{kind}"


@loom.step(id="charge")
async def charge(kind: str) -> str:
    EFFECTS.append("charge")
    return f"charged-{kind}"


@loom.step(id="quote")
async def quote(kind: str) -> int:
    EFFECTS.append("quote")
    return 42


async def _v1(ctx: loom.WorkflowContext, order: Order) -> dict[str, Any]:
    if order.kind == "a":
        await ctx.run(reserve, order.kind)
        await ctx.run(charge, order.kind)
    else:
        await ctx.run(quote, order.kind)
    decision = await ctx.suspend("Approval")
    return {"approved": decision.approved}


async def _v2(ctx: loom.WorkflowContext, order: Order) -> dict[str, Any]:
    if order.kind == "a":
        await ctx.run(charge, order.kind)  # swapped: charge before reserve
        await ctx.run(reserve, order.kind)
    else:
        await ctx.run(quote, order.kind)
    decision = await ctx.suspend("Approval")
    return {"approved": decision.approved}


def _make(body: Any) -> loom.Flow[Any, Any]:
    return loom.flow(id="orders", version="1", resume_schemas={"Approval": Decision})(body)


orders_v1 = _make(_v1)
orders_v2 = _make(_v2)
FLOWS_V1 = [orders_v1]
FLOWS_V2 = [orders_v2]
