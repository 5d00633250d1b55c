"""Concurrent recover_abandoned passes act only on the state their predicate judged (#11.1, #11.5)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import loom
from loom.errors import ConfigurationError
from loom.model import EventType, ExecutionStatus
from tests.conftest import DURABLE, Backend
from tests.support.poll import until

RAN: Counter[tuple[str, str]] = Counter()
HOLD_S2 = asyncio.Event()  # replaced per test
RELEASE_S3 = asyncio.Event()


def _step(name: str, hold: str | None = None) -> loom.Step[[], str]:
    @loom.step(id=name)
    async def effect() -> str:
        ctx = loom.current_step()
        assert ctx is not None
        RAN[(ctx.execution_id, name)] += 1
        if name == "s2" and not HOLD_S2.is_set():
            await asyncio.Event().wait()  # the first holder dies here (its runtime closes)
        if name == "s3":
            await RELEASE_S3.wait()
        return name

    return effect


S1, S2, S3 = _step("s1"), _step("s2"), _step("s3")


@loom.flow(id="three", version="1")
async def three(ctx: loom.WorkflowContext) -> str:
    return await ctx.run(S1) + await ctx.run(S2) + await ctx.run(S3)


async def _orphans(backend: Backend, ids: list[str]) -> None:
    """Executions left running inside s2 by a runtime that closed (its holder is gone)."""
    first = loom.WorkflowRuntime(backend.store())
    first.register(three)
    for eid in ids:
        await first.start(three, execution_id=eid)
    await until(
        lambda: sum(RAN[(eid, "s2")] for eid in ids) == len(ids), "all inside s2", timeout=30
    )
    await first.close()


@pytest.mark.parametrize("backend", DURABLE, indirect=True)
async def test_two_passes_never_take_an_execution_from_each_other(backend: Backend) -> None:
    global HOLD_S2, RELEASE_S3
    HOLD_S2, RELEASE_S3 = asyncio.Event(), asyncio.Event()
    RAN.clear()
    ids = ["o1", "o2", "o3"]
    await _orphans(backend, ids)
    HOLD_S2.set()
    a = loom.WorkflowRuntime(backend.store())
    b = loom.WorkflowRuntime(backend.store())
    a.register(three)
    b.register(three)

    judged = {eid: asyncio.Event() for eid in ids}

    async def judge_a(state: loom.ExecutionState) -> bool:
        await judged[state.execution_id].wait()  # B has read this execution: now take it
        return True

    async def slow_judge(state: loom.ExecutionState) -> bool:
        # Pass B answers only once pass A has recovered what B is judging (a predicate that
        # asks a slow cluster): the execution moved on since B read it, so B must leave it
        # alone (it is live again, under A).
        judged[state.execution_id].set()

        async def moved_on() -> bool:
            return await b.store.last_sequence(state.execution_id) > state.last_sequence

        await until(moved_on, "pass A recovering it", timeout=30, every=0.005)
        return True

    async def pass_b() -> loom.RecoveryReport:
        try:
            return await loom.recover_abandoned(b, is_abandoned=slow_judge, wait=False)
        finally:
            RELEASE_S3.set()

    report_a, report_b = await asyncio.gather(
        loom.recover_abandoned(a, is_abandoned=judge_a, timeout=30), pass_b()
    )
    for eid in report_b.recovered:  # (only before the fix) let B's takeovers finish too
        await b.handle(eid).settled(30)
    assert sorted(report_a.recovered) == ids and report_a.left == {}
    assert report_b.recovered == [] and report_b.left == {}
    assert sorted(report_b.moved) == ids
    for eid in ids:
        assert report_a.outcomes[eid].status is ExecutionStatus.COMPLETED
        log = await a.store.read(eid)
        assert [e.type for e in log].count(EventType.EXECUTION_RECOVERED) == 1
        # s2 was in flight when the first holder died (ran again once); s3 ran once.
        assert RAN[(eid, "s1")] == 1 and RAN[(eid, "s2")] == 2 and RAN[(eid, "s3")] == 1
    await a.close()
    await b.close()


@pytest.mark.parametrize("bad", [None, 1, "yes"])
async def test_a_predicate_that_is_not_callable_is_refused_at_the_call(bad: object) -> None:
    runtime = loom.WorkflowRuntime(loom.InMemoryStore())
    with pytest.raises(ConfigurationError, match="is_abandoned"):
        await loom.recover_abandoned(runtime, is_abandoned=bad)  # type: ignore[arg-type]
    await runtime.close()
