"""A flow that swallows LeavesReplay still gets one run, one effect and its true outcome.

A timer batch's flows run on ahead of their take-over (see ``DeferredTakeOver``): one that
reaches anything new is stopped with ``LeavesReplay`` (a BaseException) and runs again once its
take-over is written. Flows should never catch BaseException, but some do (a bare ``except:``,
``except BaseException`` around a step to log and carry on). Whatever such a flow does after
swallowing it (returns, raises something else, tries another operation) is discarded: its
first run wrote nothing, and the run that counts is the one after the take-over. ``except
Exception`` never sees it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

import loom
from loom.model import EventType, ExecutionState, ExecutionStatus, Payload
from loom.runtime.timers import TimerService
from loom.storage import ExecutionQuery, LoadsMany, Store, TimerStore
from tests.conftest import Backend
from tests.support.clock import SetClock
from tests.support.poll import until

T0 = 3_000_000.0


#: (execution id, fence, TIMER_FIRED at that fence already stored) per effect run.
EFFECTS: list[tuple[str, int, bool]] = []
#: (execution id, what the flow's handler caught) per handler run.
CAUGHT: list[tuple[str, str]] = []
STORE: list[Store] = []


@dataclass(frozen=True, slots=True)
class Noted(Payload):
    """test.leaves_replay.noted: a record a flow appends with ctx.record (no position)."""

    what: str


def _apply_noted(state: ExecutionState, event: Noted, env: loom.Envelope) -> None:
    state.ui["noted"] = event.what


NOTED = "test.leaves_replay.noted"
loom.register_event(NOTED, Noted, _apply_noted)


@loom.step(id="touch-once")
async def touch_once(execution_id: str) -> int:
    info = loom.current_step()
    assert info is not None
    fired = [
        e
        for e in await STORE[0].read(execution_id)
        if e.type is EventType.TIMER_FIRED and e.fence == info.fence
    ]
    EFFECTS.append((execution_id, info.fence, bool(fired)))
    return info.fence


@loom.flow(id="nap-then-swallow", version="1")
async def nap_then_swallow(ctx: loom.WorkflowContext, args: dict[str, Any]) -> Any:
    await ctx.sleep_until(float(args["when"]))
    eid, mode = ctx.execution_id, args["mode"]
    if mode == "except-exception":
        try:
            return await ctx.run(touch_once, eid)
        except Exception as exc:  # what flows may do: never catches the runtime's own stop
            CAUGHT.append((eid, type(exc).__name__))
            return "caught an Exception"
    try:
        fence = await ctx.run(touch_once, eid)
    except BaseException as exc:
        CAUGHT.append((eid, type(exc).__name__))
        if mode == "record":  # a record of the discarded run: stopped again, never written
            await ctx.record(Noted("by the discarded run"))
            return "recorded"
        # (Each branch runs as such: a UI patch before them would take a position, stopped
        # again, and none of them would ever run.)
        if mode == "ui":  # a patch of the discarded run: stopped again, never written
            ctx.ui.set("swallowed", True)
            return "patched"
        if mode == "return":
            return "swallowed"
        if mode == "raise":
            raise ValueError("a wrong failure, of a run that does not count") from None
        if mode == "retry":  # another operation: stopped again, not swallowed this time
            return await ctx.run(touch_once, eid)
        raise AssertionError(mode) from None
    return fence


MODES = ["return", "raise", "retry", "record", "ui", "except-exception"]


async def test_a_flow_swallowing_leaves_replay_gets_one_effect_and_its_true_outcome(
    backend: Backend,
) -> None:
    clock = SetClock(T0 - 5)
    store = backend.store()
    EFFECTS.clear()
    CAUGHT.clear()
    STORE[:] = [store]
    rt = loom.WorkflowRuntime(store, clock=clock, timers=False)
    rt.register(nap_then_swallow)
    plan = {f"s{i:02d}-{m}": {"when": T0, "mode": m} for i in range(5) for m in MODES}
    handles = await asyncio.gather(
        *(rt.start(nap_then_swallow, args, execution_id=eid) for eid, args in plan.items())
    )
    await asyncio.gather(*(h.settled() for h in handles))
    assert isinstance(store, TimerStore)
    service = TimerService(
        store, rt._wake_locally, clock=clock, batch=len(plan), prepare=rt._prepare_wakes
    )
    clock.t = T0
    assert await service.run_due() == len(plan)

    async def done() -> bool:
        n = await store.count_executions(
            ExecutionQuery(statuses=[ExecutionStatus.COMPLETED], flow_id=nap_then_swallow.id)
        )
        return n == len(plan)

    await until(done, "every woken flow completed", timeout=60)
    # The runs that swallowed it did happen (the run on ahead reached the step; a store that
    # cannot load a batch's states at once wakes each alone, never running one on ahead) ...
    swallowed = [eid for eid, what in CAUGHT if what == "LeavesReplay"]
    ahead = isinstance(store, LoadsMany)
    assert Counter(swallowed) == Counter(
        e for e in plan if ahead and plan[e]["mode"] != "except-exception"
    )
    assert not [c for c in CAUGHT if c[1] != "LeavesReplay"], CAUGHT
    # ... and counted for nothing: each effect ran once, after its take-over was durable, and
    # each outcome is the step's result under the new fence.
    assert Counter(e[0] for e in EFFECTS) == Counter(list(plan))
    assert all(durable for _, _, durable in EFFECTS), [e for e in EFFECTS if not e[2]]
    fences = {eid: fence for eid, fence, _ in EFFECTS}
    for eid in plan:
        state = await rt.load_state(eid)
        assert state.status is ExecutionStatus.COMPLETED, (eid, state.status)
        assert state.output == fences[eid], (eid, state.output)
        assert "swallowed" not in state.ui, (eid, state.ui)
        log = await store.read(eid)
        types = [e.type for e in log]
        assert types.count(EventType.TIMER_FIRED) == 1, (eid, types)
        assert types.count(EventType.STEP_COMPLETED) == 1, (eid, types)
        assert EventType.EXECUTION_FAILED not in types, (eid, types)
        assert NOTED not in [str(t) for t in types], (eid, types)
    await rt.close()
