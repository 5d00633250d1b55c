"""runtime.promote moves the ref (compare-and-swap) before it closes the parent's gate: a
promotion whose CAS loses leaves the parent untouched and approvable, and one that stopped
between the ref's move and the gate's close is completed by running it again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import GateSupersededError, PromotionConflictError
from loom.model import ExecutionStatus
from loom.storage import SQLiteStore
from tests.branching.flows import guarded


async def _setup(tmp_path: Path) -> tuple[loom.WorkflowRuntime, SQLiteStore, int]:
    store = SQLiteStore(tmp_path / "p.db")
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(guarded)
    handle = await rt.start(guarded, 1, execution_id="parent-1")
    gate = (await handle.wait_for_suspend(timeout=30)).last_sequence
    for name in ("a", "b"):
        await rt.fork("parent-1", gate, branch=f"sim/{name}", execution_id=f"b-{name}")
    await store.put_ref("main", "parent-1", gate)
    return rt, store, gate


async def test_a_promotion_that_loses_its_cas_leaves_the_parent_approvable(
    tmp_path: Path,
) -> None:
    rt, store, gate = await _setup(tmp_path)
    real = store.promote

    async def target_moves_first(from_ref: str, to_ref: str, **kw: Any) -> Any:
        # Another promoter moves "main" after this one checked it, before its CAS.
        await real("sim/b", "main", by="other")
        return await real(from_ref, to_ref, **kw)

    store.promote = target_moves_first  # type: ignore[method-assign]
    with pytest.raises(PromotionConflictError):
        await rt.promote("sim/a", "main", by="ann")
    store.promote = real  # type: ignore[method-assign]
    parent = await rt.load_state("parent-1")
    assert parent is not None and parent.status is ExecutionStatus.SUSPENDED
    assert parent.last_sequence == gate, "the losing promotion wrote on the parent"
    result = await (await rt.resume("parent-1", "Approve", {"plan": "p"})).result(timeout=30)
    assert result["out"] == "applied p"
    await rt.close()
    await store.close()


async def test_a_promotion_stopped_after_the_ref_moved_completes_when_run_again(
    tmp_path: Path,
) -> None:
    rt, store, _ = await _setup(tmp_path)
    real = store.promote

    async def crash_after_cas(from_ref: str, to_ref: str, **kw: Any) -> Any:
        await real(from_ref, to_ref, **kw)
        raise ConnectionError("the promoter died after the ref moved")

    store.promote = crash_after_cas  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await rt.promote("sim/a", "main", by="ann")
    store.promote = real  # type: ignore[method-assign]
    main = await store.get_ref("main")
    assert main is not None and main.execution_id == "b-a"
    # Half done: the ref moved, the gate is still open. Running it again completes it.
    moved = await rt.promote("sim/a", "main", by="ann")
    assert moved.execution_id == "b-a"
    with pytest.raises(GateSupersededError) as info:
        await rt.resume("parent-1", "Approve", {"plan": "x"})
    assert info.value.superseded_by == "b-a"
    parent = await rt.load_state("parent-1")
    assert parent is not None and parent.status is ExecutionStatus.CANCELLED
    # Once more is a no-op on the parent: one supersession recorded.
    await rt.promote("sim/a", "main", by="ann")
    log = await store.read("parent-1")
    assert sum(e.type == "branches.gate_superseded" for e in log) == 1
    # The other branch of that gate cannot take it.
    with pytest.raises(PromotionConflictError):
        await rt.promote("sim/b", "main", by="bob")
    await rt.close()
    await store.close()
