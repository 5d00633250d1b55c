from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

import loom
from loom.model import EventType, ExecutionStatus
from loom.storage import SQLiteStore
from tests.children.dispatcher import orphanable
from tests.support.flows import EffectLedger
from tests.support.poll import until
from tests.support.proc import Child


async def test_finishes_what_a_killed_dispatcher_left_and_nothing_else(tmp_path: Path) -> None:
    db = tmp_path / "orphans.db"
    ledger_path = tmp_path / "effects.db"
    with Child("dispatcher", db, "orphan", env={"LOOM_TEST_LEDGER": str(ledger_path)}) as child:
        store = SQLiteStore(db)

        # Sequence 1 is step A's completion, and B's effect in the ledger says the child is
        # inside step B, wedged (A's completion alone: it may not have reached B yet).
        async def inside_b() -> bool:
            if await store.wait_for_append("orphan", 0, timeout=1) < 1:
                return False
            return EffectLedger(ledger_path).counts("orphan").get("orphan-b", 0) >= 1

        await until(inside_b, "the child inside step B", timeout=60)
        await store.close()
        assert child.kill() == -signal.SIGKILL

    os.environ["LOOM_TEST_LEDGER"] = str(ledger_path)
    runtime = loom.WorkflowRuntime(SQLiteStore(db))
    gate = asyncio.Event()

    @loom.step(id="blocked")
    async def blocked() -> str:
        await gate.wait()
        return "ok"

    @loom.flow(id="in-process", version="1")
    async def in_process(ctx: loom.WorkflowContext) -> str:
        return await ctx.run(blocked)

    runtime.register(orphanable, in_process)
    # Two more running executions: one live elsewhere (not claimed), one that settles between
    # enumeration and the pass acting on it.
    await runtime.start(in_process, execution_id="live-elsewhere")
    await runtime.start(in_process, execution_id="settling")
    live_log = None
    asked: list[str] = []

    async def is_abandoned(state: loom.ExecutionState) -> bool:
        nonlocal live_log
        asked.append(state.execution_id)
        if state.execution_id == "settling":
            await runtime.cancel("settling", reason="settled meanwhile")
            return True
        if state.execution_id == "live-elsewhere":
            live_log = await runtime.store.read("live-elsewhere")
            return False
        return state.execution_id == "orphan"

    report = await loom.recover_abandoned(runtime, is_abandoned=is_abandoned, timeout=30)
    assert sorted(asked) == ["live-elsewhere", "orphan", "settling"]
    assert report.recovered == ["orphan"]
    assert report.not_claimed == ["live-elsewhere"]
    assert report.settled == ["settling"]
    assert report.left == {}
    assert report.outcomes["orphan"].status is ExecutionStatus.COMPLETED
    assert report.outcomes["orphan"].output == "ab"
    # Step A committed before the kill and was not re-run; B was in flight and ran again.
    assert EffectLedger(ledger_path).counts("orphan") == {"orphan-a": 1, "orphan-b": 2}
    log = await runtime.store.read("orphan")
    assert [e.type for e in log].count(EventType.EXECUTION_STARTED) == 1
    assert [e.type for e in log].count(EventType.EXECUTION_RECOVERED) == 1
    # The unclaimed execution was not touched.
    assert await runtime.store.read("live-elsewhere") == live_log
    gate.set()
    await runtime.close()


async def test_is_abandoned_is_required() -> None:
    runtime = loom.WorkflowRuntime(loom.InMemoryStore())
    with pytest.raises(TypeError):
        await loom.recover_abandoned(runtime)  # type: ignore[call-arg]
    await runtime.close()


async def test_a_recovery_that_raises_is_left_for_the_next_pass() -> None:
    runtime = loom.WorkflowRuntime(loom.InMemoryStore())
    gate = asyncio.Event()

    @loom.step(id="wait")
    async def wait() -> None:
        await gate.wait()

    @loom.flow(id="gone", version="1")
    async def gone(ctx: loom.WorkflowContext) -> None:
        await ctx.run(wait)

    runtime.register(gone)
    await runtime.start(gone, execution_id="unknown-code")
    other = loom.WorkflowRuntime(runtime.store)  # a process that lacks the flow's code
    report = await loom.recover_abandoned(other, is_abandoned=lambda s: True)
    assert report.recovered == [] and list(report.left) == ["unknown-code"]
    assert isinstance(report.left["unknown-code"], loom.FlowNotFoundError)
    gate.set()
    await runtime.close()
