"""Values JSON cannot hold are refused with typed errors, never changed (#11.7, #11.8, #11.9)."""

from __future__ import annotations

import math
from typing import Any

import pydantic
import pytest

import loom
from loom.model import ExecutionStatus
from loom.testing import replay_flow


class Decision(pydantic.BaseModel):
    approved: bool
    by: str
    note: Any = None


def _circular() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


def _deep(n: int = 1000) -> list[Any]:
    value: list[Any] = []
    for _ in range(n):
        value = [value]
    return value


NOT_JSON = {
    "object": object(),
    "bytes": b"\xff\xfe",
    "circular": _circular(),
    "deep": _deep(),
    "nan": math.nan,
    "-inf": -math.inf,
    "inf-in-list": [1.0, math.inf],
}


@loom.flow(id="decide", version="1", resume_schemas={"Decision": Decision})
async def decide(ctx: loom.WorkflowContext) -> Any:
    decision = await ctx.suspend("Decision")
    return decision.note


@pytest.mark.parametrize("note", list(NOT_JSON.values()), ids=list(NOT_JSON))
async def test_a_resume_payload_json_cannot_hold_is_refused_before_anything_is_stored(
    note: Any,
) -> None:
    runtime = loom.WorkflowRuntime(loom.InMemoryStore())
    runtime.register(decide)
    handle = await runtime.start(decide, execution_id="r-1")
    await handle.settled(10)
    before = await runtime.store.read("r-1")
    with pytest.raises(loom.ResumeValidationError) as caught:
        await runtime.resume("r-1", "Decision", {"approved": True, "by": "ann", "note": note})
    assert caught.value.execution_id == "r-1"
    assert await runtime.store.read("r-1") == before
    # The gate is still open: a good decision is accepted afterwards.
    resumed = await runtime.resume("r-1", "Decision", {"approved": True, "by": "ann", "note": 1})
    assert (await resumed.settled(10)).output == 1
    await runtime.close()


class Job(pydantic.BaseModel):
    name: str
    extra: Any = None


@loom.flow(id="job", version="1")
async def job(ctx: loom.WorkflowContext, inp: Job) -> Any:
    return inp.extra


@loom.flow(id="ratio", version="1")
async def ratio(ctx: loom.WorkflowContext, x: float) -> float:
    return x


@pytest.mark.parametrize("extra", list(NOT_JSON.values()), ids=list(NOT_JSON))
async def test_a_start_input_json_cannot_hold_is_refused_before_anything_is_stored(
    extra: Any,
) -> None:
    runtime = loom.WorkflowRuntime(loom.InMemoryStore())
    runtime.register(job, ratio)
    with pytest.raises(loom.InvalidInputError) as caught:
        await runtime.start(job, {"name": "n", "extra": extra}, execution_id="s-1")
    assert caught.value.execution_id == "s-1"
    if isinstance(extra, float):
        with pytest.raises(loom.InvalidInputError):
            await runtime.start(ratio, extra, execution_id="s-2")
    assert [eid async for eid in runtime.store.iterate_execution_ids()] == []
    assert await runtime.store.current_fence("s-1") == 0
    await runtime.close()


@loom.step(id="annotated")
async def annotated(v: float) -> dict[str, Any]:
    return {"v": v}


@loom.step(id="plain")
async def plain(v: float):  # type: ignore[no-untyped-def]  # unannotated on purpose
    return {"v": v}


@loom.flow(id="measure", version="1")
async def measure(ctx: loom.WorkflowContext, which: str) -> Any:
    try:
        return await ctx.run(annotated if which == "annotated" else plain, math.nan)
    except loom.StepFailedError as exc:
        return {"failed": exc.details["error"]["type"]}


@pytest.mark.parametrize("which", ["annotated", "plain"])
async def test_a_step_output_json_cannot_hold_fails_the_step_either_way(which: str) -> None:
    runtime = loom.WorkflowRuntime(loom.InMemoryStore())
    runtime.register(measure)
    state = await (await runtime.start(measure, which, execution_id=which)).settled(10)
    assert state.status is ExecutionStatus.COMPLETED
    # Never recorded as null while the flow saw nan: the step failed with a PayloadError.
    assert state.output == {"failed": "PayloadError"}
    assert state.ops[0].status == "failed"
    # And the log replays against the code.
    replayed = await replay_flow(measure, await runtime.store.read(which))
    assert replayed.output == state.output
    await runtime.close()


@loom.flow(id="untyped", version="1")
async def untyped(ctx: loom.WorkflowContext, inp: Any) -> Any:
    return await ctx.suspend("Anything")


@pytest.mark.parametrize("value", list(NOT_JSON.values()), ids=list(NOT_JSON))
async def test_without_a_schema_too_the_refusal_is_typed_and_names_the_execution(
    value: Any,
) -> None:
    runtime = loom.WorkflowRuntime(loom.InMemoryStore())
    runtime.register(untyped)
    with pytest.raises(loom.InvalidInputError) as started:
        await runtime.start(untyped, value, execution_id="u-0")
    assert started.value.execution_id == "u-0"
    await (await runtime.start(untyped, 1, execution_id="u-1")).settled(10)
    before = await runtime.store.read("u-1")
    with pytest.raises(loom.ResumeValidationError) as resumed:
        await runtime.resume("u-1", "Anything", value)
    assert resumed.value.execution_id == "u-1"
    assert await runtime.store.read("u-1") == before
    await runtime.close()
