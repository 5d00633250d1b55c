"""Timers under tenancy: each tenant's runtime claims and fires only its own timers."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import loom
from loom.storage import TenantScopedEventStore, Timer, TimerStore
from loom.testing import TIMER_CHECKS, SkippingClock


@pytest.mark.parametrize("check", sorted(TIMER_CHECKS))
async def test_timer_conformance_through_a_tenant_view(check: str, physical: Any) -> None:
    view = TenantScopedEventStore(physical, "acme")
    assert isinstance(view, TimerStore)
    # A neighbour's timers sit in the same physical store, due and unclaimed throughout.
    neighbour = TenantScopedEventStore(physical, "acme2")
    for i in range(3):
        await neighbour.schedule_timer(Timer(f"n{i}", 0, 1.0))
    await TIMER_CHECKS[check](view)
    left = await neighbour.claim_due_timers(10**10, owner="n", lease=1, limit=10)
    assert sorted(t.execution_id for t in left) == ["n0", "n1", "n2"]


async def test_a_tenant_runtime_fires_only_its_own_timers(physical: Any) -> None:
    clock = SkippingClock()

    @loom.flow(id="napper", version="1")
    async def napper(ctx: loom.WorkflowContext) -> str:
        await ctx.sleep(timedelta(hours=1))
        return ctx.execution_id

    runtimes = {}
    for tenant in ("acme", "globex"):
        rt = loom.WorkflowRuntime(
            TenantScopedEventStore(physical, tenant), clock=clock, timers=False
        )
        rt.register(napper)
        await (await rt.start(napper, execution_id="same-id")).settled(timeout=10)
        runtimes[tenant] = rt
    clock.advance(3600)
    acme = runtimes["acme"]
    assert acme.timers is not None
    assert await acme.timers.run_due() == 1  # acme's own timer only
    assert await acme.handle("same-id").result(timeout=10) == "same-id"
    globex_state = await runtimes["globex"].load_state("same-id")
    assert globex_state is not None and globex_state.status is loom.ExecutionStatus.SUSPENDED
    globex = runtimes["globex"]
    assert globex.timers is not None
    assert await globex.timers.run_due() == 1
    assert await globex.handle("same-id").result(timeout=10) == "same-id"
