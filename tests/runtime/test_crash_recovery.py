"""G1/G2/G3 under SIGKILL at every named fault point (a representative slice of hit counts;
`python -m tests.chaos` enumerates every hit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom.faults import FAULT_POINTS
from tests.support.crash_harness import crash_and_recover

# Points a five-step flow crosses without a gate (the agent loop's are in test_agent_crash.py).
POINTS = [p for p in FAULT_POINTS if p != "after_suspend_recorded" and not p.startswith("agents.")]
# Hits chosen to land on the fence, the start, a mid-flow step and the completion.
HITS = {
    "after_start_before_drive": [1],
    "before_effect": [1, 3, 5],
    "after_effect_before_record": [1, 3, 5],
    "before_append": [1, 2, 4, 8],
    "before_commit": [2, 4, 8],
    "after_append_before_ack": [1, 2, 4, 8],
    "before_snapshot": [1],
}


@pytest.mark.parametrize(
    ("point", "on_hit"), [(p, n) for p in POINTS for n in HITS[p]], ids=lambda v: str(v)
)
def test_sigkill_then_recover(point: str, on_hit: int, tmp_path: Path) -> None:
    outcome = crash_and_recover(tmp_path, point, on_hit)
    assert outcome.killed, f"the child was never killed at {point}@{on_hit}"
    if not outcome.started:
        return  # killed before sequence 0 was durable; check_invariants saw no effects ran
    if point == "after_effect_before_record":
        # The killed step's effect happened but was never recorded: exactly it runs twice.
        assert sorted(outcome.counts.values()) == [1, 1, 1, 1, 2], outcome.counts
    elif point in (
        "before_effect",
        "after_start_before_drive",
        "after_append_before_ack",
        "before_snapshot",
    ):
        # Nothing was in flight: every step ran exactly once.
        assert outcome.counts == {f"step-{i}": 1 for i in range(1, 6)}, outcome.counts
