"""The schema-migration planner suite, run through LocalDispatcher(LocalWorkerRuntime) and
through HTTP worker processes (RemoteWorkerRuntime): the DBA's gate with an approval, an
operator reject and a cancel; the crash act with a real SIGKILL and the effect ledger; and
the off-policy report of ``--act propensity`` checked against the simulated catalog's
analytic values."""

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
from examples.schema_migration_planner import story
from examples.schema_migration_planner.app import (
    CATALOG,
    LOGGING_POLICY,
    STRATEGIES,
    TARGET_POLICY,
    make_runtime,
    simulate,
)
from tests.support.proc import run_child


@pytest.fixture(params=["local", "http"])
async def placement(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Placement]:
    monkeypatch.setenv(STORE_ENV, f"sqlite:{tmp_path / 'loom.db'}")
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "effects.db"))
    if request.param == "local":
        async with local_placement(make_runtime()) as p:
            yield p
    else:
        async with http_placement(make_runtime(), story.APP, workdir=tmp_path) as p:
            yield p


async def test_gate_approve_reject_cancel(placement: Placement) -> None:
    lines: list[str] = []
    statuses = await story.act_gate(placement, lines.append)
    assert statuses == {
        "add-nullable-column": "completed",  # low risk: applied without a gate
        "add-index": "completed",  # approved with the DBA's strategy
        "drop-column": "completed",  # rejected: the flow ends with outcome "rejected"
        "backfill": "cancelled",
    }
    ledger = Ledger()
    for kind in CATALOG:
        counts = ledger.counts(f"gate-{kind}")
        assert counts["inspect"] == 1 and counts["model:risk"] == 1, (kind, counts)
        applied = 1 if kind in ("add-nullable-column", "add-index") else 0
        assert counts["apply"] == applied, (kind, counts)
    rejected = await placement.runtime.load_state("gate-drop-column")
    assert rejected is not None and rejected.output["outcome"] == "rejected"
    approved = await placement.runtime.load_state("gate-add-index")
    assert approved is not None
    assert approved.output["strategy"] == "online-ddl" and approved.output["chosen_by"] == "dba"
    # The operator's cancel also closed the gate: a late approval is refused, nothing applied.
    with pytest.raises(Exception, match=r"cancel|not waiting|terminal"):
        await placement.resume("gate-backfill", "DbaDecision", {"approved": True, "by": "x"})
    assert ledger.counts("gate-backfill")["apply"] == 0


async def test_crash_act_sigkill_pays_the_model_once(placement: Placement, tmp_path: Path) -> None:
    facts = await story.act_crash(placement, tmp_path, lambda _: None)
    assert facts["exit_code"] == -9  # a real SIGKILL at the fault point
    assert facts["status"] == "completed"
    assert facts["counts"] == {"inspect": 1, "model:risk": 1, "apply": 1}
    # ... and in total: a model call outside a step (filed under no execution) is caught too.
    assert Ledger().counts() == facts["counts"]
    state = await placement.runtime.load_state("crash-backfill")
    assert state is not None and state.output["strategy"] == "chunked"
    pids = {pid for eid, name, pid in Ledger().rows() if eid == "crash-backfill"}
    assert len(pids) == 2  # the dead worker paid the model; another process applied the change


def _analytic(per_kind: int = 12) -> dict[str, float]:
    """The values the report must show, from the catalog and the two policies alone: the
    candidate's value is its reward per change averaged over the catalog, the logging policy's
    is each strategy's reward weighted by its probability; a stratified batch logs each
    strategy ``per_kind * probability`` times, each with weight ``1 / probability`` when the
    candidate agrees, so ``sum w = n`` and ``sum w^2 = sum per_kind / probability``."""
    v_target = v_logged = agree = sum_w2 = 0.0
    for change in CATALOG.values():
        context = {"change": change.kind, "rows": change.rows}
        pick, _ = TARGET_POLICY.select(context, STRATEGIES)
        mu = LOGGING_POLICY.probability(context, STRATEGIES, pick)
        v_target += simulate(change, pick).reward
        v_logged += sum(
            LOGGING_POLICY.probability(context, STRATEGIES, a) * simulate(change, a).reward
            for a in STRATEGIES
        )
        agree += mu
        sum_w2 += per_kind / mu
    k = len(CATALOG)
    n = per_kind * k
    return {
        "value": v_target / k,
        "logged": v_logged / k,
        "lift": (v_target - v_logged) / k,
        "ess": n * n / sum_w2,
        "n": n,
        "agreement": agree / k,
    }


def test_propensity_act_prints_the_catalogs_analytic_values(tmp_path: Path) -> None:
    run = run_child(
        "examples.schema_migration_planner",
        "--act",
        "propensity",
        "--workdir",
        tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    found = re.search(
        r"SNIPS size-aware: value ([\d.]+), logged ([\d.]+), lift ([+-][\d.]+), "
        r"effective samples ([\d.]+) of (\d+)",
        out,
    )
    assert found, out
    value, logged, lift, ess = (float(found.group(i)) for i in range(1, 5))
    want = _analytic()
    assert int(found.group(5)) == want["n"] == 48
    assert value == pytest.approx(want["value"], abs=5e-5)
    assert logged == pytest.approx(want["logged"], abs=5e-5)
    assert lift == pytest.approx(want["lift"], abs=1e-4)
    assert ess == pytest.approx(want["ess"], abs=5e-3)
    assert want["lift"] > 0  # the story's point: the never-run policy is better
    blind = re.search(r"blind log of the same batch: agreement ([\d.]+), value (.+)", out)
    assert blind, out
    assert float(blind.group(1)) == pytest.approx(want["agreement"], abs=5e-5)
    assert blind.group(2).startswith("n/a (agreement only)")
    assert "EXECUTED model:risk x96, apply x96" in out  # one model call per migration


async def test_fork_simulate_promote(placement: Placement) -> None:
    facts = await story.act_branches(placement, lambda _: None)
    assert facts["summary"] == "3 strategies simulated, 0 model calls, parent head unchanged"
    assert facts["parent_unchanged"]
    index = CATALOG["add-index"]
    assert facts["rewards"] == {s: simulate(index, s).reward for s in STRATEGIES}
    best = max(STRATEGIES, key=lambda s: simulate(index, s).reward)
    assert facts["winner"] == best == "online-ddl"
    assert facts["promoted"] == facts["winner_id"]
    assert facts["refused"] == "GateSupersededError"  # the parent's gate is closed
    # The model was paid once, before the fork; nothing was applied for real.
    assert facts["counts"] == {"inspect": 1, "model:risk": 1, "apply:dry-run": 3}
    parent = await placement.runtime.load_state("branch-add-index")
    assert parent is not None and parent.status.value == "cancelled"
