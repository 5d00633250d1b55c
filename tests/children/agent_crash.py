"""A child process for the agent crash tests: `python -m tests.children.agent_crash MODE DB EID`.

MODE is `start` (start the support agent), `recover` (continue it after a kill) or `vote`
(approve its refund as alice). Each runs until the execution ends or waits for a vote, then
prints the state as JSON. Faults come from LOOM_FAULTS, the ledger from LOOM_TEST_LEDGER.
"""

from __future__ import annotations

import asyncio
import json
import sys

import loom
from loom.agents import vote
from tests.support.agent_app import SUPPORT

PROMPT = "Check A and B, refund o-7."


async def main(mode: str, db: str, execution_id: str) -> None:
    runtime = loom.WorkflowRuntime(loom.SQLiteStore(db), snapshot_every=4, timers=False)
    runtime.register(SUPPORT)
    try:
        if mode == "start":
            handle = await runtime.start(SUPPORT, PROMPT, execution_id=execution_id)
        elif mode == "recover":
            handle = await runtime.recover(execution_id)
        else:
            handle = await vote(runtime, execution_id, by="alice")
        state = await handle.settled(timeout=60)
        print(json.dumps({"status": state.status.value, "output": state.output}))
    finally:
        await runtime.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
