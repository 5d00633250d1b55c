"""Off-policy evaluation: how would another policy have done, estimated from the log.

Each logged decision with its propensity ``p`` and reward ``r`` gets the importance weight
``w = pi(a|x) / p`` under the target policy ``pi``. IPS is ``mean(w * r)``; SNIPS divides by
``sum(w)`` instead of ``n`` (lower variance, the default); DR adds a reward model's prediction
and corrects it with the weighted residual. Kish's effective sample size ``(sum w)^2 / sum w^2``
says how many logged decisions the estimate really rests on: 0 when the target policy never
agrees with the log, which yields a warning and no number. Plain Python: these are sums over
at most a few hundred thousand decisions.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from loom.learning._decisions import DECISION_EVENT, OUTCOME_EVENT, Policy
from loom.learning._outcomes import OUTCOME_ATTACHED_EVENT, OUTCOME_FLOW
from loom.model import Envelope, EventType
from loom.storage import ExecutionQuery

__all__ = [
    "PolicyReport",
    "Trajectory",
    "evaluate_policy",
    "format_report",
    "trajectories",
    "trajectories_from_envelopes",
]

Estimator = Literal["snips", "ips", "dr"]
#: A reward model: ``q(context, action) -> expected reward``.
RewardModel = Callable[[Any, Any], float]

#: Bare decisions Loom's own layers record (the clock, an agent's outcome and approval
#: bookkeeping): not the flow's choices, so never trajectories.
_INTERNAL = ("loom.", "agents.")

#: Below this ratio of effective to actual sample size the estimate is flagged.
LOW_ESS_RATIO = 0.1


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One logged decision: what was chosen, among what, for which context, with which
    probability, and the reward it earned (None: no outcome recorded yet)."""

    execution_id: str
    decision_id: str
    action: Any
    context: Any = None
    actions: tuple[Any, ...] | None = None
    propensity: float | None = None
    reward: float | None = None
    policy_id: str | None = None
    policy_version: str | None = None


def trajectories_from_envelopes(envelopes: Iterable[Envelope]) -> list[Trajectory]:
    """Trajectories from envelopes (any mix of executions). A bare ``ctx.decide`` is a blind
    decision: its value is the action, with no context, alternatives or propensity. An outcome
    scores its decision with the first recorded score of the lowest key (keys sorted)."""
    decisions: dict[tuple[str, str], dict[str, Any]] = {}
    scores: dict[tuple[str, str], dict[str, float]] = {}
    for env in envelopes:
        t, p = env.type, env.payload
        if t == DECISION_EVENT:
            decisions[(env.execution_id, p["decision_id"])] = {
                "action": p["action"],
                "context": p.get("context"),
                "actions": tuple(p.get("actions") or ()) or None,
                "propensity": p.get("propensity"),
                "policy_id": p.get("policy_id"),
                "policy_version": p.get("policy_version"),
            }
        elif t == EventType.DECISION_RECORDED and not str(p["name"]).startswith(_INTERNAL):
            decisions.setdefault((env.execution_id, p["name"]), {"action": p["value"]})
        elif t == OUTCOME_EVENT and p.get("decision_id") is not None:
            keyed = scores.setdefault((env.execution_id, p["decision_id"]), {})
            keyed.setdefault(p["key"], float(p["score"]))
        elif t == OUTCOME_ATTACHED_EVENT:
            # Scored after the fact (runtime.record_outcome): its own record names the
            # execution. Logs come before records, so the flow's own score wins a tie.
            keyed = scores.setdefault((p["execution_id"], p["decision_id"]), {})
            keyed.setdefault(p["key"], float(p["score"]))
    out = []
    for (eid, did), d in decisions.items():
        got = scores.get((eid, did))
        reward = got[min(got)] if got else None
        out.append(Trajectory(eid, did, reward=reward, **d))
    return out


async def trajectories(
    store: Any, query: ExecutionQuery | None = None, *, decision_id: str | None = None
) -> list[Trajectory]:
    """Trajectories of every execution ``query`` lists from ``store`` (all by default),
    optionally only those of one ``decision_id``."""
    query = query or ExecutionQuery(limit=500)
    logs: list[Envelope] = []
    listed: set[str] = set()
    while True:
        page = await store.list_executions(query)
        for summary in page.items:
            if summary.flow_id != OUTCOME_FLOW:
                listed.add(summary.execution_id)
                logs.extend(await store.read(summary.execution_id))
        if page.next_cursor is None:
            break
        query = ExecutionQuery(**{**query.__dict__, "cursor": page.next_cursor})
    # Outcomes recorded after the fact live in records of their own (see _outcomes).
    records = ExecutionQuery(flow_id=OUTCOME_FLOW, limit=500)
    while listed:
        page = await store.list_executions(records)
        for summary in page.items:
            if summary.parent_id in listed:
                logs.extend(await store.read(summary.execution_id))
        if page.next_cursor is None:
            break
        records = ExecutionQuery(**{**records.__dict__, "cursor": page.next_cursor})
    out = trajectories_from_envelopes(logs)
    if decision_id is not None:
        out = [t for t in out if t.decision_id == decision_id]
    return out


@dataclass(frozen=True, slots=True)
class PolicyReport:
    """What the log says about a target policy. ``value`` is the chosen estimator's estimate,
    None when the log cannot give one (blind log, no agreement): read ``warnings`` then."""

    policy_id: str
    policy_version: str
    estimator: str
    n_total: int
    evaluated: int
    skipped: Mapping[str, int]
    agreement: float | None
    logged_value: float | None
    value: float | None
    snips: float | None
    ips: float | None
    dr: float | None
    lift: float | None
    ess: float
    ess_ratio: float
    max_weight: float
    ci: tuple[float, float] | None
    ci_level: float
    n_bootstrap: int
    warnings: tuple[str, ...] = field(default=())

    @property
    def agreement_only(self) -> bool:
        """True when the log lets us say how often the policy agrees, but not its value."""
        return self.value is None


def _target_probability(policy: Policy, t: Trajectory, actions: list[Any]) -> float:
    prob = getattr(policy, "probability", None)
    if callable(prob):
        return float(prob(t.context, actions, t.action))
    chosen, _ = policy.select(t.context, actions)
    return 1.0 if chosen == t.action else 0.0


def _snips(wr: Sequence[float], w: Sequence[float]) -> float | None:
    total = sum(w)
    return sum(wr) / total if total > 0 else None


def evaluate_policy(
    trajectories: Iterable[Trajectory],
    policy: Policy,
    *,
    estimator: Estimator = "snips",
    reward_model: RewardModel | None = None,
    n_bootstrap: int = 500,
    seed: int = 0,
    ci_level: float = 0.95,
) -> PolicyReport:
    """Estimate ``policy``'s value from logged ``trajectories``.

    A decision without context or alternatives is skipped (the policy cannot be asked); one
    without a reward too. Decisions without a propensity count toward agreement only: when
    none has one, the report has no value ("agreement only"). The bootstrap interval resamples
    decisions ``n_bootstrap`` times with a fixed ``seed`` and recomputes the estimator (for
    SNIPS, the ratio) on each resample; percentile bounds at ``ci_level``.
    """
    if estimator not in ("snips", "ips", "dr"):
        raise ValueError(f"unknown estimator {estimator!r}; use 'snips', 'ips' or 'dr'")
    if estimator == "dr" and reward_model is None:
        raise ValueError("estimator 'dr' needs a reward_model(context, action) -> float")
    items = list(trajectories)
    skipped = {"no_context": 0, "no_actions": 0, "no_reward": 0, "no_propensity": 0}
    agree = asked = 0
    rewards: list[float] = []
    weights: list[float] = []
    dr_terms: list[float] = []
    for t in items:
        if t.context is None:
            skipped["no_context"] += 1
            continue
        if not t.actions:
            skipped["no_actions"] += 1
            continue
        actions = list(t.actions)
        chosen, _ = policy.select(t.context, actions)
        asked += 1
        agree += chosen == t.action
        if t.reward is None:
            skipped["no_reward"] += 1
            continue
        if t.propensity is None or t.propensity <= 0:
            skipped["no_propensity"] += 1
            continue
        w = _target_probability(policy, t, actions) / t.propensity
        rewards.append(t.reward)
        weights.append(w)
        if reward_model is not None:
            direct: float
            if callable(getattr(policy, "probability", None)):
                direct = sum(
                    policy.probability(t.context, actions, a) * reward_model(t.context, a)  # type: ignore[attr-defined]
                    for a in actions
                )
            else:
                direct = reward_model(t.context, chosen)
            dr_terms.append(direct + w * (t.reward - reward_model(t.context, t.action)))
    n = len(weights)
    warnings: list[str] = []
    agreement = agree / asked if asked else None
    if skipped["no_propensity"]:
        warnings.append(
            f"{skipped['no_propensity']} scored decision(s) have no propensity (blind "
            "ctx.decide): they count toward agreement only"
        )
    if skipped["no_reward"]:
        warnings.append(f"{skipped['no_reward']} decision(s) have no outcome yet (pending)")
    wr = [w * r for w, r in zip(weights, rewards, strict=True)]
    sum_w = sum(weights)
    sum_w2 = sum(w * w for w in weights)
    ess = sum_w * sum_w / sum_w2 if sum_w2 > 0 else 0.0
    ess_ratio = ess / n if n else 0.0
    snips = _snips(wr, weights) if n else None
    ips = sum(wr) / n if n else None
    dr = sum(dr_terms) / n if dr_terms else None
    logged = sum(rewards) / n if n else None
    if n == 0:
        warnings.append("no decision has a context, alternatives, a propensity and a reward")
    elif sum_w == 0:
        warnings.append(
            "the policy never agrees with the logged decisions (effective sample 0): the log "
            "cannot estimate its value"
        )
        snips = ips = dr = None
    elif ess_ratio < LOW_ESS_RATIO:
        warnings.append(
            f"low effective sample: {ess:.1f} of {n} decisions ({ess_ratio:.1%}); the "
            "estimate rests on few decisions"
        )
    value = {"snips": snips, "ips": ips, "dr": dr}[estimator]
    ci = None
    if value is not None and n_bootstrap > 0:
        ci = _bootstrap(estimator, weights, rewards, wr, dr_terms, n_bootstrap, seed, ci_level)
    return PolicyReport(
        policy_id=str(policy.id),
        policy_version=str(policy.version),
        estimator=estimator,
        n_total=len(items),
        evaluated=n,
        skipped=skipped,
        agreement=agreement,
        logged_value=logged,
        value=value,
        snips=snips,
        ips=ips,
        dr=dr,
        lift=value - logged if value is not None and logged is not None else None,
        ess=ess,
        ess_ratio=ess_ratio,
        max_weight=max(weights, default=0.0),
        ci=ci,
        ci_level=ci_level,
        n_bootstrap=n_bootstrap if ci is not None else 0,
        warnings=tuple(warnings),
    )


def _bootstrap(
    estimator: str,
    weights: list[float],
    rewards: list[float],
    wr: list[float],
    dr_terms: list[float],
    n_bootstrap: int,
    seed: int,
    level: float,
) -> tuple[float, float] | None:
    rng = random.Random(seed)
    n = len(weights)
    population = range(n)
    stats: list[float] = []
    for _ in range(n_bootstrap):
        idx = rng.choices(population, k=n)
        if estimator == "snips":
            total = sum([weights[i] for i in idx])
            if total > 0:  # a resample with no agreeing decision has no ratio: left out
                stats.append(sum([wr[i] for i in idx]) / total)
        elif estimator == "ips":
            stats.append(sum([wr[i] for i in idx]) / n)
        else:
            stats.append(sum([dr_terms[i] for i in idx]) / n)
    if not stats:
        return None
    stats.sort()
    alpha = (1.0 - level) / 2.0
    lo = stats[min(len(stats) - 1, int(alpha * len(stats)))]
    hi = stats[min(len(stats) - 1, int((1.0 - alpha) * len(stats)))]
    return (lo, hi)


def _num(x: float | None, fmt: str = ".4f") -> str:
    return "n/a" if x is None else format(x, fmt)


def format_report(report: PolicyReport) -> str:
    """The report as text for a terminal."""
    r = report
    lines = [f"policy {r.policy_id} v{r.policy_version} (estimator {r.estimator})"]
    skipped = ", ".join(f"{k} {v}" for k, v in r.skipped.items() if v) or "none"
    lines.append(f"  decisions  {r.n_total} logged, {r.evaluated} evaluated; skipped: {skipped}")
    lines.append(f"  agreement  {_num(r.agreement, '.1%')}")
    if r.agreement_only:
        lines.append("  value      agreement only: the log cannot estimate this policy's value")
    else:
        ci = f"[{r.ci[0]:.4f}, {r.ci[1]:.4f}]" if r.ci else "n/a"
        lines.append(f"  logged     {_num(r.logged_value)}")
        lines.append(
            f"  estimate   {_num(r.value)}  {r.ci_level:.0%} CI {ci} "
            f"({r.n_bootstrap} resamples)  lift {_num(r.lift, '+.4f')}"
        )
        lines.append(f"  snips {_num(r.snips)}  ips {_num(r.ips)}  dr {_num(r.dr)}")
        lines.append(
            f"  ess        {r.ess:.1f} ({r.ess_ratio:.1%} of {r.evaluated}), "
            f"max weight {r.max_weight:.2f}"
        )
    lines.extend(f"  warning    {w}" for w in r.warnings)
    return "\n".join(lines)
