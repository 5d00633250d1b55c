"""The incident war room suite through LocalDispatcher(LocalWorkerRuntime) and through HTTP
worker processes: three investigators fanned out over the InProcessA2ABus, the commander's
plan run by dispatch_plan, quorum-2 approvals (one approved, one rejected by the incident
lead, one escalated when its 15-minute deadline passes), an incident cancelled by the
operator, the postmortem, and a SIGKILLed investigator continued by id."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from examples._support import (
    LEDGER_ENV,
    STORE_ENV,
    Ledger,
    Placement,
    http_placement,
    local_placement,
)
from examples.incident_war_room import story
from examples.incident_war_room.app import CLOCK_ENV, make_runtime


@pytest.fixture(params=["local", "http"])
async def placement(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Placement]:
    monkeypatch.setenv(STORE_ENV, f"sqlite:{tmp_path / 'loom.db'}")
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "effects.db"))
    monkeypatch.setenv(CLOCK_ENV, str(tmp_path / "clock-offset"))
    if request.param == "local":
        async with local_placement(make_runtime()) as p:
            yield p
    else:
        async with http_placement(make_runtime(), story.APP, workdir=tmp_path) as p:
            yield p


async def test_incident_end_to_end(placement: Placement, tmp_path: Path) -> None:
    facts = await story.act_incident(placement, tmp_path, lambda _: None)
    assert facts["waiting"] == ["flag-off", "rollback", "scale"]  # every risky step gated
    assert facts["flag-off.votes"] == ["input-required", "completed"]  # quorum 2
    counts = facts["counts"]["inc-checkout"]  # this incident's effects only
    assert counts == {
        # The commander's fan-out: each investigator asked twice (a tool call, then its
        # finding) and its tool run once; the plan asked for once.
        "model:logs-investigator": 2,
        "model:metrics-investigator": 2,
        "model:deploys-investigator": 2,
        "tool:search_logs": 1,
        "tool:query_metrics": 1,
        "tool:recent_deploys": 1,
        "model:incident-commander": 1,
        # The plan: each remediation agent asked for its tool, then told the outcome; only
        # the approved flag-off ran; the scale-out's deadline passed and the agent paged.
        "model:flag-operator": 2,
        "remediation:disable_flag": 1,
        "model:deploy-operator": 2,
        "model:capacity-operator": 3,
        "escalation:page": 1,
        "model:postmortem-writer": 1,
    }
    other = facts["counts"]["inc-batch"]  # the false alarm, cancelled while its plan waited
    assert other["model:incident-commander"] == 1
    assert not any(k.startswith(("remediation:", "escalation:")) for k in other)
    assert "model:postmortem-writer" not in other
    assert facts["cancelled.status"] == "cancelled"
    assert facts["plan.status"] == "completed"
    outcomes = facts["outcomes"]
    assert outcomes["flag-off"] == "flag pricing-cache-v2 is off"
    assert "rejected by incident-lead" in outcomes["rollback"]
    assert "escalated" in outcomes["scale"]
    assert "pricing-cache-v2" in (tmp_path / "postmortem-inc-checkout.md").read_text()


async def test_sigkilled_investigator_continues_by_id(placement: Placement, tmp_path: Path) -> None:
    facts = await story.act_crash(placement, tmp_path, lambda _: None)
    assert facts["exit_code"] == -9
    assert (facts["left"], facts["after"]) == ("running", "completed")
    # Two turns, each asked once in total across both processes; the tool ran once.
    assert facts["counts"] == {"model:logs-investigator": 2, "tool:search_logs": 1}
    # ... and in total: a model call outside a step (filed under no execution) is caught too.
    assert Ledger().counts() == facts["counts"]
    assert facts["output"]["suspect"] == "checkout-api"


async def test_running_the_commander_again_reruns_nothing(placement: Placement) -> None:
    bus = story.make_bus(placement)
    first = await story.investigate_and_plan(bus, "inc-again", story.ALERT, lambda _: None)
    before = Ledger().counts()
    again = await story.investigate_and_plan(bus, "inc-again", story.ALERT, lambda _: None)
    assert Ledger().counts() == before  # the run and the plan are found by id: nothing re-ran
    assert again[0] == first[0] and again[1] == first[1]
    assert sorted(again[2].waiting) == ["flag-off", "rollback", "scale"]
    assert before["model:incident-commander"] == 1


async def test_sigkilled_commander_rerun_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STORE_ENV, f"sqlite:{tmp_path / 'loom.db'}")
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "effects.db"))
    monkeypatch.setenv(CLOCK_ENV, str(tmp_path / "clock-offset"))
    facts = await story.act_commander_crash(tmp_path, lambda _: None)
    assert facts["exit_code"] == -9  # killed at the 5th of the fan-out's 6 investigator answers
    # It recovered the investigators left running (their completion not yet recorded); the
    # commander's run, waiting on them durably, went on once they ended. The run itself is
    # recovered too when it waits on an investigator that ended just before the kill without
    # telling it (bus.recover delivers that outcome), which otherwise hung it.
    recovered = re.search(r"recovered \d+ task\(s\) left running: (.*)", facts["stdout"])
    assert recovered is not None, facts["stdout"]
    assert set(recovered[1].split(", ")) <= {
        "inc-commander",
        "inc-commander.0",
        "inc-commander.1",
        "inc-commander.2",
    }
    rows, second = facts["rows"], facts["second_pid"]
    asked_again = [(eid, name) for eid, name, pid in rows if pid == second]
    investigators = [(e, n) for e, n in asked_again if n.endswith("-investigator")]
    # Of the six investigator answers at least five were durable at the kill (the sixth may
    # have been too: the three run at once). The new process asked at most the one still
    # missing, and only of an investigator it had to recover; finished ones were not asked.
    assert len(investigators) <= 1, asked_again
    unfinished = set(recovered[1].split(", "))
    redone = {e for e, n in asked_again if "investigator" in n or n.startswith("tool:")}
    assert redone <= unfinished, (redone, unfinished)
    counts = facts["counts"]
    for name in ("logs", "metrics", "deploys"):
        assert counts[f"model:{name}-investigator"] in (2, 3)  # 3: a call in flight at the kill
    assert sum(counts[f"model:{n}-investigator"] for n in ("logs", "metrics", "deploys")) <= 7
    # The plan was asked for once, by the new process, after the fan-out finished.
    assert counts["model:incident-commander"] == 1
    assert [n for _, n in asked_again].count("model:incident-commander") == 1
    # The second run dispatched the plan: each remediation agent asked for its tool once.
    for name in ("flag", "deploy", "capacity"):
        assert counts[f"model:{name}-operator"] == 1
    assert not any(k.startswith("remediation:") for k in counts)  # all wait for approval
    assert Ledger().counts("") == {}  # no model call outside a step (filed under no execution)
