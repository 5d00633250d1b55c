"""One side of a promotion race on PostgreSQL:
``python -m tests.children.promoter store|runtime DSN SCHEMA BRANCH``.

Prints ``ready`` once connected, promotes BRANCH to ``main`` when a line arrives on stdin (both
racers are told at once), then prints ``{"won": execution_id}`` or ``{"lost": ...}``. ``store``
promotes with ``store.promote`` (the BranchRegistry race, the lost line names the ref);
``runtime`` with ``runtime.promote`` (branches of one gate).
"""

from __future__ import annotations

import asyncio
import json
import sys

import loom
from loom.errors import PromotionConflictError
from loom.storage.postgres import PostgresStore


async def by_store(dsn: str, schema: str, branch: str) -> None:
    store = await PostgresStore.open(dsn, schema=schema)
    try:
        print("ready", flush=True)
        sys.stdin.readline()  # both processes promote once the test says go
        try:
            ref = await store.promote(branch, "main", by=branch)
            print(json.dumps({"won": ref.execution_id}), flush=True)
        except PromotionConflictError as exc:
            print(json.dumps({"lost": type(exc).__name__, "ref": exc.ref}), flush=True)
    finally:
        await store.close()


async def by_runtime(dsn: str, schema: str, ref: str) -> None:
    rt = loom.WorkflowRuntime(await PostgresStore.open(dsn, schema=schema), timers=False)
    try:
        print("ready", flush=True)
        sys.stdin.readline()
        try:
            moved = await rt.promote(ref, "main", by=ref)
            print(json.dumps({"won": moved.execution_id}), flush=True)
        except PromotionConflictError as exc:
            print(json.dumps({"lost": type(exc).__name__}), flush=True)
    finally:
        await rt.close()


if __name__ == "__main__":
    mode, dsn, schema, branch = sys.argv[1:5]
    asyncio.run((by_store if mode == "store" else by_runtime)(dsn, schema, branch))
