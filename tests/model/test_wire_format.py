"""The stored bytes of every built-in event are unchanged (typed payloads write exactly what the
dict literals before them wrote): today's runtime against tests/golden/wire_format.json, which
was recorded by the runtime before the vocabulary was typed (`python -m tests.support.wire_record`)."""

from __future__ import annotations

import json

from loom.model import EventType
from tests.support.wire_record import GOLDEN, record


async def test_every_built_in_event_is_stored_byte_for_byte_as_before() -> None:
    expected = json.loads(GOLDEN.read_text())
    got = await record()
    assert [(r["execution_id"], r["sequence"], r["type"]) for r in got] == [
        (r["execution_id"], r["sequence"], r["type"]) for r in expected
    ]
    for now, before in zip(got, expected, strict=True):
        assert now["payload_json"] == before["payload_json"], now
    # Every type the runtime writes is covered (a fork is written by the branching layer).
    written = {r["type"] for r in got}
    assert written == {t.value for t in EventType} - {EventType.EXECUTION_FORKED}
