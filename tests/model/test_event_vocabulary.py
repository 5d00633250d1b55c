"""The open event vocabulary: a third party's registered events fold, round-trip through every
store and survive a restart; an event nobody registered is UnknownEventError, not corruption."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import ConfigurationError, CorruptEventError, UnknownEventError
from loom.model import (
    Envelope,
    EventType,
    OpKind,
    OpStatus,
    Payload,
    StepCompleted,
    WaitOutcome,
    event_type_of,
    register_event,
    registered_event_types,
)
from loom.storage import Store
from loom.testing import TimeSkippingEnvironment, replay_flow
from tests.children import ext_events
from tests.support.pg import require_pg, temp_schema
from tests.support.proc import run_child


def fold_in_fresh_process(url: str, execution_id: str, *extra: str) -> dict[str, Any]:
    out = run_child("ext_events", url, execution_id, *extra, timeout=60, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


async def run_metered(store: Store) -> loom.ExecutionState:
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(ext_events.metered)
    try:
        assert await (await rt.start(ext_events.metered, execution_id="m-1")).result() == 84
        log = await rt.store.read("m-1")
        spent = [e for e in log if e.type == "acme.tokens_spent"]
        assert [e.payload_json for e in spent] == [
            '{"position":0,"model":"small","tokens":40}',
            '{"position":1,"model":"large","tokens":2}',
        ]
        # A registered name is not an EventType member: it stays the stored string.
        assert all(type(e.type) is str for e in spent)
        state = await rt.load_state("m-1")
        assert state is not None
        return state
    finally:
        await rt.close()


def check_folded(state: dict[str, Any]) -> None:
    assert state["status"] == "completed" and state["output"] == 84
    assert state["ops"]["0"] == {
        "kind": "acme.meter",
        "name": "small",
        "status": "completed",
        "output": {"tokens": 40},
        "error": None,
        "attempts": 0,
    }
    assert state["ops"]["1"]["output"] == {"tokens": 2}
    assert state["ui"] == {"tokens": 42}


async def test_a_registered_event_folds_and_survives_a_restart_on_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "ext.db"
    state = await run_metered(loom.SQLiteStore(db))
    check_folded(state.to_dict())
    # A fresh process that imports the extension reads the same state back...
    assert fold_in_fresh_process(str(db), "m-1") == {"state": state.to_dict()}
    # ...and one that does not refuses to fold it, saying why (not corruption).
    error = fold_in_fresh_process(str(db), "m-1", "--no-register")["error"]
    assert error["type"] == "UnknownEventError" and error["code"] == "unknown_event"
    assert error["execution_id"] == "m-1"
    assert error["details"] == {"sequence": 1, "event_type": "acme.tokens_spent"}
    assert "newer Loom or an unregistered extension" in error["message"]


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        yield f"{dsn}#{schema}"


@pytest.mark.postgres
async def test_a_registered_event_round_trips_through_postgres(pg_url: str) -> None:
    from loom.storage.postgres import PostgresStore

    dsn, _, schema = pg_url.partition("#")
    state = await run_metered(await PostgresStore.open(dsn, schema=schema))
    check_folded(state.to_dict())
    assert fold_in_fresh_process(pg_url, "m-1") == {"state": state.to_dict()}
    error = fold_in_fresh_process(pg_url, "m-1", "--no-register")["error"]
    assert error["type"] == "UnknownEventError" and error["details"]["sequence"] == 1


async def test_a_registered_event_replays_without_recording_again() -> None:
    store = loom.InMemoryStore()
    state = await run_metered(store)
    check_folded(state.to_dict())
    # Replay of the recorded log runs the flow's code against it: it records nothing new.
    log = await store.read("m-1")
    replayed = await replay_flow(ext_events.metered, log)
    assert replayed.to_dict() == state.to_dict()


def started(eid: str = "u") -> Envelope:
    return Envelope.create(
        eid, 0, EventType.EXECUTION_STARTED, {"flow_id": "f"}, fence=1, recorded_at=1.0
    )


def test_an_unregistered_type_is_unknown_not_corrupt() -> None:
    log = [
        started(),
        Envelope.create("u", 1, "zz.from_the_future", {"x": 1}, fence=1, recorded_at=2.0),
    ]
    with pytest.raises(UnknownEventError) as info:
        loom.replay(log)
    err = info.value
    assert not isinstance(err, CorruptEventError)
    assert err.execution_id == "u" and err.details["sequence"] == 1
    assert "written by a newer Loom or an unregistered extension" in str(err)
    with pytest.raises(UnknownEventError):
        _ = log[1].event


def test_a_malformed_registered_event_is_corrupt() -> None:
    log = [
        started(),
        Envelope.create("u", 1, "acme.tokens_spent", {"model": "m"}, fence=1, recorded_at=2.0),
    ]
    with pytest.raises(CorruptEventError, match="malformed payload"):
        loom.replay(log)
    negative = {"position": 0, "model": "m", "tokens": -1}
    log[1] = Envelope.create("u", 1, "acme.tokens_spent", negative, fence=1, recorded_at=2.0)
    with pytest.raises(CorruptEventError, match="negative"):
        loom.replay(log)


def test_registration_refuses_what_would_make_the_log_ambiguous() -> None:
    # The same registration again is harmless (an extension imported twice).
    ext_events.register()
    assert "acme.tokens_spent" in registered_event_types()

    @dataclass(frozen=True, slots=True)
    class Other(Payload):
        position: int

    def reducer(state: loom.ExecutionState, event: Other, env: Envelope) -> None:
        pass

    with pytest.raises(ConfigurationError, match="already registered"):
        register_event("acme.tokens_spent", Other, reducer)
    with pytest.raises(ConfigurationError, match="already belongs"):
        register_event("acme.other", ext_events.TokensSpent, ext_events.apply_tokens_spent)
    for bad in ("STEP_COMPLETED", "nonamespace", "Acme.Upper", "acme.", "a b.c", "x." + "y" * 200):
        with pytest.raises(ConfigurationError, match="namespaced"):
            register_event(bad, Other, reducer)
    with pytest.raises(ConfigurationError, match="not a registered event payload"):
        event_type_of(Other(1))
    assert "acme.other" not in registered_event_types()


def test_built_in_payloads_are_typed_and_the_envelope_carries_them() -> None:
    env = Envelope.of("t", 1, StepCompleted(0, "s", 1, {"a": 1}, 5.0), fence=1, recorded_at=2.0)
    assert env.type is EventType.STEP_COMPLETED
    assert (
        env.payload_json
        == '{"position":0,"step_id":"s","attempt":1,"output":{"a":1},"started_at":5.0}'
    )
    state = loom.replay([started("t"), env])
    op = state.ops[0]
    assert (op.kind, op.status, op.outcome) == (OpKind.STEP, OpStatus.COMPLETED, None)
    decoded = Envelope.create("t", 1, "STEP_COMPLETED", dict(env.payload), fence=1, recorded_at=2.0)
    assert decoded.type is EventType.STEP_COMPLETED and decoded.event == env.event


async def test_wait_outcomes_are_typed() -> None:
    env = TimeSkippingEnvironment()

    @loom.flow(id="waits")
    async def waits(ctx: loom.WorkflowContext) -> None:
        await ctx.sleep(10)
        try:
            await ctx.suspend("Late", timeout=5)
        except loom.GateTimedOutError:
            pass
        await ctx.suspend("Go")

    env.runtime.register(waits)
    handle = await env.runtime.start(waits, execution_id="w")
    state = await env.settle(handle)
    await env.runtime.resume("w", "Go", None)
    state = await env.runtime.handle("w").settled(timeout=30)
    outcomes = [state.ops[p].outcome for p in sorted(state.ops)]
    assert outcomes == [WaitOutcome.ELAPSED, WaitOutcome.TIMED_OUT, WaitOutcome.DECIDED]
    await env.close()
