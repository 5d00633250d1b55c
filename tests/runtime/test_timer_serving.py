"""Explicit timer serving: runtime.start_timers / stop_timers and ``async with runtime.timers``."""

from __future__ import annotations

from pathlib import Path

import pytest

import loom
from loom.errors import ConfigurationError
from loom.model import ExecutionStatus


@loom.flow(id="napper")
async def napper(ctx: loom.WorkflowContext) -> str:
    await ctx.sleep(0)
    return "woke"


async def _sleeping(db: Path, execution_id: str) -> None:
    """Leave ``execution_id`` asleep with an overdue timer (nothing served it)."""
    async with loom.WorkflowRuntime(loom.SQLiteStore(db), timers=False) as rt:
        handle = await rt.start(napper, execution_id=execution_id)
        state = await handle.wait_for_suspend(timeout=10)
        assert state.status is ExecutionStatus.SUSPENDED
        assert rt.timers is not None and not rt.timers.running  # the opt-out holds


async def test_start_timers_serves_an_overdue_timer_and_stop_timers_stops(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    await _sleeping(db, "n1")
    rt = loom.WorkflowRuntime(loom.SQLiteStore(db), timers=False)
    rt.register(napper)
    service = rt.start_timers()
    assert service is rt.timers and service.running
    assert rt.start_timers() is service  # idempotent
    state = await rt.wait("n1", timeout=20)
    assert state.status is ExecutionStatus.COMPLETED and state.output == "woke"
    await rt.stop_timers()
    assert not service.running
    await rt.close()
    with pytest.raises(ConfigurationError):
        rt.start_timers()  # a closed runtime serves nothing


async def test_async_with_the_timer_service_serves_for_the_block(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    await _sleeping(db, "n2")
    rt = loom.WorkflowRuntime(loom.SQLiteStore(db), timers=False)
    rt.register(napper)
    assert rt.timers is not None
    async with rt.timers as service:
        assert service.running
        state = await rt.wait("n2", timeout=20)
        assert state.output == "woke"
    assert not rt.timers.running
    await rt.close()
