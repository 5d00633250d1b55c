"""The agents layer's registered events: model calls as `agents.model_called`, votes as
`agents.vote_recorded`, and the logs written before them (model calls as STEP_COMPLETED of
`agents.model:<id>`, votes as EXECUTION_RESUMED payloads), which must keep loading, replaying
and continuing."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

import loom
import loom.agents
from loom.errors import CorruptEventError, NonDeterminismError
from loom.llm import ScriptedProvider
from loom.model import ExecutionStatus, registered_event_types
from loom.testing import SkippingClock, replay_flow
from tests.agents.golden_agent import PRICE, make_agent, script

GOLDEN = Path(__file__).parent / "golden"


def load(name: str) -> tuple[list[loom.Envelope], dict[str, bytes]]:
    doc = json.loads((GOLDEN / name).read_text())
    events = [loom.Envelope.from_dict(d) for d in doc["events"]]
    blobs = {h: base64.b64decode(d) for h, d in doc["blobs"].items()}
    return events, blobs


def _ops(state: loom.ExecutionState) -> dict[int, tuple[Any, ...]]:
    return {p: (str(o.kind), o.name, o.status.value, o.output) for p, o in state.ops.items()}


def test_the_agents_events_are_registered_namespaced_types() -> None:
    assert {"agents.model_called", "agents.vote_recorded"} <= registered_event_types()


def test_old_and_new_logs_fold_to_the_same_operations() -> None:
    old, _ = load("agent_v1_completed.json")
    new, _ = load("agent_v2_completed.json")
    old_types = {str(e.type) for e in old}
    new_types = {str(e.type) for e in new}
    assert "agents.model_called" not in old_types and "agents.vote_recorded" not in old_types
    assert {"agents.model_called", "agents.vote_recorded"} <= new_types
    # The old shape: model calls were plain steps, votes the resumes' payloads.
    assert any(e.payload.get("step_id") == "agents.model:golden-support" for e in old)
    assert not any(e.payload.get("step_id", "").startswith("agents.model") for e in new)
    a, b = loom.replay(old), loom.replay(new)
    assert a.status is b.status is ExecutionStatus.COMPLETED
    assert _ops(a) == _ops(b) and a.output == b.output
    # Only the new shape carries the accounting annotations (tokens, cost per call).
    model_ops = [o for o in b.ops.values() if o.name == "agents.model:golden-support"]
    assert [o.annotations for o in model_ops] == [
        {"tokens": 150, "cost": pytest.approx((120 * 3.0 + 30 * 15.0) / 1e6)}
    ] * 3
    assert all(o.annotations is None for o in a.ops.values())


@pytest.mark.parametrize("name", ["agent_v1_completed.json", "agent_v2_completed.json"])
async def test_current_code_replays_both_shapes(name: str) -> None:
    events, _ = load(name)
    provider = ScriptedProvider(script(), by_turn=True)
    state = await replay_flow(make_agent(provider), events)
    assert state.status is ExecutionStatus.COMPLETED
    assert provider.calls == 0  # replay called the model no more
    output = state.output
    assert output["outcome"] == "completed" and output["turns"] == 3
    assert output["usage"]["input_tokens"] == 360
    # The old log's cost is recomputed from its responses; the new one's read from the
    # annotations: the same figure.
    assert output["cost"] == pytest.approx(3 * (120 * 3.0 + 30 * 15.0) / 1e6)


async def _import(store: loom.SQLiteStore, name: str) -> list[loom.Envelope]:
    events, blobs = load(name)
    await store.put_blobs(blobs)
    await store.take_over(events, from_fence=0)
    return events


async def test_an_old_log_waiting_for_votes_continues_in_the_new_shape(tmp_path: Path) -> None:
    store = loom.SQLiteStore(tmp_path / "old.db")
    old = await _import(store, "agent_v1_suspended.json")
    provider = ScriptedProvider(script(), by_turn=True)
    rt = loom.WorkflowRuntime(store, clock=SkippingClock())
    rt.register(make_agent(provider))
    eid = old[0].execution_id
    pending = await loom.agents.pending_approval(rt, eid)
    assert pending is not None and pending["tool"] == "refund" and pending["voted"] == []
    await (await loom.agents.vote(rt, eid, by="alice")).wait_for_suspend()
    pending = await loom.agents.pending_approval(rt, eid)
    assert pending is not None and pending["voted"] == ["alice"]
    with pytest.raises(loom.agents.VoteRefusedError):
        await loom.agents.vote(rt, eid, by="alice")  # read back from the new-shape vote
    result = await (await loom.agents.vote(rt, eid, by="bob")).result()
    assert result["output"] == "Both in stock; o-7 refunded."
    assert provider.calls == 1  # only the last turn was asked: the rest came from the log
    events = await store.read(eid)
    appended = [str(e.type) for e in events[len(old) :]]
    assert appended.count("agents.vote_recorded") == 2
    assert appended.count("agents.model_called") == 1
    assert [e.payload["by"] for e in events if e.type == "agents.vote_recorded"] == [
        "alice",
        "bob",
    ]
    # The resumes that carry them leave the vote to the typed event.
    new_resumes = [e for e in events[len(old) :] if e.type == "EXECUTION_RESUMED"]
    assert [e.payload["payload"] for e in new_resumes] == [None, None]
    state = await rt.load_state(eid)
    assert state is not None and state.status is ExecutionStatus.COMPLETED
    await rt.close()


async def test_a_changed_agent_on_an_old_log_is_still_non_determinism() -> None:
    events, _ = load("agent_v1_completed.json")
    changed = loom.agent(
        id="golden-support",
        provider=ScriptedProvider(script()),
        model="scripted",
        instructions="Something else.",
        tools=make_agent().tools.values(),  # type: ignore[arg-type]
        budget=loom.Budget(prices={"scripted": PRICE}),
    )
    with pytest.raises(NonDeterminismError) as err:
        await replay_flow(changed, events)
    assert err.value.details["changed"] == ["instructions"]


def test_a_vote_event_without_its_resume_is_corrupt() -> None:
    events, _ = load("agent_v2_completed.json")
    at = next(i for i, e in enumerate(events) if e.type == "agents.vote_recorded")
    resume = events[at - 1]
    assert resume.type == "EXECUTION_RESUMED"
    # Drop the resume (renumbering what follows): the vote then names a gate still waiting.
    kept = events[: at - 1]
    vote = events[at]
    d = vote.to_dict()
    d["sequence"] = at - 1
    kept.append(loom.Envelope.from_dict(d))
    with pytest.raises(CorruptEventError):
        loom.replay(kept)
