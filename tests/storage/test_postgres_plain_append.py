"""PostgreSQL's plain-record append (``PostgresStore._plain_append``: one step's record, built
without the general write's cases) asks for exactly the write the general path asks for: the
same statement, parameters, probe and head, and the same refusals before anything is queued.

No server is needed: a store only records its settings until it is opened, and both paths end
in ``_submit``, which is captured here. The conformance suite runs the plain path against the
real server (every step record of it goes this way)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from loom.errors import DuplicateEnvelopeIdError, LoomError, StorageWriteError
from loom.model import Envelope, EventType, StepCompleted
from loom.storage._common import plain_record
from loom.storage._postgres_commit import PostgresWrite
from loom.storage._postgres_lean import PlainAppend, lean_values
from loom.storage.postgres import PostgresStore

DSN = "postgresql://nobody@127.0.0.1:1/never"  # never connected to


class _Captured(PostgresStore):
    """A store whose writes are captured, never sent; ``plain`` counts the plain path's."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(DSN, **kwargs)
        self.sent: list[PostgresWrite] = []
        self.plain = 0

    async def _submit(self, req: PostgresWrite) -> Any:
        self.sent.append(req)
        return None

    def _plain_values(self, env: Envelope) -> Any:
        self.plain += 1  # where the plain path starts (its checks), whatever comes of it
        return super()._plain_values(env)


def _step(eid: str, seq: int, output: Any, *, fence: int = 3) -> Envelope:
    event = StepCompleted(seq, "s", 1, output, 1.5)
    return Envelope.of(eid, seq, event, fence=fence, recorded_at=2.25)


def _fields(req: PostgresWrite) -> dict[str, Any]:
    skip = ("future", "lean")  # lean: the plain path's values encoded up front (checked below)
    return {f.name: getattr(req, f.name) for f in dataclasses.fields(req) if f.name not in skip}


async def _both(env: Envelope, **kwargs: Any) -> tuple[_Captured, _Captured]:
    """``env`` appended through the plain path and through the general one."""
    plain, general = _Captured(**kwargs), _Captured(**kwargs)
    await plain.append([env])
    await general._write_events("append", [env], env.sequence, env.fence)
    return plain, general


@pytest.mark.parametrize(
    "env",
    [
        _step("e", 1, None),
        _step("e", 7, {"a": [1, None], "é": "\u2028"}),
        _step("e", 2, 2.5, fence=9),
        _step("x" * 4001, 1, "a long id: no note fits, the channel carries none"),
        Envelope.create("e", 4, "acme.custom", {"k": 1}, fence=2, recorded_at=5.0),
        Envelope.create("e", 5, EventType.STEP_STARTED, {"position": 5}, fence=2, recorded_at=5.0),
    ],
    ids=["none", "unicode", "float", "long-id", "extension-type", "step-started"],
)
@pytest.mark.parametrize("notify", [True, False])
async def test_the_plain_append_asks_for_what_the_general_path_asks_for(
    env: Envelope, notify: bool
) -> None:
    assert plain_record(env)
    plain, general = await _both(env, notify=notify)
    assert plain.plain == 1
    assert [_fields(r) for r in plain.sent] == [_fields(r) for r in general.sent]
    # Its values, encoded straight from the record, are the bytes and types the generic lean
    # encoding makes of the general path's parameters.
    (req,) = plain.sent
    assert req.lean is not None
    assert req.lean == lean_values(general.sent[0].sql, general.sent[0].params)


async def test_records_that_are_not_plain_take_the_general_path() -> None:
    start = Envelope.create(
        "e",
        0,
        EventType.EXECUTION_STARTED,
        {"flow_id": "f", "flow_version": "1"},
        fence=1,
        recorded_at=1.0,
    )
    own_id = dataclasses.replace(_step("e", 1, None), envelope_id="mine")
    store = _Captured()
    for batch in ([start], [own_id], [_step("e", 1, 1), _step("e", 2, 2)]):
        await store.append(batch)
    assert store.plain == 0 and len(store.sent) == 3
    # A store whose log holds ids written before schema rung 10 checks every append's ids:
    # a derived id such a log already holds is refused, never written twice.
    reserved = _Captured()
    reserved._reserved = frozenset({"e#1.3"})
    with pytest.raises(DuplicateEnvelopeIdError):
        await reserved.append([_step("e", 1, None)])
    await reserved.append([_step("e", 2, None)])
    assert reserved.plain == 0 and len(reserved.sent) == 1


@pytest.mark.parametrize(
    "env",
    [
        _step("nul\x00id", 1, None),
        Envelope.create("e", 4, "acme.\ud800", {"k": 1}, fence=2, recorded_at=5.0),
        Envelope.create("e", 4, "acme.\x00", {"k": 1}, fence=2, recorded_at=5.0),
        # Envelope.create escapes a NUL in the JSON; one built by hand may carry it raw.
        dataclasses.replace(_step("e", 1, None), payload_json='{"raw":"\x00"}'),
    ],
    ids=["nul-id", "surrogate-type", "nul-type", "nul-payload"],
)
async def test_the_plain_append_refuses_what_the_general_path_refuses(env: Envelope) -> None:
    refused: list[tuple[type[BaseException], str]] = []
    for store, write in ((plain := _Captured(), None), (_Captured(), "general")):
        with pytest.raises(LoomError) as info:
            if write is None:
                await store.append([env])
            else:
                await store._write_events("append", [env], env.sequence, env.fence)
        refused.append((type(info.value), str(info.value)))
        assert store.sent == []  # refused before anything was queued
    assert plain.plain == 1
    assert refused[0] == refused[1]


async def test_a_read_only_store_refuses_a_plain_append() -> None:
    store = _Captured(read_only=True)
    with pytest.raises(StorageWriteError, match="read-only"):
        await store.append([_step("e", 1, None)])
    assert store.sent == []


def test_plain_append_encoding_is_refused_for_another_statement() -> None:
    store = PostgresStore(DSN)
    with pytest.raises(ValueError, match="not the plain append"):
        PlainAppend(store._sql.events("append", one=False), "channel")
