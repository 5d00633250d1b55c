"""The lean path of a new step keeps every check: plain scalar outputs are stored as they are
(non-finite floats still refused, anything else still through pydantic), the record's JSON is
byte for byte what the generic encoder writes, and a holder that lost its fence runs no further
effect even when the flow swallows the refusal."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import loom
from loom.errors import LoomError, StaleFenceError
from loom.model import DEFAULT_LIMITS, Envelope, EventType, StepCompleted, encode_json
from loom.model._events import _step_completed_json
from tests.support.poll import until


@loom.step(id="as-float")
async def as_float(x: float) -> float:
    return x


@loom.step(id="as-int")
async def as_int(x: Any) -> int:
    return x  # type: ignore[no-any-return]


@loom.step(id="as-optional")
async def as_optional(x: str | None) -> str | None:
    return x


@loom.flow(id="scalars")
async def scalars(ctx: loom.WorkflowContext) -> list[Any]:
    return [
        await ctx.run(as_float, 2.5),
        await ctx.run(as_int, 7),
        await ctx.run(as_optional, "é\u2028"),
        await ctx.run(as_optional, None),
    ]


@loom.flow(id="not-finite-scalar")
async def not_finite_scalar(ctx: loom.WorkflowContext) -> Any:
    return await ctx.run(as_float, math.nan)


async def test_plain_scalars_are_stored_as_they_are(tmp_path: Path) -> None:
    rt = loom.WorkflowRuntime(loom.SQLiteStore(tmp_path / "s.db"))
    handle = await rt.start(scalars, execution_id="s1")
    assert await handle.result(timeout=10) == [2.5, 7, "é\u2028", None]
    records = [e for e in await rt.store.read("s1") if e.type is EventType.STEP_COMPLETED]
    assert [e.payload["output"] for e in records] == [2.5, 7, "é\u2028", None]
    for env in records:  # what the fast encoder wrote is what the generic one writes
        assert env.payload_json == encode_json(env.payload)
    await rt.close()


async def test_a_non_finite_scalar_is_still_refused() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore())
    handle = await rt.start(not_finite_scalar, execution_id="n1")
    with pytest.raises(loom.ExecutionFailedError):
        await handle.result(timeout=10)
    failed = [e for e in await rt.store.read("n1") if e.type is EventType.STEP_FAILED]
    assert failed and failed[0].payload["error"]["type"] == "PayloadError"
    await rt.close()


_json_scalars = st.none() | st.booleans() | st.integers() | st.text() | st.floats()


@given(
    position=st.integers(min_value=0, max_value=2**40),
    step_id=st.text(min_size=1),
    attempt=st.integers(min_value=1, max_value=1000),
    output=_json_scalars | st.lists(st.integers(), max_size=3),
    started_at=st.none() | st.floats(),
)
def test_the_step_record_fast_encoding_is_the_generic_one(
    position: int, step_id: str, attempt: int, output: Any, started_at: float | None
) -> None:
    event = StepCompleted(position, step_id, attempt, output, started_at, None)
    try:
        expected: str | None = encode_json(event.to_wire())
    except LoomError:
        expected = None  # refused: the fast path must leave it to the generic one
    fast = _step_completed_json(event, DEFAULT_LIMITS)
    assert fast is None or fast == expected
    if expected is None:
        with pytest.raises(LoomError):
            Envelope.of("x", position, event, fence=1, recorded_at=1.0)
    else:
        env = Envelope.of("x", position, event, fence=1, recorded_at=1.0)
        assert env.payload_json == expected
        assert (
            env.checksum()
            == Envelope.create(
                "x",
                position,
                EventType.STEP_COMPLETED,
                event.to_wire(),
                fence=1,
                recorded_at=1.0,
                envelope_id=env.envelope_id,
            ).checksum()
        )


ran: list[int] = []
taken_over = asyncio.Event()


@loom.step(id="effect")
async def effect(i: int) -> int:
    ran.append(i)
    return i


@loom.flow(id="swallows-refusals")
async def swallows_refusals(ctx: loom.WorkflowContext) -> str:
    await ctx.run(effect, 1)
    await taken_over.wait()  # another holder takes the execution over meanwhile
    try:
        await ctx.run(effect, 2)  # runs (nothing said otherwise yet); its record is refused
    except StaleFenceError:
        pass  # a broad handler in user code: the refusal must stick all the same
    await ctx.run(effect, 3)  # must not run
    return "zombie finished"


async def test_a_fenced_out_holder_runs_no_effect_after_a_swallowed_refusal(
    tmp_path: Path,
) -> None:
    ran.clear()
    taken_over.clear()
    store = loom.SQLiteStore(tmp_path / "z.db")
    rt = loom.WorkflowRuntime(store)
    handle = await rt.start(swallows_refusals, execution_id="z1")
    await until(lambda: ran == [1], "the first effect to run", timeout=10)
    other = loom.SQLiteStore(tmp_path / "z.db")  # another process's view: it takes over
    await other.acquire_fence("z1")
    taken_over.set()
    with pytest.raises(LoomError):
        await handle.result(timeout=10)
    assert ran == [1, 2]
    assert [e.payload.get("output") for e in await store.read("z1")][1:] == [1]
    await other.close()
    await rt.close()
