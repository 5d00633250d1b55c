"""Child executions: ctx.call / ctx.start_child / ctx.fan_out, durable waits, cancellation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic

import loom
from loom.errors import ChildFailedError, ConfigurationError, InvalidInputError
from loom.model import ExecutionStatus
from loom.storage import ExecutionQuery, SQLiteStore

CALLS: dict[str, int] = {}


@loom.step(id="double")
async def double(n: int) -> int:
    key = loom.current_step().execution_id
    CALLS[key] = CALLS.get(key, 0) + 1
    return n * 2


@loom.flow(id="leaf", version="1")
async def leaf(ctx: loom.WorkflowContext, n: int) -> int:
    if n < 0:
        raise ValueError(f"negative {n}")
    return await ctx.run(double, n)


@loom.flow(id="gated-leaf", version="1")
async def gated_leaf(ctx: loom.WorkflowContext, n: int) -> int:
    extra = await ctx.suspend("Bonus")
    return n + int(extra)


class Pair(pydantic.BaseModel):
    a: int
    b: int


@loom.flow(id="typed-leaf", version="1")
async def typed_leaf(ctx: loom.WorkflowContext, p: Pair) -> Pair:
    return Pair(a=p.b, b=p.a)


@loom.flow(id="caller", version="1")
async def caller(ctx: loom.WorkflowContext, n: int) -> dict[str, Any]:
    one = await ctx.call(leaf, n)
    handles = [ctx.start_child(gated_leaf, i) for i in range(3)]
    gated = [await h for h in handles]
    swapped = await ctx.call(typed_leaf, Pair(a=1, b=2))
    return {"one": one, "gated": gated, "swapped": swapped.model_dump()}


async def _settled_at(rt: loom.WorkflowRuntime, eid: str, gate: str) -> Any:
    """The execution's state once it is suspended at ``gate`` (it may wait elsewhere first)."""
    while True:
        state = await rt.wait(eid, until="settled", timeout=30)
        if state.waiting is not None and state.waiting.event_type == gate:
            return state
        await rt.store.wait_for_append(eid, state.last_sequence, timeout=30)


async def test_call_start_child_and_order(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(caller, leaf, gated_leaf, typed_leaf)
        handle = await rt.start(caller, 5, execution_id="p")
        parent = await _settled_at(rt, "p", "loom.child:p.2")
        # The parent waits durably on its first gated child, holding nothing.
        assert parent.status is ExecutionStatus.SUSPENDED
        # Ids derive from the parent's id and the position: call() took 0 (start) and 1 (wait).
        assert parent.waiting is not None and parent.waiting.event_type == "loom.child:p.2"
        for cid in ("p.2", "p.3", "p.4"):
            await rt.wait(cid, until="settled", timeout=30)
        # Children answered in reverse order: results still come back in the order asked.
        for i, cid in reversed(list(enumerate(("p.2", "p.3", "p.4")))):
            await rt.resume(cid, "Bonus", 100 * (i + 1))
        done = await rt.wait("p", timeout=30)
        assert done.status is ExecutionStatus.COMPLETED, done.error
        assert done.output == {"one": 10, "gated": [100, 201, 302], "swapped": {"a": 2, "b": 1}}
        assert (await handle.result(timeout=5))["one"] == 10
        kids = [s async for s in rt.executions(ExecutionQuery(parent_id="p"))]
        assert sorted(k.execution_id for k in kids) == ["p.0", "p.2", "p.3", "p.4", "p.8"]
        assert CALLS["p.0"] == 1


@loom.flow(id="fails-child", version="1")
async def fails_child(ctx: loom.WorkflowContext) -> str:
    try:
        await ctx.call(leaf, -1)
    except ChildFailedError as exc:
        return f"{exc.child_id}:{exc.status}:{(exc.error or {}).get('type')}"
    return "no error"


async def test_child_failure_is_typed_in_parent(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        await rt.start(fails_child, execution_id="f")
        state = await rt.wait("f", timeout=30)
        assert state.output == "f.0:failed:ValueError"


@loom.flow(id="fan", version="1")
async def fan(ctx: loom.WorkflowContext, n: int) -> list[int]:
    results = await ctx.fan_out([(leaf, i) for i in range(n)])
    return list(results)


async def test_fan_out_each_branch_its_own_execution(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(leaf)
        await rt.start(fan, 6, execution_id="fan-1")
        state = await rt.wait("fan-1", timeout=60)
        assert state.output == [0, 2, 4, 6, 8, 10]
        for i in range(6):
            child = await rt.load_state(f"fan-1.{i}")
            assert child is not None and child.metadata["loom.parent_id"] == "fan-1"
            assert CALLS[f"fan-1.{i}"] == 1


@loom.flow(id="holds-children", version="1")
async def holds_children(ctx: loom.WorkflowContext) -> list[int]:
    hs = [ctx.start_child(gated_leaf, i) for i in range(2)]
    return [await h for h in hs]


async def test_cancel_parent_cancels_running_children(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(gated_leaf)
        await rt.start(holds_children, execution_id="h")
        await rt.wait("h", until="settled", timeout=30)
        for cid in ("h.0", "h.1"):
            await rt.wait(cid, until="settled", timeout=30)
        await rt.resume("h.0", "Bonus", 1)  # one child ended before the cancel
        assert (await rt.wait("h.0", timeout=30)).status is ExecutionStatus.COMPLETED
        await rt.cancel("h", reason="operator")
        assert (await rt.wait("h", timeout=30)).status is ExecutionStatus.CANCELLED
        other = await rt.wait("h.1", timeout=30)
        assert other.status is ExecutionStatus.CANCELLED
        assert "parent 'h' was cancelled" in str(other.cancel_reason)
        assert (await rt.load_state("h.0")).status is ExecutionStatus.COMPLETED  # type: ignore[union-attr]


@loom.flow(id="bad-input", version="1")
async def bad_input(ctx: loom.WorkflowContext, what: str) -> str:
    try:
        if what == "input":
            await ctx.call(typed_leaf, {"a": "x"})
        elif what == "flow":
            await ctx.call(42, 1)  # type: ignore[arg-type]
        elif what == "taken":
            await ctx.call(leaf, 1, execution_id="someone-else")
    except (InvalidInputError, ConfigurationError, loom.ExecutionAlreadyExistsError) as exc:
        return f"{type(exc).__name__}|{exc.execution_id}"
    return "accepted"


async def test_bad_child_input_is_a_typed_error_with_ids(db_path: Path) -> None:
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as rt:
        rt.register(leaf, typed_leaf)
        await rt.start(leaf, 3, execution_id="someone-else")
        await rt.wait("someone-else", timeout=30)
        for what, expected in (
            ("input", "InvalidInputError|b-input.0"),
            ("flow", "ConfigurationError|b-flow"),
            ("taken", "ExecutionAlreadyExistsError|b-taken"),
        ):
            await rt.start(bad_input, what, execution_id=f"b-{what}")
            state = await rt.wait(f"b-{what}", timeout=30)
            assert state.output == expected, state.error
        # Nothing was started for the refused input.
        assert await rt.load_state("b-input.0") is None
        assert (await rt.load_state("someone-else")).output == 6  # type: ignore[union-attr]


async def test_children_wake_parent_across_runtimes(db_path: Path) -> None:
    """The child's end wakes a parent whose runtime is gone: the parent resumes where the
    child finished (here a second runtime over the same file)."""
    first = loom.WorkflowRuntime(store=SQLiteStore(db_path))
    first.register(holds_children, gated_leaf)
    await first.start(holds_children, execution_id="x")
    await first.wait("x", until="settled", timeout=30)
    for cid in ("x.0", "x.1"):
        await first.wait(cid, until="settled", timeout=30)
    await first.close()
    async with loom.WorkflowRuntime(store=SQLiteStore(db_path)) as second:
        second.register(holds_children, gated_leaf)
        await second.resume("x.1", "Bonus", 10)
        await second.resume("x.0", "Bonus", 20)
        state = await second.wait("x", timeout=30)
        assert state.output == [20, 11]
