"""Child executions placed through a dispatcher, nested children, the in-memory store, and
the refusals that keep a parent's waits its children's alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import ChildFailedError, ExecutionAlreadyExistsError, NotWaitingError
from loom.model import ExecutionStatus
from loom.placement import LocalDispatcher, LocalWorkerRuntime
from loom.storage import InMemoryStore, SQLiteStore

PLACED: list[str] = []


class CountingDispatcher(LocalDispatcher):
    """LocalDispatcher that notes which packages it placed."""

    async def dispatch(self, package: Any) -> Any:
        PLACED.append(package.execution_id)
        return await super().dispatch(package)


@loom.step(id="p-square")
async def square(n: int) -> int:
    return n * n


@loom.flow(id="p-leaf", version="1")
async def p_leaf(ctx: loom.WorkflowContext, n: int) -> int:
    return await ctx.run(square, n)


@loom.flow(id="p-gated", version="1")
async def p_gated(ctx: loom.WorkflowContext, n: int) -> int:
    got = await ctx.suspend("Go")
    return n + int(got)


@loom.flow(id="p-middle", version="1")
async def p_middle(ctx: loom.WorkflowContext, n: int) -> list[int]:
    return list(await ctx.fan_out([(p_leaf, n), (p_leaf, n + 1)]))


@loom.flow(id="p-top", version="1")
async def p_top(ctx: loom.WorkflowContext, n: int) -> dict[str, Any]:
    nested = await ctx.call(p_middle, n)
    gated = await ctx.call(p_gated, n)
    return {"nested": nested, "gated": gated}


async def test_children_go_through_the_runtimes_dispatcher(db_path: Path) -> None:
    PLACED.clear()
    rt = loom.WorkflowRuntime(store=SQLiteStore(db_path))
    rt.dispatcher = CountingDispatcher(LocalWorkerRuntime(rt))
    async with rt:
        rt.register(p_top, p_middle, p_leaf, p_gated)
        await rt.start(p_top, 3, execution_id="top")
        await rt.wait("top.2", until="settled", timeout=30, missing_ok=True)
        await rt.resume("top.2", "Go", 10)
        done = await rt.wait("top", timeout=30)
        assert done.status is ExecutionStatus.COMPLETED, done.error
        assert done.output == {"nested": [9, 16], "gated": 13}
        # Every child (and grandchild) was placed through the dispatcher, once each.
        assert sorted(PLACED) == ["top.0", "top.0.0", "top.0.1", "top.2"]
        grandchild = await rt.load_state("top.0.1")
        assert grandchild is not None and grandchild.metadata["loom.parent_id"] == "top.0"


async def test_children_on_the_in_memory_store() -> None:
    async with loom.WorkflowRuntime(store=InMemoryStore()) as rt:
        rt.register(p_middle, p_leaf)
        await rt.start(p_middle, 5, execution_id="m")
        assert (await rt.wait("m", timeout=30)).output == [25, 36]


@loom.flow(id="p-waits", version="1")
async def p_waits(ctx: loom.WorkflowContext) -> int:
    return int(await ctx.call(p_gated, 1))


async def test_a_child_wait_is_answered_by_the_child_only(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(p_waits, p_gated)
        await rt.start(p_waits, execution_id="w")
        await rt.wait("w.0", until="settled", timeout=30, missing_ok=True)
        parent = await rt.wait("w", until="settled", timeout=30)
        before = parent.last_sequence
        with pytest.raises(NotWaitingError) as refused:
            await rt.resume("w", "loom.child:w.0", {"status": "completed", "output": 99})
        assert refused.value.execution_id == "w"
        with pytest.raises(NotWaitingError):
            await rt.send("w", "loom.child:w.0", {"status": "completed", "output": 99})
        after = await rt.load_state("w")
        assert after is not None and after.last_sequence == before  # nothing recorded
        await rt.resume("w.0", "Go", 1)
        assert (await rt.wait("w", timeout=30)).output == 2


@loom.flow(id="p-reuse", version="1")
async def p_reuse(ctx: loom.WorkflowContext) -> str:
    await ctx.call(p_leaf, 1, execution_id="fixed")
    try:
        await ctx.call(p_leaf, 2, execution_id="fixed")
    except ExecutionAlreadyExistsError as exc:
        return f"refused:{exc.execution_id}"
    return "reused"


@loom.flow(id="p-cancelled-child", version="1")
async def p_cancelled_child(ctx: loom.WorkflowContext) -> str:
    try:
        await ctx.call(p_gated, 1)
    except ChildFailedError as exc:
        return f"{exc.child_id}:{exc.status}:{exc.reason}"
    return "ended"


async def test_reused_child_id_and_cancelled_child(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(p_reuse, p_leaf, p_gated, p_cancelled_child)
        await rt.start(p_reuse, execution_id="r")
        assert (await rt.wait("r", timeout=30)).output == "refused:r"
        await rt.start(p_cancelled_child, execution_id="cc")
        await rt.wait("cc.0", until="settled", timeout=30, missing_ok=True)
        await rt.cancel("cc.0", reason="not needed")
        assert (await rt.wait("cc", timeout=30)).output == "cc.0:cancelled:not needed"


async def test_a_lost_child_message_is_caught_up_by_recovery(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child ends but its process dies before telling the parent (simulated: the
    notification is dropped). Recovery (recover, or a recover_abandoned pass) tells it."""
    from loom.runtime import _children

    async def lost(rt: Any, state: Any) -> None:
        return None

    async def never_abandoned(state: Any) -> bool:
        return False

    for how in ("recover", "recover_abandoned"):
        async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
            rt.register(p_waits, p_gated)
            eid = f"lost-{how}"
            await rt.start(p_waits, execution_id=eid)
            await rt.wait(f"{eid}.0", until="settled", timeout=30, missing_ok=True)
            parent = await rt.wait(eid, until="settled", timeout=30)
            assert parent.status is ExecutionStatus.SUSPENDED
            monkeypatch.setattr(_children, "notify_parent", lost)
            await rt.resume(f"{eid}.0", "Go", 5)
            assert (await rt.wait(f"{eid}.0", timeout=30)).output == 6
            monkeypatch.undo()
            stuck = await rt.load_state(eid)
            assert stuck is not None and stuck.status is ExecutionStatus.SUSPENDED
            if how == "recover":
                await rt.recover(eid)
            else:
                report = await loom.recover_abandoned(rt, is_abandoned=never_abandoned)
                assert report.recovered == []  # nothing was taken over
            assert (await rt.wait(eid, timeout=30)).output == 6


class RefusingDispatcher:
    """A dispatcher whose every placement fails before the child exists (no worker)."""

    async def dispatch(self, package: Any) -> Any:
        raise RuntimeError(f"no worker can take {package.execution_id}")

    async def cancel(self, execution_id: str) -> None:
        return None


@loom.flow(id="p-unplaced", version="1")
async def p_unplaced(ctx: loom.WorkflowContext) -> dict[str, Any]:
    try:
        await ctx.call(p_leaf, 2)
    except ChildFailedError as exc:
        return {"child": exc.child_id, "status": exc.status, "error": (exc.error or {}).get("type")}
    return {}


async def test_a_child_the_dispatcher_cannot_place_fails_in_the_parent(db_path: Path) -> None:
    async with loom.WorkflowRuntime(
        store=SQLiteStore(db_path), dispatcher=RefusingDispatcher()
    ) as rt:
        rt.register(p_unplaced, p_leaf)
        await rt.start(p_unplaced, execution_id="u")
        state = await rt.wait("u", timeout=30)
        assert state.output == {"child": "u.0", "status": "failed", "error": "RuntimeError"}
        assert await rt.load_state("u.0") is None  # nothing was started
