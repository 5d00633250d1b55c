"""Flows for the child-execution tests over HTTP workers:
``--app tests.support.children_app:make_runtime`` (store from LOOM_TEST_STORE)."""

from __future__ import annotations

import os
from typing import Any

import loom
from tests.support.http_flows import store_from_spec


@loom.step(id="rc-where")
async def where(n: int) -> dict[str, int]:
    return {"n": n, "pid": os.getpid()}


@loom.flow(id="rc-leaf", version="1")
async def rc_leaf(ctx: loom.WorkflowContext, n: int) -> dict[str, int]:
    return await ctx.run(where, n)


@loom.flow(id="rc-parent", version="1")
async def rc_parent(ctx: loom.WorkflowContext, n: int) -> list[Any]:
    return list(await ctx.fan_out([(rc_leaf, i) for i in range(n)]))


FLOWS = (rc_leaf, rc_parent)


def make_runtime() -> loom.WorkflowRuntime:
    runtime = loom.WorkflowRuntime(store_from_spec(os.environ["LOOM_TEST_STORE"]))
    runtime.register(*FLOWS)
    return runtime
