"""A step's output is recorded as pydantic's JSON mode gives it, whether or not it is plain."""

from __future__ import annotations

import enum
import math
from typing import Any

import pytest

import loom
from loom.model import EventType


class Colour(enum.Enum):
    RED = "red"


@loom.step(id="plain")
async def plain() -> dict[str, Any]:
    return {"a": [1, 2.5, "x", None, True], "b": {"c": -0.0}}


@loom.step(id="converted")
async def converted() -> dict[Any, Any]:
    return {"t": (1, 2), "e": Colour.RED, 3: "int key"}


@loom.step(id="not-finite")
async def not_finite() -> dict[str, Any]:
    return {"x": [1.0, math.inf]}


@loom.flow(id="outputs")
async def outputs(ctx: loom.WorkflowContext) -> list[Any]:
    return [await ctx.run(plain), await ctx.run(converted)]


@loom.flow(id="refused")
async def refused(ctx: loom.WorkflowContext) -> Any:
    return await ctx.run(not_finite)


async def test_plain_and_converted_outputs_are_stored_as_json_mode_gives_them() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore())
    handle = await rt.start(outputs, execution_id="o1")
    await handle.result(timeout=10)
    stored = [
        e.payload["output"] for e in await rt.store.read("o1") if e.type is EventType.STEP_COMPLETED
    ]
    assert stored[0] == {"a": [1, 2.5, "x", None, True], "b": {"c": -0.0}}
    # Tuples become lists, enum members their values, int keys strings: JSON mode's output.
    assert stored[1] == {"t": [1, 2], "e": "red", "3": "int key"}
    await rt.close()


async def test_a_non_finite_float_is_refused_not_stored_as_null() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore())
    handle = await rt.start(refused, execution_id="r1")
    with pytest.raises(loom.ExecutionFailedError):
        await handle.result(timeout=10)
    completed = [e for e in await rt.store.read("r1") if e.type is EventType.STEP_COMPLETED]
    assert completed == []
    await rt.close()
