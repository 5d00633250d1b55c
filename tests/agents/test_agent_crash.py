"""SIGKILL inside the agent's tool loop, then recovery in a fresh process.

At each fault point (after a model call is recorded, between two tool calls, after a tool's
effect before its record, while waiting for an approval, and the generic step boundaries) a
real child process is killed; fresh processes recover it and cast the approval. The effect
ledger (its own SQLite file, synchronous=FULL) counts every model call per turn and every
tool effect across all processes: each model turn is paid for once, each tool runs once
except at most the interrupted one, and the conversation ends as it does without a crash.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.model import ExecutionStatus
from tests.support.flows import EffectLedger
from tests.support.proc import run_child

CLEAN = {
    "model:turn-1": 1,
    "model:turn-2": 1,
    "model:turn-3": 1,
    "inventory:A": 1,
    "inventory:B": 1,
    "refund:o-7": 1,
}
FINAL = "Both in stock; o-7 refunded."


def _child(mode: str, db: Path, eid: str, ledger: Path, faults: str | None = None) -> Any:
    env = {"LOOM_TEST_LEDGER": str(ledger), **({"LOOM_FAULTS": faults} if faults else {})}
    return run_child("agent_crash", mode, db, eid, env=env)


async def _state(db: Path, eid: str) -> loom.ExecutionState | None:
    async with loom.WorkflowRuntime(loom.SQLiteStore(db), timers=False) as rt:
        return await rt.load_state(eid)


def run_to_the_end(
    tmp: Path, faults: str | None, phase: str = "start"
) -> tuple[bool, dict[str, int], object]:
    """Start, then recover and vote in fresh processes until done; ``faults`` are armed in
    the start or in the (first) vote process, as ``phase`` says."""
    db, ledger, eid = tmp / "agent.db", tmp / "ledger.db", "support-1"
    first = _child("start", db, eid, ledger, faults if phase == "start" else None)
    killed = first.returncode == -signal.SIGKILL
    assert killed or first.returncode == 0, first.stderr
    for _ in range(6):
        state = asyncio.run(_state(db, eid))
        if state is None:  # killed before the start was durable: start again
            step = _child("start", db, eid, ledger)
        elif state.status is ExecutionStatus.COMPLETED:
            return killed, EffectLedger(ledger).counts(eid), state.output["output"]
        elif state.status is ExecutionStatus.SUSPENDED:
            armed = faults if phase == "vote" and not killed else None
            step = _child("vote", db, eid, ledger, armed)
            if armed and step.returncode == -signal.SIGKILL:
                killed = True
                continue
        else:
            step = _child("recover", db, eid, ledger)
        assert step.returncode == 0, step.stderr
    raise AssertionError(f"the agent did not finish: {asyncio.run(_state(db, eid))}")


def test_without_a_crash(tmp_path: Path) -> None:
    killed, counts, output = run_to_the_end(tmp_path, None)
    assert not killed and counts == CLEAN and output == FINAL


# (phase, point, hit): the agent's own points, and generic ones at hits inside the loop. The
# start process runs turns 1-2 (two inventory calls, then the refund's approval gate); the
# vote process runs the refund and turn 3.
KILLS = [
    ("start", "agents.after_model_recorded", 1),
    ("start", "agents.after_model_recorded", 2),
    ("vote", "agents.after_model_recorded", 1),
    ("start", "agents.between_tool_calls", 1),
    ("start", "agents.tool_effect_before_record", 1),
    ("start", "agents.tool_effect_before_record", 2),
    ("vote", "agents.tool_effect_before_record", 1),
    ("start", "after_suspend_recorded", 1),
    ("start", "before_effect", 2),
    ("start", "after_append_before_ack", 3),
    ("start", "before_commit", 4),
    ("vote", "before_commit", 2),
]


@pytest.mark.parametrize(("phase", "point", "on_hit"), KILLS, ids=lambda v: str(v))
def test_sigkill_in_the_tool_loop(phase: str, point: str, on_hit: int, tmp_path: Path) -> None:
    killed, counts, output = run_to_the_end(tmp_path, f"{point}=kill@{on_hit}", phase)
    assert killed, f"the child never reached {point}@{on_hit}"
    assert output == FINAL
    model = {k: v for k, v in counts.items() if k.startswith("model:")}
    tools = {k: v for k, v in counts.items() if not k.startswith("model:")}
    # A model turn is paid for once: a kill after its response is recorded never repeats it.
    assert model == {k: 1 for k in CLEAN if k.startswith("model:")}, counts
    twice = [k for k, v in tools.items() if v == 2]
    if point == "agents.tool_effect_before_record":
        assert len(twice) == 1, counts  # exactly the interrupted tool ran again
    elif point.startswith("agents.") or point == "after_suspend_recorded":
        assert twice == [], counts  # nothing was in flight: nothing runs again
    else:
        assert len(twice) <= 1, counts  # at most the tool whose record the kill interrupted
    assert all(v <= 2 for v in tools.values()) and set(tools) == {
        k for k in CLEAN if not k.startswith("model:")
    }, counts


def test_a_kill_between_the_model_answer_and_its_record_repeats_only_that_turn(
    tmp_path: Path,
) -> None:
    # The provider answered but the answer was not durable: the one case a turn is paid twice.
    killed, counts, output = run_to_the_end(tmp_path, "after_effect_before_record=kill@1")
    assert killed and output == FINAL
    assert counts["model:turn-1"] == 2
    assert all(v == 1 for k, v in counts.items() if k != "model:turn-1"), counts
