"""`python -m tests.children.timer_service DSN SCHEMA`: one TimerService process over PostgreSQL.

It opens the store, prints ``ready`` and waits for a ``go`` line on stdin (the parent releases
every child at once: a barrier, no sleeps). It then fires due timers through a dispatcher (a
fenced wake per timer) until no timer is left in the database, and prints one JSON line: the
execution ids this process fired (``TimerService.fired``) and how many timers it claimed.
"""

from __future__ import annotations

import asyncio
import json
import sys

import loom
from loom.placement import LocalDispatcher, LocalWorkerRuntime, dispatching_timer_service
from loom.storage.postgres import PostgresStore
from tests.support.poll import until

#: How long a child keeps polling for timers another process still holds.
DEADLINE = 60.0


@loom.flow(id="nap-until", version="1")
async def nap_until(ctx: loom.WorkflowContext, when: float) -> str:
    await ctx.sleep_until(when)
    return "woke"


async def main(dsn: str, schema: str) -> None:
    store = await PostgresStore.open(dsn, schema=schema)
    runtime = loom.WorkflowRuntime(store, timers=False)
    runtime.register(nap_until)
    service = dispatching_timer_service(
        store, LocalDispatcher(LocalWorkerRuntime(runtime)), batch=25
    )
    print("ready", flush=True)
    go = await asyncio.to_thread(sys.stdin.readline)
    if go.strip() != "go":
        raise SystemExit(f"expected 'go', got {go!r}")
    claimed = 0

    async def all_fired() -> bool:
        # Fire what is due here; the rest are held by another process: poll its progress.
        nonlocal claimed
        claimed += await service.run_due()
        return await store.next_timer_due() is None

    await until(all_fired, "every timer fired here or in the other process", timeout=DEADLINE)
    print(json.dumps({"fired": [t.execution_id for t in service.fired], "claimed": claimed}))
    await runtime.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
