"""summarize(): the pure digest the index keeps agrees with the fold, moves only on the events
that change it, and reads a child's parent and a fork's source."""

from __future__ import annotations

import time

import pytest

from loom.model import (
    Envelope,
    EventType,
    ExecutionStatus,
    replay,
    summarize,
    summary_change,
)
from tests.model.test_golden_replay import load


@pytest.mark.parametrize("name", ["migration_guard_completed", "migration_guard_suspended"])
def test_a_summary_of_a_whole_golden_log_agrees_with_the_fold(name: str) -> None:
    log = load(f"{name}.json")
    state = replay(log)
    whole = summarize(None, log)
    assert whole is not None
    assert whole.status is state.status and whole.flow_id == state.flow_id
    assert whole.created_at == state.started_at
    waiting = state.waiting.event_type if state.waiting else None
    assert whole.waiting_for == waiting
    # Event by event gives the same summary as all at once.
    step_by_step = None
    for env in log:
        step_by_step = summarize(step_by_step, [env]) or step_by_step
    assert step_by_step == whole


def _env(seq: int, type: EventType, payload: dict[str, object]) -> Envelope:
    return Envelope.create("x", seq, type, payload, fence=1, recorded_at=time.time())


def test_only_summary_events_change_it_and_parents_are_read() -> None:
    started = _env(
        0,
        EventType.EXECUTION_STARTED,
        {"flow_id": "f", "flow_version": "2", "input": None, "metadata": {"loom.parent_id": "p"}},
    )
    first = summarize(None, [started])
    assert first is not None and first.parent_id == "p" and first.flow_version == "2"
    step = _env(1, EventType.STEP_COMPLETED, {"position": 1, "step_id": "s", "output": 1})
    assert summarize(first, [step]) is None and summary_change([step]) is None
    sleep = _env(
        2, EventType.EXECUTION_SUSPENDED, {"position": 2, "event_type": "t", "timer": True}
    )
    slept = summarize(first, [step, sleep])
    assert slept is not None and slept.status is ExecutionStatus.SUSPENDED
    assert slept.waiting_for == "loom.timer" and slept.created_at == first.created_at
    forked = _env(3, EventType.EXECUTION_FORKED, {"parent_id": "origin", "at_sequence": 1})
    fork = summarize(slept, [forked])
    assert fork is not None and fork.forked_from == "origin"
    assert fork.status is ExecutionStatus.SUSPENDED  # a fork record does not change the status
