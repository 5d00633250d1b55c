"""Fuzzed inputs to every decoder (RELIABILITY scenario 13): bad input gets a typed error,
never a crash, and never a stored record."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pydantic
from hypothesis import given, settings
from hypothesis import strategies as st

import loom
from loom.errors import LoomError, PayloadError, WireFormatError
from loom.model import Envelope, EventType, decode_json, encode_json
from loom.placement import ExecutionPackage, ExecutionResult

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=30,
)
hostile_text = st.one_of(
    st.text(),
    st.binary().map(lambda b: b.decode("latin-1")),
    st.integers(1, 5000).map(lambda n: "[" * n),
    st.just('{"a": NaN}'),
    st.just("9" * 5000),
    st.just('{"wire_version": 1, "execution_id": "../../etc/passwd", "flow_id": "x"}'),
    st.just('{"execution_id": "x\'; DROP TABLE loom_events; --"}'),
)


@given(hostile_text)
@settings(max_examples=300, deadline=None)
def test_decode_json_only_raises_payload_error(text: str) -> None:
    try:
        decode_json(text)
    except PayloadError:
        pass


@given(json_values)
@settings(max_examples=300, deadline=None)
def test_encode_json_only_raises_payload_error(value: Any) -> None:
    try:
        text = encode_json(value)
    except PayloadError:
        return
    assert decode_json(text) == json.loads(text)


@given(hostile_text | json_values.map(json.dumps))
@settings(max_examples=300, deadline=None)
def test_wire_decoders_only_raise_wire_format_error(text: str) -> None:
    for decoder in (ExecutionPackage.from_json, ExecutionResult.from_json):
        try:
            decoder(text)
        except WireFormatError:
            pass


@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(EventType)),
            st.dictionaries(
                st.sampled_from(
                    ["position", "step_id", "event_type", "flow_id", "key", "name", "output"]
                ),
                st.integers(-2, 3) | st.text(max_size=3) | st.none(),
            ),
            st.integers(-1, 3),
        ),
        max_size=8,
    )
)
@settings(max_examples=300, deadline=None)
def test_the_fold_is_total(events: list[tuple[EventType, dict[str, Any], int]]) -> None:
    envelopes = [
        Envelope.create("fz", seq + shift, t, payload, fence=1, recorded_at=0.0)
        for seq, (t, payload, shift) in enumerate(events)
        if seq + shift >= 0
    ]
    try:
        loom.replay(envelopes, execution_id="fz")
    except LoomError:
        pass


class Decision(pydantic.BaseModel):
    approved: bool
    approved_by: str


@loom.flow(id="fuzz-gate", version="1", resume_schemas={"Go": Decision})
async def fuzz_gate(ctx: loom.WorkflowContext) -> Any:
    return (await ctx.suspend("Go")).approved


@given(json_values)
@settings(max_examples=150, deadline=None)
def test_resume_payloads_are_validated_before_anything_is_stored(payload: Any) -> None:
    async def go() -> None:
        rt = loom.WorkflowRuntime(loom.InMemoryStore())
        rt.register(fuzz_gate)
        await (await rt.start(fuzz_gate, execution_id="g")).wait_for_suspend()
        before = [e.to_dict() for e in await rt.store.read("g")]
        try:
            await (await rt.resume("g", "Go", payload)).result()
        except LoomError as exc:
            assert exc.code in ("resume_invalid", "payload"), exc
            assert [e.to_dict() for e in await rt.store.read("g")] == before
        await rt.close()

    asyncio.run(go())
