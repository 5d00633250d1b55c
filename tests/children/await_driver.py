"""Drives "remote-1" for another process to wait on:
``python -m tests.children.await_driver KIND WHERE SCHEMA GO`` (KIND ``sqlite``: WHERE is the
file; else WHERE is a PostgreSQL DSN and SCHEMA its schema).

Its one step waits until the file GO exists, so the parent sees the execution running and
decides when it ends; the parent creates GO or kills us, hence no deadline here.
"""

from __future__ import annotations

import asyncio
import os
import sys

import loom
from loom.storage import SQLiteStore
from loom.storage.postgres import PostgresStore

kind, where, schema, go = sys.argv[1:5]


@loom.step(id="wait-for-go")
async def wait_for_go() -> str:
    while not os.path.exists(go):
        await asyncio.sleep(0.02)  # a test fixture's gate: the parent releases or kills us
    return "went"


@loom.flow(id="remote", version="1")
async def remote(ctx: loom.WorkflowContext, n: int) -> dict[str, object]:
    said = await ctx.run(wait_for_go)
    return {"n": n, "said": said}


async def main() -> None:
    store = SQLiteStore(where) if kind == "sqlite" else PostgresStore(where, schema=schema)
    async with loom.WorkflowRuntime(store=store, timers=False) as rt:
        handle = await rt.start(remote, 7, execution_id="remote-1")
        await handle.wait_for_completion(timeout=60)


if __name__ == "__main__":
    asyncio.run(main())
