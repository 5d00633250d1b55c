"""bus.recover after a SIGKILL between a child's outcome and its message to the waiting parent:
the parent (a bus task suspended on that child) is told and completes, exactly once. Also the
same through a placement CONTINUE redispatch of such a parent."""

from __future__ import annotations

import collections
import json
import signal
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.model import ExecutionStatus, OpStatus
from loom.placement import ExecutionPackage, Intent, LocalDispatcher, LocalWorkerRuntime
from loom.runtime import _children
from loom.storage import SQLiteStore
from tests.support.proc import run_child


def _gate_takes(state: loom.model.ExecutionState, child_id: str) -> int:
    return sum(
        1
        for op in state.ops.values()
        if op.kind == "gate"
        and op.name == f"{_children.CHILD_GATE_PREFIX}{child_id}"
        and op.status is OpStatus.RESOLVED
    )


async def test_bus_recover_tells_a_parent_whose_child_ended_before_the_kill(
    tmp_path: Path,
) -> None:
    crashed = run_child("bus_lost_child", "start", tmp_path, "war")
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr[-3000:]
    async with loom.WorkflowRuntime(store=SQLiteStore(tmp_path / "loom.db")) as rt:
        parent = await rt.load_state("war")
        child = await rt.load_state("war.1")
        # The hang's exact setup: the child ended, the parent still waits on it.
        assert child is not None and child.status is ExecutionStatus.COMPLETED
        assert parent is not None and parent.status is ExecutionStatus.SUSPENDED
        assert parent.waiting is not None
        assert parent.waiting.event_type == f"{_children.CHILD_GATE_PREFIX}war.1"

    recovered = run_child("bus_lost_child", "recover", tmp_path, "war", timeout=90)
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    out = json.loads(recovered.stdout.strip().splitlines()[-1])
    assert out["claimed"] == ["war"]
    assert (out["task"], out["status"], out["output"]) == ("completed", "completed", 10)
    runs = collections.Counter((tmp_path / "ledger").read_text().split())
    assert runs == {"war.0": 1, "war.1": 1, "war:summary": 1}
    async with loom.WorkflowRuntime(store=SQLiteStore(tmp_path / "loom.db")) as rt:
        state = await rt.load_state("war")
        assert state is not None
        assert [_gate_takes(state, f"war.{i}") for i in range(2)] == [1, 1]


@loom.step(id="lc-step")
async def _lc_step(n: int) -> int:
    return n + 1


@loom.flow(id="lc-child", version="1")
async def lc_child(ctx: loom.WorkflowContext, n: int) -> int:
    got = int(await ctx.suspend("Go"))
    return await ctx.run(_lc_step, got + n)


@loom.flow(id="lc-parent", version="1")
async def lc_parent(ctx: loom.WorkflowContext) -> int:
    result: int = await ctx.start_child(lc_child, 1)
    return result


async def test_a_continue_redispatch_tells_a_parent_whose_child_ended_untold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dispatcher's CONTINUE of a suspended parent (a redispatch after its worker died)
    delivers the outcome of a child that ended without telling it, and the parent goes on."""

    async def lost(rt: Any, state: Any) -> None:
        return None

    async with loom.WorkflowRuntime(store=SQLiteStore(tmp_path / "loom.db")) as rt:
        rt.register(lc_parent, lc_child)
        await rt.start(lc_parent, execution_id="lc")
        await rt.wait("lc.0", until="settled", timeout=30, missing_ok=True)
        assert (await rt.wait("lc", until="settled", timeout=30)).status is (
            ExecutionStatus.SUSPENDED
        )
        monkeypatch.setattr(_children, "notify_parent", lost)
        await rt.resume("lc.0", "Go", 5)
        assert (await rt.wait("lc.0", timeout=30)).output == 7
        monkeypatch.undo()
        stuck = await rt.load_state("lc")
        assert stuck is not None and stuck.status is ExecutionStatus.SUSPENDED

        dispatcher = LocalDispatcher(LocalWorkerRuntime(rt))
        package = ExecutionPackage(
            execution_id="lc", flow_id="lc-parent", intent=Intent.CONTINUE, redispatch=True
        )
        result = await dispatcher.dispatch(package)
        final = await rt.wait("lc", timeout=30)
        assert final.output == 7
        assert result.folded.status in (ExecutionStatus.COMPLETED, ExecutionStatus.RUNNING)
        # A second redispatch changes nothing: the outcome was taken once.
        await dispatcher.dispatch(package)
        again = await rt.load_state("lc")
        assert again is not None and _gate_takes(again, "lc.0") == 1
        assert again.last_sequence == final.last_sequence


@loom.flow(id="ln-mid", version="1")
async def ln_mid(ctx: loom.WorkflowContext, n: int) -> int:
    result: int = await ctx.start_child(lc_child, n)
    return result * 10


@loom.flow(id="ln-top", version="1")
async def ln_top(ctx: loom.WorkflowContext) -> int:
    result: int = await ctx.start_child(ln_mid, 1)
    return result + 1


async def test_bus_recover_looks_down_a_chain_of_child_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bus task waits on a child (not a bus agent) that waits on a grandchild that ended
    untold: bus.recover claims the task, the grandchild's outcome reaches its parent, and the
    task completes."""
    from loom.orchestration import InProcessA2ABus

    async def lost(rt: Any, state: Any) -> None:
        return None

    async with loom.WorkflowRuntime(store=SQLiteStore(tmp_path / "loom.db")) as rt:
        rt.register(ln_mid, lc_child)
        bus = InProcessA2ABus(rt)
        bus.register(ln_top)
        await rt.start(ln_top, execution_id="ln")
        await rt.wait("ln.0.0", until="settled", timeout=30, missing_ok=True)
        await rt.wait("ln.0", until="settled", timeout=30, missing_ok=True)
        monkeypatch.setattr(_children, "notify_parent", lost)
        await rt.resume("ln.0.0", "Go", 5)
        assert (await rt.wait("ln.0.0", timeout=30)).output == 7
        monkeypatch.undo()
        for eid in ("ln", "ln.0"):
            stuck = await rt.load_state(eid)
            assert stuck is not None and stuck.status is ExecutionStatus.SUSPENDED

        assert await bus.recover(is_abandoned=lambda state: False) == ["ln"]
        assert (await bus.wait("ln", timeout=30)).state.value == "completed"
        done = await rt.load_state("ln")
        assert done is not None and done.output == 71
        # Nothing left to tell: a second pass claims nothing.
        assert await bus.recover(is_abandoned=lambda state: False) == []
