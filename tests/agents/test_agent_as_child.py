"""An agent is a flow: a parent runs it as a child execution (ctx.call), its tool loop durable
in the child's own log, its approval gate waited on by the parent without holding a process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import loom
from loom.agents import vote
from loom.llm import ScriptedProvider, reply, tool_calls
from loom.model import ExecutionStatus
from loom.storage import SQLiteStore


@loom.tool
def stock(sku: str) -> int:
    """Units in stock."""
    return 3


@loom.tool(requires_approval=loom.ApprovalPolicy(approvers=["alice"]))
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    return f"refunded {amount} on {order}"


def make_agent() -> Any:
    model = ScriptedProvider(
        [
            tool_calls(("stock", {"sku": "A"})),
            tool_calls(("refund", {"order": "o-7", "amount": 20})),
            reply("Done."),
        ]
    )
    return loom.agent(
        id="child-support",
        provider=model,
        model="any",
        tools=[stock, refund],
        instructions="Check stock, refund when asked.",
    )


async def test_agent_runs_as_a_child_execution(db_path: Path) -> None:
    support = make_agent()

    @loom.flow(id="desk", version="1")
    async def desk(ctx: loom.WorkflowContext, ask: str) -> str:
        result = await ctx.call(support, ask)
        return str(result["output"])

    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(desk, support)
        await rt.start(desk, "Is A in stock? Refund o-7.", execution_id="desk-1")
        child = await rt.wait("desk-1.0", until="settled", timeout=30, missing_ok=True)
        assert child.status is ExecutionStatus.SUSPENDED  # the refund waits for alice
        parent = await rt.wait("desk-1", until="settled", timeout=30)
        assert parent.waiting is not None and parent.waiting.event_type == "loom.child:desk-1.0"
        await vote(rt, "desk-1.0", by="alice")
        done = await rt.wait("desk-1", timeout=30)
        assert done.status is ExecutionStatus.COMPLETED, done.error
        assert done.output == "Done."
