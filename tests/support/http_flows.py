"""Flows served by the HTTP worker processes of the end-to-end tests.

Worker processes load them with ``--app tests.support.http_flows:make_runtime``; the environment says
where the store is and how the steps behave:

* ``LOOM_TEST_STORE``: ``sqlite:<path>`` or ``postgres:<schema>:<dsn>`` (one store for all
  processes of a test);
* ``LOOM_TEST_LEDGER``: the effect ledger (tests.support.flows.EffectLedger), the oracle for "ran N times";
* ``LOOM_TEST_HOLD_DIR``: when set, the ``hold`` step records its effect and then waits until
  ``<dir>/release-all``, ``<dir>/release-<execution id>`` or ``<dir>/release-<id>@<pid>`` (this
  process only) exists: the parent sees the effect in the ledger, knows the process is inside
  the step, and kills it (or releases it).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pydantic

import loom
from loom.storage import SQLiteStore, Store
from tests.support.flows import ledger


def store_from_spec(spec: str) -> Store:
    kind, _, rest = spec.partition(":")
    if kind == "sqlite":
        return SQLiteStore(rest)
    if kind == "postgres":
        from loom.storage.postgres import PostgresStore

        schema, _, dsn = rest.partition(":")
        # Several processes share the server: keep each one's pool small.
        return PostgresStore(dsn, schema=schema, pool_max=4)
    raise ValueError(f"unknown LOOM_TEST_STORE {spec!r}")


async def open_store(spec: str) -> Store:
    """The store, opened now (PostgreSQL fails fast when unreachable)."""
    store = store_from_spec(spec)
    if spec.startswith("postgres:"):
        await store.last_sequence("__open__")
    return store


def _released(execution_id: str) -> bool:
    hold_dir = os.environ.get("LOOM_TEST_HOLD_DIR")
    if not hold_dir:
        return True
    folder = Path(hold_dir)
    names = ["release-all", f"release-{execution_id}", f"release-{execution_id}@{os.getpid()}"]
    return any((folder / name).exists() for name in names)


@loom.step(id="first")
async def first(n: int) -> int:
    ledger().record("first")
    return n + 1


@loom.step(id="hold")
async def hold(n: int) -> int:
    ledger().record("hold")
    info = loom.current_step()
    assert info is not None
    while not _released(info.execution_id):
        await asyncio.sleep(0.02)  # a test fixture's gate: the parent kills or releases us
    return n + 1


@loom.step(id="last")
async def last(n: int) -> int:
    ledger().record("last")
    return n + 1


@loom.flow(id="held-three", version="1")
async def held_three(ctx: loom.WorkflowContext, n: int) -> int:
    """first -> hold -> last: the tests kill or race workers inside ``hold``."""
    return await ctx.run(last, await ctx.run(hold, await ctx.run(first, n)))


class Approval(pydantic.BaseModel):
    approved: bool
    by: str


@loom.step(id="pre")
async def pre(n: int) -> int:
    ledger().record("pre")
    return n * 2


@loom.step(id="post")
async def post(n: int) -> int:
    ledger().record("post")
    return n + 1


@loom.flow(id="gated", version="1", resume_schemas={"Approve": Approval})
async def gated(ctx: loom.WorkflowContext, n: int) -> dict[str, object]:
    """pre -> approval gate -> post: suspends on one worker, resumes on another."""
    doubled = await ctx.run(pre, n)
    decision = await ctx.suspend("Approve")
    if not decision.approved:
        return {"approved": False}
    return {"approved": True, "by": decision.by, "value": await ctx.run(post, doubled)}


FLOWS = [held_three, gated]


def make_runtime() -> loom.WorkflowRuntime:
    runtime = loom.WorkflowRuntime(store_from_spec(os.environ["LOOM_TEST_STORE"]))
    runtime.register(*FLOWS)
    return runtime
