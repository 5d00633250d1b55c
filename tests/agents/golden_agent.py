"""The agent of the recorded agent logs in tests/agents/golden/: two turns of tools (one behind
an approval with quorum 2) and a final answer, priced so budgets account its cost. Written by
`python -m tests.agents.make_golden` (with the Loom that wrote the logs on PYTHONPATH)."""

from __future__ import annotations

from typing import Any

import loom
from loom.llm import ScriptedProvider, Usage, reply, tool_calls

PRICE = loom.Price(input_per_mtok=3.0, output_per_mtok=15.0)


@loom.tool
def stock(sku: str) -> dict[str, Any]:
    """How many of a product are in stock."""
    return {"sku": sku, "in_stock": 3}


@loom.tool(requires_approval=loom.ApprovalPolicy(approvers=["alice", "bob"], quorum=2))
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    return f"refunded {amount} on {order}"


def script() -> list[Any]:
    used = Usage(input_tokens=120, output_tokens=30)
    first = tool_calls(("stock", {"sku": "A"}), ("stock", {"sku": "B"}))
    second = tool_calls(("refund", {"order": "o-7", "amount": 20}))
    last = reply("Both in stock; o-7 refunded.")
    return [
        type(r)(r.message, r.stop_reason, used, r.model, r.provider, r.response_id)
        for r in (first, second, last)
    ]


def make_agent(provider: ScriptedProvider | None = None) -> loom.Agent:
    return loom.agent(
        id="golden-support",
        provider=provider or ScriptedProvider(script(), by_turn=True),
        model="scripted",
        instructions="Check stock, refund when asked.",
        tools=[stock, refund],
        budget=loom.Budget(max_cost=1.0, prices={"scripted": PRICE}),
    )
