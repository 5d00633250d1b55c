"""Decisions with propensity, outcomes, and off-policy evaluation (loom.learning)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.learning import (
    DECISION_EVENT,
    OUTCOME_EVENT,
    DecisionError,
    Trajectory,
    evaluate_policy,
    format_report,
    trajectories,
)
from loom.storage import SQLiteStore

ACTIONS = ["a", "b", "c"]


class Fixed:
    """A deterministic policy: a table from context to action."""

    version = "1"

    def __init__(self, id: str, table: dict[Any, str]) -> None:
        self.id = id
        self.table = table
        self.calls = 0

    def select(self, context: Any, actions: Sequence[Any]) -> tuple[Any, float]:
        self.calls += 1
        return self.table[context], 1.0


class Scripted:
    """Returns whatever it is told (to test refusals)."""

    id = "scripted"
    version = "0"

    def __init__(self, action: Any, propensity: float) -> None:
        self.action, self.propensity = action, propensity

    def select(self, context: Any, actions: Sequence[Any]) -> tuple[Any, float]:
        return self.action, self.propensity


# ------------------------------------------------------------------ hand-computed cross-check


def test_snips_ips_ess_dr_match_a_hand_computed_log() -> None:
    always_a = Fixed("always-a", {"x": "a"})
    log = [
        Trajectory("e1", "d", "a", "x", ("a", "b"), 0.5, 1.0),  # w 2
        Trajectory("e2", "d", "b", "x", ("a", "b"), 0.5, 0.0),  # w 0
        Trajectory("e3", "d", "a", "x", ("a", "b"), 0.25, 0.0),  # w 4
        Trajectory("e4", "d", "a", "x", ("a", "b"), 1.0, 1.0),  # w 1
        Trajectory("e5", "d", "a", None, None, None, 1.0),  # blind: skipped, no context
        Trajectory("e6", "d", "a", "x", ("a", "b"), 0.5, None),  # pending outcome
    ]
    r = evaluate_policy(log, always_a, n_bootstrap=50, seed=1)
    assert r.evaluated == 4 and r.n_total == 6
    assert r.skipped["no_context"] == 1 and r.skipped["no_reward"] == 1
    assert r.snips == pytest.approx(3 / 7)  # sum(w r) / sum(w) = (2 + 1) / 7
    assert r.ips == pytest.approx(3 / 4)  # sum(w r) / n
    assert r.ess == pytest.approx(49 / 21)  # 7^2 / (4 + 16 + 1)
    assert r.ess_ratio == pytest.approx(49 / 21 / 4)
    assert r.max_weight == 4.0
    assert r.logged_value == pytest.approx(0.5)
    assert r.agreement == pytest.approx(4 / 5)  # the pending one is asked too
    assert r.value == r.snips and r.lift == pytest.approx(3 / 7 - 0.5)
    assert any("pending" in w for w in r.warnings)
    dr = evaluate_policy(
        log, always_a, estimator="dr", reward_model=lambda x, a: 0.5, n_bootstrap=0
    )
    assert dr.dr == pytest.approx((1.5 + 0.5 - 1.5 + 1.0) / 4) and dr.value == dr.dr
    text = format_report(r)
    assert "0.4286" in text and "ess" in text


def test_a_blind_log_gives_agreement_only() -> None:
    log = [Trajectory(f"e{i}", "d", "a", "x", ("a", "b"), None, 1.0) for i in range(5)]
    r = evaluate_policy(log, Fixed("p", {"x": "a"}))
    assert r.agreement == 1.0 and r.agreement_only
    assert r.value is None and r.snips is None and r.ips is None and r.ci is None
    assert any("no propensity" in w for w in r.warnings)
    assert "agreement only" in format_report(r)


# ------------------------------------------------------------------ statistical test

# Bernoulli reward means per (context, action); contexts are uniform.
MU = {
    0: {"a": 0.2, "b": 0.7, "c": 0.4},
    1: {"a": 0.5, "b": 0.1, "c": 0.9},
    2: {"a": 0.6, "b": 0.3, "c": 0.2},
}
LOGGING = {0: (0.5, 0.3, 0.2), 1: (0.2, 0.5, 0.3), 2: (0.3, 0.2, 0.5)}
TARGET = {0: "b", 1: "c", 2: "a"}
TRUE_VALUE = sum(MU[x][TARGET[x]] for x in MU) / len(MU)  # (0.7 + 0.9 + 0.6) / 3


def simulate(rng: random.Random, n: int, logging: dict[int, tuple[float, ...]]) -> list[Trajectory]:
    out = []
    for i in range(n):
        x = rng.randrange(3)
        (a,) = rng.choices(ACTIONS, weights=logging[x])
        p = logging[x][ACTIONS.index(a)]
        r = 1.0 if rng.random() < MU[x][a] else 0.0
        out.append(Trajectory(f"e{i}", "arm", a, x, tuple(ACTIONS), p, r))
    return out


def test_estimators_on_a_synthetic_bandit_with_known_value() -> None:
    target = Fixed("target", TARGET)
    runs, covered, errors = 200, 0, []
    for seed in range(runs):
        log = simulate(random.Random(seed), 400, LOGGING)
        r = evaluate_policy(log, target, n_bootstrap=200, seed=seed)
        assert r.value is not None and r.ci is not None
        covered += r.ci[0] <= TRUE_VALUE <= r.ci[1]
        errors.append(abs(r.value - TRUE_VALUE))
    coverage = covered / runs
    mean_error = sum(errors) / runs
    assert coverage >= 0.90, coverage
    assert mean_error < 0.05 * (1.0 - 0.0), mean_error  # rewards range over [0, 1]


def test_a_policy_that_never_agrees_gets_ess_zero_and_a_warning() -> None:
    never_c = {0: (0.5, 0.5, 0.0), 1: (0.5, 0.5, 0.0), 2: (0.5, 0.5, 0.0)}
    log = [t for t in simulate(random.Random(7), 200, never_c)]
    r = evaluate_policy(log, Fixed("always-c", {0: "c", 1: "c", 2: "c"}), n_bootstrap=50)
    assert r.evaluated == 200 and r.ess == 0.0 and r.agreement == 0.0
    assert r.value is None and r.snips is None and r.ips is None and r.ci is None
    assert any("never agrees" in w for w in r.warnings)


# ------------------------------------------------------------------ in a flow, on SQLite


async def test_a_policy_decision_is_recorded_and_replayed_from_sqlite(tmp_path: Path) -> None:
    policy = Fixed("router", {"vip": "b"})

    @loom.flow(id="route")
    async def route(ctx: loom.WorkflowContext) -> str:
        action: str = await ctx.decide_with_policy("arm", policy, "vip", ACTIONS)
        await ctx.suspend("Go")
        assert await ctx.record_outcome("ctr", 1.0) is True
        assert await ctx.record_outcome("ctr", 0.0, decision_id="arm") is False  # first stands
        return action

    rt = loom.WorkflowRuntime(SQLiteStore(tmp_path / "l.db"))
    rt.register(route)
    await (await rt.start(route, execution_id="r1")).wait_for_suspend()
    assert policy.calls == 1
    await rt.close()

    store = SQLiteStore(tmp_path / "l.db")
    rt2 = loom.WorkflowRuntime(store)
    rt2.register(route)
    assert await (await rt2.resume("r1", "Go", None)).result() == "b"
    assert policy.calls == 1  # the replay served the recorded choice
    events = await store.read("r1")
    decisions = [e for e in events if e.type == DECISION_EVENT]
    outcomes = [e for e in events if e.type == OUTCOME_EVENT]
    assert len(decisions) == 1 and len(outcomes) == 1
    p = decisions[0].payload
    assert (p["action"], p["context"], p["actions"]) == ("b", "vip", ACTIONS)
    assert (p["policy_id"], p["policy_version"], p["propensity"]) == ("router", "1", 1.0)
    (t,) = await trajectories(store)
    assert (t.execution_id, t.decision_id, t.action, t.reward, t.propensity) == (
        "r1",
        "arm",
        "b",
        1.0,
        1.0,
    )
    await rt2.close()


@pytest.mark.parametrize(
    ("action", "propensity"), [("a", 0.0), ("a", 1.5), ("a", float("nan")), ("z", 0.5)]
)
async def test_a_bad_choice_is_refused_and_nothing_recorded(
    tmp_path: Path, action: str, propensity: float
) -> None:
    seen: list[BaseException] = []

    @loom.flow(id="bad")
    async def bad(ctx: loom.WorkflowContext) -> None:
        try:
            await ctx.decide_with_policy("arm", Scripted(action, propensity), "x", ACTIONS)
        except DecisionError as exc:
            seen.append(exc)

    store = SQLiteStore(tmp_path / "b.db")
    rt = loom.WorkflowRuntime(store)
    rt.register(bad)
    await (await rt.start(bad, execution_id="b1")).result()
    assert len(seen) == 1 and isinstance(seen[0], loom.LoomError)
    assert getattr(seen[0], "execution_id", None) == "b1"
    assert not [e for e in await store.read("b1") if e.type == DECISION_EVENT]
    await rt.close()


async def test_a_bare_decide_stays_blind(tmp_path: Path) -> None:
    @loom.flow(id="blind")
    async def blind(ctx: loom.WorkflowContext) -> None:
        await ctx.decide("arm", lambda: "a")
        await ctx.record_outcome("ctr", 1.0, decision_id="arm")

    store = SQLiteStore(tmp_path / "blind.db")
    rt = loom.WorkflowRuntime(store)
    rt.register(blind)
    await (await rt.start(blind, execution_id="x1")).result()
    (t,) = await trajectories(store)
    assert (t.action, t.reward, t.propensity, t.context) == ("a", 1.0, None, None)
    r = evaluate_policy([t], Fixed("p", {None: "a"}))
    assert r.value is None and r.ips is None and r.agreement_only
    await rt.close()
