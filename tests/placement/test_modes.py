"""Explicit modes: a package says what it is (intent, redispatch; wire version 2, version 1
still read), the worker runs one method per intent, and runtime commands take an explicit
lease instead of a fence that switched protocols."""

from __future__ import annotations

import json

import pytest

import loom
from loom.errors import ConfigurationError, ExecutionNotFoundError, WireFormatError
from loom.placement import (
    TIMER_WAKE,
    ExecutionPackage,
    Intent,
    LocalWorkerRuntime,
    ResumeEvent,
    timer_package,
)
from loom.placement._spi import is_redispatch, mark_redispatch
from loom.runtime import Lease
from loom.storage import Timer

V1_START = {
    "wire_version": 1,
    "execution_id": "e-1",
    "workflow_id": None,
    "flow_id": "f",
    "flow_version": None,
    "input": {"n": 1},
    "resume_event": None,
    "snapshot_id": None,
    "from_sequence": None,
    "metadata": {},
}


def test_a_version_1_package_decodes_with_its_intent_inferred() -> None:
    start = ExecutionPackage.from_dict(V1_START)
    assert (start.intent, start.redispatch, start.input) == (Intent.START, False, {"n": 1})
    resume = ExecutionPackage.from_dict(
        {
            **V1_START,
            "resume_event": {"event_type": "Go", "payload": {"ok": True}},
            "metadata": {"loom.redispatch": True},
        }
    )
    assert resume.intent is Intent.RESUME and resume.redispatch and is_redispatch(resume)
    wake = ExecutionPackage.from_dict(
        {**V1_START, "resume_event": {"event_type": TIMER_WAKE, "payload": {"position": 3}}}
    )
    assert wake.intent is Intent.WAKE and wake.wake_position == 3


def test_version_2_carries_intent_and_redispatch_and_round_trips() -> None:
    pkg = mark_redispatch(
        ExecutionPackage("e-2", "f", resume_event=ResumeEvent("Go", 1), intent=Intent.RESUME)
    )
    data = json.loads(pkg.to_json())
    assert (data["wire_version"], data["intent"], data["redispatch"]) == (2, "resume", True)
    assert "loom.redispatch" not in data["metadata"]
    assert ExecutionPackage.from_json(pkg.to_json()) == pkg
    cont = ExecutionPackage("e-3", "f", intent=Intent.CONTINUE)
    assert ExecutionPackage.from_json(cont.to_json()).intent is Intent.CONTINUE
    assert timer_package(Timer("e-4", 7, 1.0, "sleep", "f")).intent is Intent.WAKE


@pytest.mark.parametrize(
    "change",
    [
        {"intent": "teleport"},
        {"intent": None},
        {"redispatch": "yes"},
        {"intent": "resume"},  # a resume without its decision
        {"intent": "start", "resume_event": {"event_type": "Go"}},
        {"intent": "wake", "resume_event": {"event_type": "Go"}},
        {"intent": "resume", "resume_event": {"event_type": TIMER_WAKE}},
    ],
)
def test_an_inconsistent_version_2_package_is_refused(change: dict[str, object]) -> None:
    good = ExecutionPackage("e", "f").to_dict()
    with pytest.raises(WireFormatError):
        ExecutionPackage.from_dict({**good, **change})


@loom.flow(id="modes", version="1")
async def modes(ctx: loom.WorkflowContext, n: int) -> int:
    await ctx.suspend("Go")
    await ctx.sleep(0)
    return n + 1


async def test_the_worker_runs_each_intent() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore(), timers=False)
    rt.register(modes)
    worker = LocalWorkerRuntime(rt)

    async def run(pkg: ExecutionPackage) -> loom.ExecutionStatus:
        lease = await worker.allocate(pkg)
        assert (lease.holder is not None) == (pkg.intent in (Intent.START, Intent.CONTINUE))
        try:
            return (await worker.execute(lease, pkg)).status
        finally:
            await worker.release(lease)

    assert await run(ExecutionPackage("m", "modes", input=1)) is loom.ExecutionStatus.SUSPENDED
    # A continue of a suspended execution reports it and re-runs nothing.
    assert await run(ExecutionPackage("m", "modes", intent=Intent.CONTINUE)) is (
        loom.ExecutionStatus.SUSPENDED
    )
    resume = ExecutionPackage("m", "modes", resume_event=ResumeEvent("Go"), intent=Intent.RESUME)
    assert await run(resume) is loom.ExecutionStatus.SUSPENDED  # now asleep
    state = await rt.load_state("m")
    assert state is not None and state.waiting is not None
    wake = timer_package(Timer("m", state.waiting.position, 0.0, "sleep", "modes"))
    assert await run(wake) is loom.ExecutionStatus.COMPLETED
    for intent in (Intent.CONTINUE, Intent.WAKE, Intent.RESUME):
        event = (
            None
            if intent is Intent.CONTINUE
            else ResumeEvent(TIMER_WAKE if intent is Intent.WAKE else "Go", {"position": 0})
        )
        with pytest.raises(ExecutionNotFoundError, match=f"cannot {intent}"):
            await run(ExecutionPackage("nobody", "modes", resume_event=event, intent=intent))
    await rt.close()


async def test_commands_take_an_explicit_lease() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore(), timers=False)
    rt.register(modes)
    lease = await rt.acquire_lease("l")
    assert lease == Lease("l", 1)
    await (await rt.start(modes, 1, holder=lease)).wait_for_suspend()
    with pytest.raises(ConfigurationError, match="the lease is for execution 'l'"):
        await rt.start(modes, 1, execution_id="other", holder=lease)
    with pytest.raises(ConfigurationError, match="fence >= 1"):
        await rt.recover("l", holder=Lease("l", 0))
    # A newer lease supersedes the older one: a command under the old lease is refused.
    newer = await rt.acquire_lease("l")
    with pytest.raises(loom.ExecutionSupersededError):
        await rt.resume("l", "Go", None, holder=lease)
    await (await rt.resume("l", "Go", None, holder=newer)).wait_for_suspend()
    await rt.close()
