"""A child process for crash tests: `python -m tests.children.crash MODE DB EXECUTION_ID`.

MODE is `start` (start the five-step flow and run it to the end) or `recover` (continue it with
runtime.recover). Faults come from LOOM_FAULTS, the effect ledger from LOOM_TEST_LEDGER.
"""

from __future__ import annotations

import asyncio
import json
import sys

import loom
from tests.support.flows import five_steps


async def main(mode: str, db: str, execution_id: str) -> None:
    runtime = loom.WorkflowRuntime(loom.SQLiteStore(db), snapshot_every=3)
    runtime.register(five_steps)
    try:
        if mode == "start":
            handle = await runtime.start(five_steps, 1, execution_id=execution_id)
        else:
            handle = await runtime.recover(execution_id)
        result = await handle.result(timeout=60)
        print(json.dumps({"result": result}))
    finally:
        await runtime.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
