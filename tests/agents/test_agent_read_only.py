"""`@loom.tool(read_only=True)`: a model call that asks only for read-only tools is recorded
in the same commit as the first tool's result (one commit per turn instead of two). A crash
while such a tool runs re-asks the model for that turn only; every other guarantee holds."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.llm import ScriptedProvider, reply, tool_calls
from loom.model import ExecutionStatus
from loom.testing import SkippingClock
from tests.support.flows import EffectLedger
from tests.support.proc import run_child

READS: list[str] = []


@loom.tool(read_only=True)
def lookup(key: str) -> str:
    """Look a key up."""
    READS.append(key)
    return f"value of {key}"


@loom.tool
def write(key: str) -> str:
    """Change something outside Loom."""
    READS.append(f"write:{key}")
    return "written"


@loom.tool(read_only=True, requires_approval=True)
def guarded(key: str) -> str:
    """Read-only, but behind an approval."""
    return key


class CountingStore(loom.SQLiteStore):
    """A SQLite store that counts its appends (each one write transaction; the start is a
    take-over, not counted)."""

    commits = 0

    async def append(self, envelopes: Any) -> None:
        self.commits += 1
        await super().append(envelopes)

    async def append_with_blobs(self, envelopes: Any, blobs: Any, *, namespace: str = "") -> None:
        self.commits += 1
        await super().append_with_blobs(envelopes, blobs, namespace=namespace)


async def run(tmp: Path, tools: list[Any], script: list[Any]) -> tuple[CountingStore, Any]:
    READS.clear()
    store = CountingStore(tmp / "ro.db")
    rt = loom.WorkflowRuntime(store, clock=SkippingClock(), timers=False)
    agent = loom.agent(
        id="ro", provider=ScriptedProvider(script), model="m", tools=tools, max_turns=20
    )
    rt.register(agent)
    handle = await rt.start(agent, "go", execution_id="ro-1")
    result = await handle.result()
    await rt.close()
    return store, result


TURNS = 4


def lookups() -> list[Any]:
    return [*(tool_calls(("lookup", {"key": f"k{i}"})) for i in range(TURNS)), reply("done")]


async def test_read_only_turns_are_one_commit_each(tmp_path: Path) -> None:
    store, result = await run(tmp_path, [lookup, write], lookups())
    assert result["output"] == "done" and result["turns"] == TURNS + 1
    assert [f"k{i}" for i in range(TURNS)] == READS
    # one per read-only turn + the last model call + the completion (with the outcome)
    assert store.commits == TURNS + 1 + 1
    events = await loom.SQLiteStore(tmp_path / "ro.db").read("ro-1")
    kinds = [str(e.type) for e in events]
    assert kinds.count("agents.model_called") == TURNS + 1
    # The log replays: the recorded conversation answers every position.
    agent = loom.agent(id="ro", provider=ScriptedProvider([]), model="m", tools=[lookup, write])
    state = await loom.testing.replay_flow(agent, events)
    assert state.status is ExecutionStatus.COMPLETED


async def test_a_turn_with_an_effectful_tool_keeps_two_commits(tmp_path: Path) -> None:
    script = [
        tool_calls(("lookup", {"key": "a"}), ("write", {"key": "b"})),
        tool_calls(("write", {"key": "c"})),
        reply("done"),
    ]
    store, _ = await run(tmp_path, [lookup, write], script)
    # turn 1: model + lookup + write; turn 2: model + write; last model, completion (with the
    # outcome): no model call shared a commit, because each turn asks for an effect.
    assert store.commits == 3 + 2 + 1 + 1


async def test_a_read_only_tool_behind_an_approval_is_not_shared(tmp_path: Path) -> None:
    agent = loom.agent(
        id="ro",
        provider=ScriptedProvider([tool_calls(("guarded", {"key": "x"})), reply("done")]),
        model="m",
        tools=[guarded],
    )
    assert not agent._only_read_only_tools(
        {"response": {"message": {"parts": [{"type": "tool_call", "name": "guarded"}]}}}
    )


def _child(mode: str, db: Path, eid: str, ledger: Path, faults: str | None = None) -> Any:
    env = {"LOOM_TEST_LEDGER": str(ledger)}
    if faults:
        env["LOOM_FAULTS"] = faults
    return run_child("agent_read_only", mode, db, eid, env=env)


async def _status(db: Path, eid: str) -> ExecutionStatus | None:
    async with loom.WorkflowRuntime(loom.SQLiteStore(db), timers=False) as rt:
        state = await rt.load_state(eid)
        return None if state is None else state.status


@pytest.mark.parametrize("on_hit", [1, 2])
def test_sigkill_in_a_read_only_tool_re_asks_only_that_turn(tmp_path: Path, on_hit: int) -> None:
    db, ledger, eid = tmp_path / "ro.db", tmp_path / "ledger.db", "pager-1"
    first = _child("start", db, eid, ledger, f"agents.tool_effect_before_record=kill@{on_hit}")
    assert first.returncode == -signal.SIGKILL, first.stderr
    again = _child("recover", db, eid, ledger)
    assert again.returncode == 0, again.stderr
    assert asyncio.run(_status(db, eid)) is ExecutionStatus.COMPLETED
    assert '"Read pages 1, 2 and 3."' in again.stdout
    counts = EffectLedger(ledger).counts(eid)
    # The killed turn's model call was not durable yet: asked again, with its page read again.
    killed = f"model:turn-{on_hit}"
    expected = {f"model:turn-{t}": 1 for t in (1, 2, 3, 4)} | {f"page:{n}": 1 for n in (1, 2, 3)}
    expected[killed] = 2
    expected[f"page:{on_hit}"] = 2
    assert counts == expected
