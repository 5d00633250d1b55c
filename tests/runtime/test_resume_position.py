"""A resume may name the gate position it decides; a mismatch is refused (#11 gap)."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest
from typer.testing import CliRunner

import loom
from loom.cli import app
from loom.model import ExecutionStatus
from loom.placement import ExecutionPackage, LocalWorkerRuntime, ResumeEvent
from loom.storage import SQLiteStore
from tests.conftest import Backend


class Approval(pydantic.BaseModel):
    ok: bool


@loom.flow(id="two-approvals", version="1", resume_schemas={"Approval": Approval})
async def two_approvals(ctx: loom.WorkflowContext) -> list[bool]:
    first = await ctx.suspend("Approval")
    second = await ctx.suspend("Approval")
    return [first.ok, second.ok]


async def _at_second_gate(rt: loom.WorkflowRuntime, eid: str) -> int:
    await (await rt.start(two_approvals, execution_id=eid)).wait_for_suspend()
    first = await rt.load_state(eid)
    assert first is not None and first.waiting is not None
    await (
        await rt.resume(eid, "Approval", {"ok": True}, position=first.waiting.position)
    ).wait_for_suspend()
    second = await rt.load_state(eid)
    assert second is not None and second.waiting is not None
    assert second.waiting.position != first.waiting.position
    return first.waiting.position


async def test_a_duplicate_of_the_first_decision_cannot_decide_the_second_gate(
    backend: Backend,
) -> None:
    rt = loom.WorkflowRuntime(backend.store())
    rt.register(two_approvals)
    first_position = await _at_second_gate(rt, "g-1")
    before = await rt.store.read("g-1")
    with pytest.raises(loom.NotWaitingError) as caught:
        await rt.resume("g-1", "Approval", {"ok": False}, position=first_position)
    assert caught.value.execution_id == "g-1"
    assert await rt.store.read("g-1") == before
    state = await rt.load_state("g-1")
    assert state is not None and state.waiting is not None
    done = await rt.resume("g-1", "Approval", {"ok": False}, position=state.waiting.position)
    assert (await done.settled(10)).output == [True, False]
    await rt.close()


async def test_the_resume_package_carries_the_position() -> None:
    package = ExecutionPackage(
        execution_id="g-2",
        flow_id="two-approvals",
        resume_event=ResumeEvent("Approval", {"ok": True}, position=3),
    )
    again = ExecutionPackage.from_json(package.to_json())
    assert again.resume_event is not None and again.resume_event.position == 3
    rt = loom.WorkflowRuntime(loom.InMemoryStore())
    rt.register(two_approvals)
    first_position = await _at_second_gate(rt, "g-2")
    worker = LocalWorkerRuntime(rt)
    stale = ExecutionPackage(
        execution_id="g-2",
        flow_id="two-approvals",
        resume_event=ResumeEvent("Approval", {"ok": False}, position=first_position),
    )
    lease = await worker.allocate(stale)
    result = await worker.execute(lease, stale)  # reports, decides nothing
    assert result.status is ExecutionStatus.SUSPENDED
    state = await rt.load_state("g-2")
    assert state is not None and state.waiting is not None and len(state.ops) == 2
    await rt.close()


def test_the_cli_takes_a_position(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "cli.db"

    async def setup() -> int:
        rt = loom.WorkflowRuntime(SQLiteStore(db))
        rt.register(two_approvals)
        position = await _at_second_gate(rt, "g-3")
        await rt.close()
        return position

    import asyncio

    first_position = asyncio.run(setup())
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    args = ["resume", "g-3", "Approval", "--data", '{"ok": false}', "--db", str(db)]
    args += ["--app", "tests.runtime.test_resume_position:two_approvals", "--json"]
    refused = CliRunner().invoke(app, [*args, "--position", str(first_position)])
    assert refused.exit_code != 0
    assert json.loads(refused.stdout)["error"]["type"] == "NotWaitingError"
    accepted = CliRunner().invoke(app, [*args, "--position", str(first_position + 1)])
    assert accepted.exit_code == 0, accepted.stdout
    assert json.loads(accepted.stdout)["output"] == [True, False]
