"""Approval gates on tools: quorum, refused votes leave the log unchanged, edits, deadlines."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import loom
from loom.agents import ApprovalPolicy, VoteRefusedError, args_hash, pending_approval, vote
from loom.errors import GateTimedOutError
from loom.llm import ScriptedProvider, ToolResultPart, reply, tool_calls
from loom.model import ExecutionStatus
from loom.testing import TimeSkippingEnvironment

TRANSFERS: list[tuple[str, int]] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    TRANSFERS.clear()


def make_transfer(policy: ApprovalPolicy | bool) -> loom.Tool[Any, Any]:
    @loom.tool(name="transfer", requires_approval=policy)
    def transfer(to: str, amount: int) -> str:
        """Move money."""
        TRANSFERS.append((to, amount))
        return f"sent {amount} to {to}"

    return transfer


def banker(policy: ApprovalPolicy | bool, eid: str) -> tuple[loom.Agent, ScriptedProvider]:
    provider = ScriptedProvider(
        [tool_calls(("transfer", {"to": "bob", "amount": 100})), reply("finished")]
    )
    agent = loom.agent(
        id=f"banker-{eid}", provider=provider, model="m", tools=[make_transfer(policy)]
    )
    return agent, provider


@pytest.fixture
async def env() -> Any:
    environment = TimeSkippingEnvironment()
    yield environment
    await environment.close()


async def _log(env: TimeSkippingEnvironment, eid: str) -> list[str]:
    return [e.checksum() for e in await env.runtime.store.read(eid)]


async def test_one_approval_runs_the_tool(env: TimeSkippingEnvironment) -> None:
    agent, _ = banker(True, "a")
    env.runtime.register(agent)
    handle = await env.runtime.start(agent, "pay bob", execution_id="a")
    state = await handle.wait_for_suspend()
    assert state.waiting is not None and state.waiting.event_type == "agents.approval"
    request = await pending_approval(env.runtime, "a")
    assert request is not None
    assert request["tool"] == "transfer" and request["args"] == {"to": "bob", "amount": 100}
    assert request["args_hash"] == args_hash("transfer", {"to": "bob", "amount": 100})
    assert TRANSFERS == []  # nothing ran before the vote
    done = await vote(env.runtime, "a", by="alice", args_hash=request["args_hash"])
    assert (await done.result())["output"] == "finished"
    assert TRANSFERS == [("bob", 100)]


async def test_quorum_two_refusals_leave_the_log_unchanged(env: TimeSkippingEnvironment) -> None:
    policy = ApprovalPolicy(approvers=["alice", "bob", "carol"], quorum=2)
    agent, _ = banker(policy, "q")
    env.runtime.register(agent)
    await (await env.runtime.start(agent, "pay", execution_id="q")).wait_for_suspend()
    first = await vote(env.runtime, "q", by="alice")
    await first.wait_for_suspend()
    before = await _log(env, "q")
    refusals = {
        "duplicate_vote": {"by": "alice"},
        "not_allowed": {"by": "mallory"},
        "wrong_arguments": {"by": "bob", "args_hash": "0" * 64},
    }
    for reason, kwargs in refusals.items():
        with pytest.raises(VoteRefusedError) as refused:
            await vote(env.runtime, "q", **kwargs)
        assert refused.value.details["reason"] == reason
        assert refused.value.execution_id == "q"
    with pytest.raises(VoteRefusedError):
        await env.runtime.resume("q", "agents.approval", {"vote": "maybe", "by": "bob"})
    assert await _log(env, "q") == before  # every refusal recorded nothing
    assert TRANSFERS == []
    done = await vote(env.runtime, "q", by="carol")
    assert (await done.result())["outcome"] == "completed"
    assert TRANSFERS == [("bob", 100)]
    votes = [
        e.payload["by"]
        for e in await env.runtime.store.read("q")
        if e.type == "agents.vote_recorded"
    ]
    assert votes == ["alice", "carol"]


async def test_two_approvers_voting_at_once_with_quorum_two(env: TimeSkippingEnvironment) -> None:
    policy = ApprovalPolicy(approvers=["alice", "bob"], quorum=2)
    agent, _ = banker(policy, "race")
    env.runtime.register(agent)
    await (await env.runtime.start(agent, "pay", execution_id="race")).wait_for_suspend()
    await asyncio.gather(vote(env.runtime, "race", by="alice"), vote(env.runtime, "race", by="bob"))
    result = await env.runtime.handle("race").result(timeout=30)
    assert result["outcome"] == "completed"
    assert TRANSFERS == [("bob", 100)]  # ran once, after both votes
    voters = sorted(
        e.payload["by"]
        for e in await env.runtime.store.read("race")
        if e.type == "agents.vote_recorded"
    )
    assert voters == ["alice", "bob"]


async def test_the_same_approver_twice_at_once_counts_once(env: TimeSkippingEnvironment) -> None:
    policy = ApprovalPolicy(approvers=["alice", "bob"], quorum=2)
    agent, _ = banker(policy, "dup")
    env.runtime.register(agent)
    await (await env.runtime.start(agent, "pay", execution_id="dup")).wait_for_suspend()
    results = await asyncio.gather(
        vote(env.runtime, "dup", by="alice"),
        vote(env.runtime, "dup", by="alice"),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, VoteRefusedError)]
    assert len(refused) == 1 and refused[0].details["reason"] == "duplicate_vote"
    state = await env.runtime.handle("dup").settled(timeout=30)
    assert state.status is ExecutionStatus.SUSPENDED and TRANSFERS == []


async def test_a_rejection_goes_back_to_the_model(env: TimeSkippingEnvironment) -> None:
    agent, provider = banker(ApprovalPolicy(approvers=["bob"]), "r")
    env.runtime.register(agent)
    await (await env.runtime.start(agent, "pay", execution_id="r")).wait_for_suspend()
    done = await vote(env.runtime, "r", by="bob", approve=False, reason="too much")
    assert (await done.result())["output"] == "finished"
    assert TRANSFERS == []
    observation = provider.requests[1].messages[-1].parts[0]
    assert isinstance(observation, ToolResultPart) and observation.is_error
    assert "rejected by bob: too much" in observation.content


async def test_edited_arguments_need_their_own_votes(env: TimeSkippingEnvironment) -> None:
    policy = ApprovalPolicy(approvers=["alice", "bob"], quorum=1)
    agent, _ = banker(policy, "e")
    env.runtime.register(agent)
    await (await env.runtime.start(agent, "pay", execution_id="e")).wait_for_suspend()
    old = (await pending_approval(env.runtime, "e") or {})["args_hash"]
    edited = await vote(env.runtime, "e", by="alice", args={"to": "bob", "amount": 10})
    await edited.wait_for_suspend()
    request = await pending_approval(env.runtime, "e")
    assert request is not None and request["args"] == {"to": "bob", "amount": 10}
    assert request["args_hash"] != old and request["voted"] == []
    before = await _log(env, "e")
    with pytest.raises(VoteRefusedError) as stale:
        await vote(env.runtime, "e", by="bob", args_hash=old)
    assert stale.value.details["reason"] == "wrong_arguments"
    assert await _log(env, "e") == before
    done = await vote(env.runtime, "e", by="bob", args_hash=request["args_hash"])
    await done.result()
    assert TRANSFERS == [("bob", 10)]


async def test_deadline_is_a_durable_timer_and_a_late_vote_is_refused(
    env: TimeSkippingEnvironment,
) -> None:
    policy = ApprovalPolicy(deadline=timedelta(hours=4), on_timeout="reject")
    agent, provider = banker(policy, "d")
    env.runtime.register(agent)
    handle = await env.runtime.start(agent, "pay", execution_id="d")
    await handle.wait_for_suspend()
    assert await env.advance(timedelta(hours=3)) == 0  # never early
    assert await env.advance(timedelta(hours=1)) == 1
    result = await env.runtime.handle("d").result(timeout=30)
    assert result["output"] == "finished" and TRANSFERS == []
    observation = provider.requests[1].messages[-1].parts[0]
    assert "deadline" in observation.content  # type: ignore[union-attr]
    before = await _log(env, "d")
    with pytest.raises(GateTimedOutError):
        await vote(env.runtime, "d", by="alice")
    assert await _log(env, "d") == before


async def test_quorum_votes_share_one_deadline(env: TimeSkippingEnvironment) -> None:
    policy = ApprovalPolicy(approvers=["a", "b"], quorum=2, deadline=3600, on_timeout="reject")
    agent, _ = banker(policy, "dl")
    env.runtime.register(agent)
    await (await env.runtime.start(agent, "pay", execution_id="dl")).wait_for_suspend()
    await env.advance(1800)
    await (await vote(env.runtime, "dl", by="a")).wait_for_suspend()
    state = await env.runtime.load_state("dl")
    assert state is not None and state.waiting is not None
    assert state.waiting.timeout_at == pytest.approx(env.clock.now() + 1800)
    assert await env.advance(1800) == 1
    assert (await env.runtime.handle("dl").result(timeout=30))["outcome"] == "completed"
    assert TRANSFERS == []
