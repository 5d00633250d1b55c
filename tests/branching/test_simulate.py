"""simulate: one branch per variant at a gate, resumed in parallel through the dispatcher; the
planner's model calls are served from the log, effects dry-run, the parent untouched; promote
one and the parent can no longer be approved."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import GateSupersededError, NotWaitingError, PromotionConflictError
from loom.llm import ScriptedProvider
from loom.model import ExecutionStatus
from loom.orchestration import simulate
from loom.placement import LocalDispatcher, LocalWorkerRuntime
from loom.runtime import DryRun
from loom.storage import SQLiteStore

CHARGES: Counter[str] = Counter()


@loom.step(id="migrate")
async def migrate(strategy: str) -> dict[str, Any]:
    CHARGES[strategy] += 1  # the real, external effect a simulation must not cause
    return {"strategy": strategy, "rows": 1000}


def _planner(provider: ScriptedProvider) -> Any:
    return loom.agent(id="planner", provider=provider, model="m", instructions="Plan it.")


def _flow(planner: Any) -> Any:
    @loom.flow(id="migration", version="1")
    async def migration(ctx: loom.WorkflowContext, table: str) -> dict[str, Any]:
        plan = await ctx.agent(planner, f"plan a migration of {table}")
        choice = await ctx.suspend("Strategy", timeout=timedelta(hours=4))
        if choice.get("replan"):
            plan = await ctx.agent(planner, "plan it again")
        done = await ctx.run(migrate, str(choice["strategy"]))
        return {"plan": plan.output, **done, "simulated": ctx.simulation}

    return migration


async def test_three_strategies_simulated_zero_model_calls_parent_head_unchanged(
    tmp_path: Path,
) -> None:
    CHARGES.clear()
    provider = ScriptedProvider(["copy in batches", "copy in one go"])
    flow = _flow(_planner(provider))
    dry = DryRun({"migrate": lambda call: {"strategy": call.args[0], "rows": 0, "dry": True}})
    rt = loom.WorkflowRuntime(SQLiteStore(tmp_path / "sim.db"), interceptors=[dry])
    rt.register(flow)
    handle = await rt.start(flow, "orders", execution_id="mig-1")
    parent = await handle.wait_for_suspend(timeout=30)
    assert provider.calls == 1
    await rt.store.put_ref("main", "mig-1", parent.last_sequence)  # type: ignore[attr-defined]

    dispatcher = LocalDispatcher(LocalWorkerRuntime(rt))
    variants = {name: {"strategy": name} for name in ("online", "offline", "shadow")}
    sim = await simulate(rt, "mig-1", "Strategy", variants, dispatcher=dispatcher)

    assert sim.summary == "3 strategies simulated, 0 model calls, parent head unchanged"
    assert provider.calls == 1  # the plan was served from the log in every branch
    assert CHARGES == {}  # every migration was a dry run
    assert [b.variant for b in sim.branches] == ["online", "offline", "shadow"]
    for b in sim.branches:
        assert b.status is ExecutionStatus.COMPLETED
        assert b.output == {
            "plan": "copy in batches",
            "strategy": b.variant,
            "rows": 0,
            "dry": True,
            "simulated": True,
        }
        assert (b.effects, b.model_calls, b.dry_runs) == (1, 0, 1)
        ref = await rt.store.get_ref(b.ref)  # type: ignore[attr-defined]
        assert ref is not None and ref.tip == b.last_sequence and ref.forked_from == "mig-1"
    state = await rt.load_state("mig-1")
    assert state is not None and state.status is ExecutionStatus.SUSPENDED
    assert state.last_sequence == parent.last_sequence

    # A variant that asks the model again is counted: the count is of what ran.
    again = await simulate(
        rt,
        "mig-1",
        "Strategy",
        {"x": {"strategy": "x", "replan": True}},
        prefix="re/",
        dispatcher=dispatcher,
    )
    assert again.summary == "1 strategies simulated, 1 model calls, parent head unchanged"
    assert provider.calls == 2 and again.branches[0].output["plan"] == "copy in one go"

    moved = await rt.promote("sim/shadow", "main", by="dba", reason="least risk")
    assert moved.execution_id == sim.branches[2].execution_id
    with pytest.raises(GateSupersededError):
        await rt.resume("mig-1", "Strategy", {"strategy": "online"})
    with pytest.raises(PromotionConflictError):
        await rt.promote("sim/online", "main", by="dba")
    assert CHARGES == {}
    await rt.close()


async def test_simulate_needs_the_gate_it_names(tmp_path: Path) -> None:
    provider = ScriptedProvider(["plan"])
    flow = _flow(_planner(provider))
    rt = loom.WorkflowRuntime(SQLiteStore(tmp_path / "s.db"))
    rt.register(flow)
    await (await rt.start(flow, "t", execution_id="m")).wait_for_suspend(timeout=30)
    with pytest.raises(NotWaitingError):
        await simulate(rt, "m", "Other", {"a": {}})
    with pytest.raises(NotWaitingError):
        await simulate(rt, "m", "Strategy", {"a": {}}, at_sequence=0)
    assert [i async for i in rt.store.iterate_execution_ids()] == ["m"]
    await rt.close()
