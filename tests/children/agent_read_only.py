"""A child process for the read-only tool tests: `python -m tests.children.agent_read_only
MODE DB EID` with MODE `start` or `recover`. The agent reads three pages with a read-only tool
(one per turn), then answers; model calls (per turn) and page reads are counted in the effect
ledger (LOOM_TEST_LEDGER). Faults come from LOOM_FAULTS."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import loom
from loom.llm import CompletionRequest, ScriptedProvider, reply, tool_calls
from tests.support.flows import EffectLedger

FINAL = "Read pages 1, 2 and 3."


def _ledger() -> EffectLedger | None:
    path = os.environ.get("LOOM_TEST_LEDGER")
    return EffectLedger(path) if path else None


def _count_model_call(request: CompletionRequest) -> None:
    ledger = _ledger()
    if ledger is not None:
        turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        ledger.record(f"model:turn-{turn}")


@loom.tool(read_only=True)
def page(n: int) -> str:
    """Read page n."""
    ledger = _ledger()
    if ledger is not None:
        ledger.record(f"page:{n}")
    return f"page {n}"


def make_agent() -> loom.Agent:
    script: list[Any] = [tool_calls(("page", {"n": n})) for n in (1, 2, 3)]
    provider = ScriptedProvider([*script, reply(FINAL)], by_turn=True, on_call=_count_model_call)
    return loom.agent(id="pager", provider=provider, model="scripted", tools=[page])


async def main(mode: str, db: str, execution_id: str) -> None:
    agent = make_agent()
    runtime = loom.WorkflowRuntime(loom.SQLiteStore(db), timers=False)
    runtime.register(agent)
    try:
        if mode == "start":
            handle = await runtime.start(agent, "Read the pages.", execution_id=execution_id)
        else:
            handle = await runtime.recover(execution_id)
        state = await handle.settled(timeout=60)
        print(json.dumps({"status": state.status.value, "output": state.output}))
    finally:
        await runtime.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
