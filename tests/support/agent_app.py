"""The agent the crash, CLI and multi-process tests run: three turns, two plain tools and one
behind an approval, on a ScriptedProvider answering by turn (so any process gets the same
answers). Model calls and tool effects are counted in the effect ledger (LOOM_TEST_LEDGER)."""

from __future__ import annotations

import os
from typing import Any

import loom
from loom.llm import CompletionRequest, ScriptedProvider, reply, tool_calls
from tests.support.flows import EffectLedger


def _ledger() -> EffectLedger | None:
    path = os.environ.get("LOOM_TEST_LEDGER")
    return EffectLedger(path) if path else None


def _count_model_call(request: CompletionRequest) -> None:
    ledger = _ledger()
    if ledger is not None:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        ledger.record(f"model:turn-{turn}")


@loom.tool
def inventory(sku: str) -> dict[str, Any]:
    """How many of a product are in stock."""
    ledger = _ledger()
    if ledger is not None:
        ledger.record(f"inventory:{sku}")
    return {"sku": sku, "in_stock": 3}


@loom.tool(requires_approval=loom.ApprovalPolicy(approvers=["alice", "bob"]))
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    ledger = _ledger()
    if ledger is not None:
        ledger.record(f"refund:{order}")
    return f"refunded {amount} on {order}"


PROVIDER = ScriptedProvider(
    [
        tool_calls(("inventory", {"sku": "A"}), ("inventory", {"sku": "B"})),
        tool_calls(("refund", {"order": "o-7", "amount": 20})),
        reply("Both in stock; o-7 refunded."),
    ],
    by_turn=True,
    on_call=_count_model_call,
)

SUPPORT = loom.agent(
    id="support",
    provider=PROVIDER,
    model="scripted",
    instructions="Check stock, refund when asked.",
    tools=[inventory, refund],
)

AGENTS = [SUPPORT]
