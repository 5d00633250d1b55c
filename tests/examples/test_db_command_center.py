"""The DB command center suite through LocalDispatcher(LocalWorkerRuntime) and through HTTP
worker processes: reads run at once, a write waits for approval with its row count shown and
changes exactly those rows, a rejected write and a cancelled request change nothing, a bad
plan runs nothing, and a SIGKILLed worker's request is finished by another process without
asking the planner twice."""

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
from examples.db_command_center import story
from examples.db_command_center.app import SAMPLE_DB_ENV, create_sample_db, make_runtime


@pytest.fixture(params=["local", "http"])
async def placement(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Placement]:
    monkeypatch.setenv(STORE_ENV, f"sqlite:{tmp_path / 'loom.db'}")
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "effects.db"))
    monkeypatch.setenv(SAMPLE_DB_ENV, str(tmp_path / "shop.db"))
    create_sample_db(tmp_path / "shop.db")
    if request.param == "local":
        async with local_placement(make_runtime()) as p:
            yield p
    else:
        async with http_placement(make_runtime(), story.APP, workdir=tmp_path) as p:
            yield p


async def test_reads_at_once_writes_after_approval(placement: Placement) -> None:
    facts = await story.act_requests(placement, lambda _: None)
    assert facts["why.status"] == "completed"
    assert facts["why.counts"] == {"model:planner": 1, "query": 2, "model:analyst": 1}
    # The archive: the operator saw the row count, approved, and exactly those rows changed.
    assert facts["archive.affected"] == facts["old"] == facts["archived"] == 365 * 4
    assert facts["archive.counts"]["write"] == 1
    # Rejected: previewed (and rolled back), never written.
    assert facts["cleanup.status"] == "completed"
    assert facts["cleanup.counts"].get("write", 0) == 0
    assert facts["after.cancelled"] == facts["before.cancelled"] == facts["cleanup.affected"]
    # Cancelled at the gate: no write, no answer.
    assert facts["regions.status"] == "cancelled"
    assert facts["regions.counts"] == {"model:planner": 1, "preview": 1}
    assert facts["east"] == 10
    # A plan with DROP TABLE is refused before any step runs.
    assert facts["truncate.counts"] == {"model:planner": 1}
    refused = await placement.runtime.load_state("cc-truncate")
    assert refused is not None and refused.output["outcome"] == "plan refused"
    why = await placement.runtime.load_state("cc-why")
    assert why is not None
    assert "26 of 30 card payments failed" in why.ui["answer"]
    assert [r["columns"] for r in why.ui["results"]] == [
        ["day", "orders", "completed"],
        ["payment", "status", "n"],
    ]


async def test_sigkill_mid_request(placement: Placement, tmp_path: Path) -> None:
    facts = await story.act_crash(placement, tmp_path, lambda _: None)
    assert facts["exit_code"] == -9
    assert (facts["left"], facts["after"]) == ("running", "completed")
    assert facts["counts"] == {"model:planner": 1, "query": 2, "model:analyst": 1}
    # ... and in total: a model call outside a step (filed under no execution) is caught too.
    assert Ledger().counts() == facts["counts"]
    assert "card payments failed" in facts["answer"]


async def test_dispatch_plan_version(placement: Placement) -> None:
    facts = await story.act_dispatch_plan(placement, lambda _: None)
    assert facts["why.status"] == "completed"
    assert [o["columns"] for o in facts["why.outputs"].values()] == [
        ["day", "orders", "completed"],
        ["payment", "status", "n"],
    ]
    assert facts["archive.affected"] == 1460
    assert facts["archive.outputs"]["step-2"]["written"] == 1460
    assert facts["cleanup.affected"] == 88
    assert facts["cleanup.outputs"]["step-1"]["rejected_by"] == "ops-lead"
    assert story.db_count("SELECT COUNT(*) FROM orders WHERE status = 'archived'") == 1460
    assert story.db_count("SELECT COUNT(*) FROM orders WHERE status = 'cancelled'") == 88
    assert facts["truncate.refused"] == [
        "step 'step-1': unknown agent 'sql-admin' (known: sql-plan-planner, sql-query, sql-write)"
    ]
    # One planner call per request; three reads; two previews; the one approved write.
    assert facts["counts"] == {"model:plan-planner": 4, "query": 3, "preview": 2, "write": 1}
