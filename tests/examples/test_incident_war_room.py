"""The incident war room suite through LocalDispatcher(LocalWorkerRuntime) and through HTTP
worker processes: three investigators fanned out over the InProcessA2ABus, the commander's
plan run by dispatch_plan, quorum-2 approvals (one approved, one rejected by the incident
lead, one escalated when its 15-minute deadline passes), an incident cancelled by the
operator, the postmortem, and a SIGKILLed investigator continued by id."""

from __future__ import annotations

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
    counts = facts["counts"]
    assert counts["remediation:disable_flag"] == 1
    assert "remediation:rollback" not in counts  # rejected by the incident lead
    assert "remediation:scale_out" not in counts  # its deadline passed
    assert counts["escalation:page"] == 1  # ... and the agent escalated
    assert counts["model:incident-commander"] == 2  # one plan per incident
    assert counts["model:postmortem-writer"] == 1
    # Both incidents: three investigators each, two model turns and one tool call apiece.
    for name in ("logs", "metrics", "deploys"):
        assert counts[f"model:{name}-investigator"] == 4
    assert counts["tool:search_logs"] == 2
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
    assert Ledger().counts() == before  # every send carried its message id: nothing re-ran
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
    assert facts["exit_code"] == -9
    assert "recovered 1 task(s) left running" in facts["stdout"]
    counts = facts["counts"]
    # The plan was paid once (by the dead process); no investigator ran again.
    assert counts["model:incident-commander"] == 1
    for name in ("logs", "metrics", "deploys"):
        assert counts[f"model:{name}-investigator"] == 2
    assert counts["tool:search_logs"] == counts["tool:query_metrics"] == 1
    # The second run dispatched the plan: each remediation agent asked for its tool once.
    for name in ("flag", "deploy", "capacity"):
        assert counts[f"model:{name}-operator"] == 1
    assert not any(k.startswith("remediation:") for k in counts)  # all wait for approval
    assert Ledger().counts("") == {}  # no model call outside a step (filed under no execution)
