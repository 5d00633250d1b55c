"""Golden logs of a fork and of a superseded parent: the fold and today's code still read them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import loom
from loom.cli._demo import migration_guard
from loom.errors import GateSupersededError
from loom.runtime._fork import refuse_superseded
from loom.testing import replay_flow

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def load(name: str) -> list[loom.Envelope]:
    return [loom.Envelope.from_dict(d) for d in json.loads((GOLDEN / f"{name}.json").read_text())]


@pytest.mark.parametrize("name", ["fork_branch_completed", "fork_parent_superseded"])
def test_the_fold_of_the_golden_fork_logs_is_unchanged(name: str) -> None:
    state = loom.replay(load(name))
    expected = json.loads((GOLDEN / f"{name}.state.json").read_text())
    assert json.loads(json.dumps(state.to_dict(), sort_keys=True)) == expected


async def test_current_code_replays_the_golden_branch() -> None:
    log = load("fork_branch_completed")
    assert log[0].type == "EXECUTION_STARTED"
    forked = next(e for e in log if e.type == "EXECUTION_FORKED")
    assert forked.payload["parent_id"] == "golden-p" and forked.payload["branch"] == "sim/b"
    state = await replay_flow(migration_guard, log)
    assert state.status.value == "completed" and state.forked_from is not None


def test_the_superseded_parent_refuses_its_gate() -> None:
    state = loom.replay(load("fork_parent_superseded"))
    assert state.status.value == "cancelled"
    with pytest.raises(GateSupersededError) as info:
        refuse_superseded(state, "ApprovalGranted")
    assert info.value.superseded_by == "golden-b"
