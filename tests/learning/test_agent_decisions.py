"""An agent's own bookkeeping decisions are not the flow's choices: a log of flows that run
agents yields exactly the flow's decisions as trajectories."""

from __future__ import annotations

from pathlib import Path

import loom
from loom.learning import trajectories_from_envelopes
from loom.llm import ScriptedProvider


class Always:
    id, version = "always-b", "1"

    def select(self, context: object, actions: list[str]) -> tuple[str, float]:
        return "b", 0.5


async def test_agent_outcome_and_clock_are_not_trajectories(tmp_path: Path) -> None:
    helper = loom.agent(id="helper", provider=ScriptedProvider(["ok"]), model="m")

    @loom.flow(id="uses-agent")
    async def uses_agent(ctx: loom.WorkflowContext, _: None) -> str:
        await ctx.agent(helper, "hi")
        await ctx.now()
        arm = await ctx.decide_with_policy("arm", Always(), {"x": 1}, ["a", "b"])
        await ctx.decide("blind-arm", lambda: "a")
        await ctx.record_outcome("reward", 1.0)
        return str(arm)

    async with loom.WorkflowRuntime(loom.SQLiteStore(str(tmp_path / "l.db"))) as runtime:
        runtime.register(uses_agent)
        handle = await runtime.start(uses_agent, None, execution_id="e1")
        assert await handle.result() == "b"
        found = trajectories_from_envelopes(await runtime.store.read("e1"))
    assert sorted(t.decision_id for t in found) == ["arm", "blind-arm"]
    arm = next(t for t in found if t.decision_id == "arm")
    assert (arm.action, arm.propensity, arm.reward) == ("b", 0.5, 1.0)
