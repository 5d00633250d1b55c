"""`python -m tests.children.poison DB start|recover`: a poison execution whose step kills its
process on every attempt, beside a healthy one that the same processes must still finish."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import loom
from tests.support.poll import until

MODE = {"value": "start"}


def marker(name: str) -> Path:
    return Path(os.environ["LOOM_POISON_DIR"]) / name


async def wait_for(path: Path) -> None:
    await until(path.exists, f"{path} to appear", timeout=30)  # a fixture's cross-process gate


async def healthy_completed() -> None:
    """Wait (with a deadline) until the healthy execution's completion is durable."""
    store = loom.SQLiteStore(os.environ["LOOM_POISON_DB"])

    async def completed() -> bool:
        log = await store.read("healthy")
        if log and log[-1].type is loom.EventType.EXECUTION_COMPLETED:
            return True
        await store.wait_for_append("healthy", log[-1].sequence if log else -1, timeout=1)
        return False

    try:
        await until(completed, "the healthy execution to complete", timeout=30, every=0)
    finally:
        await store.close()


@loom.step(id="poison")
async def poison() -> None:
    # Kill the holder once the healthy execution is where this scenario needs it to be.
    if MODE["value"] == "start":
        await wait_for(marker("healthy-started"))
    else:
        await healthy_completed()
    os.kill(os.getpid(), signal.SIGKILL)


@loom.step(id="work")
async def work() -> str:
    if MODE["value"] == "start":
        marker("healthy-started").touch()
        await asyncio.Event().wait()  # left mid-step when the poison kills this process
    return "ok"


@loom.flow(id="poisoned", version="1")
async def poisoned(ctx: loom.WorkflowContext) -> None:
    await ctx.run(poison)


@loom.flow(id="healthy", version="1")
async def healthy(ctx: loom.WorkflowContext) -> str:
    return await ctx.run(work)


def runtime(db: str) -> loom.WorkflowRuntime:
    rt = loom.WorkflowRuntime(loom.SQLiteStore(db))
    rt.register(poisoned, healthy)
    return rt


async def main(db: str, mode: str) -> None:
    MODE["value"] = mode
    rt = runtime(db)
    if mode == "start":
        await rt.start(healthy, execution_id="healthy")
        await (await rt.start(poisoned, execution_id="poison")).settled(timeout=30)
    else:
        await loom.recover_abandoned(rt, is_abandoned=lambda s: True, timeout=30, max_recoveries=3)
    await rt.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
