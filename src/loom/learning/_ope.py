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

#: A sequence after every fork point: a score whose decision is not in the envelopes at hand
#: is taken to be the scored execution's own.
_AFTER_ALL = 1 << 62

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


class _Lineage:
    """Who first recorded each sequence of one execution's log.

    A branch's log is its parent's events ``0..at`` copied as stored, then its own
    ``EXECUTION_FORKED`` at ``at + 1``; a branch of a branch copies that record too. So one
    log alone names its whole ancestry: its ``EXECUTION_FORKED`` records in sequence order,
    the last written by the execution itself, each earlier one by the parent the next names.
    """

    __slots__ = ("execution_id", "forks")

    def __init__(self, execution_id: str) -> None:
        self.execution_id = execution_id
        #: (sequence of the record, fork point, parent, the writer forked as a simulation)
        self.forks: list[tuple[int, int, str, bool]] = []

    def owner(self, sequence: int) -> str:
        """The execution that recorded ``sequence`` of this log first."""
        owner = self.execution_id
        for _, at, parent, _ in reversed(self.forks):
            if sequence > at:
                break
            owner = parent
        return owner

    def simulations(self) -> set[str]:
        """The executions in this log's ancestry (itself included) forked as simulations."""
        out: set[str] = set()
        writers = [parent for _, _, parent, _ in self.forks[1:]] + [self.execution_id]
        for (_, _, _, simulation), writer in zip(self.forks, writers, strict=True):
            if simulation:
                out.add(writer)
        return out


def trajectories_from_envelopes(
    envelopes: Iterable[Envelope], *, include_simulations: bool = False
) -> list[Trajectory]:
    """Trajectories from envelopes (any mix of executions). A bare ``ctx.decide`` is a blind
    decision: its value is the action, with no context, alternatives or propensity. An outcome
    scores its decision with the first recorded score of the lowest key (keys sorted).

    A decision belongs to the execution that first recorded it: the copy a fork made of its
    parent's prefix is not another decision (forking a decision 3 times still gives one
    trajectory, the parent's), and a decision a branch took after its fork point is the
    branch's. A branch's score for a decision it inherited scores the parent's trajectory,
    but the parent's own score comes first (then a score recorded after the fact on the
    parent, then the branch's). Branches forked as simulations (``simulate``,
    ``fork(simulation=True)``) ran dry-run effects, so their decisions and scores are left
    out unless ``include_simulations``.
    """
    items = list(envelopes)
    lines: dict[str, _Lineage] = {}
    for env in items:
        if env.type == EventType.EXECUTION_FORKED:
            p = env.payload
            line = lines.setdefault(env.execution_id, _Lineage(env.execution_id))
            at = p.get("at_sequence")
            line.forks.append(
                (
                    env.sequence,
                    at if type(at) is int else env.sequence - 1,
                    str(p.get("parent_id")),
                    bool(p.get("simulation")),
                )
            )
    simulated: set[str] = set()
    for line in lines.values():
        line.forks.sort()
        simulated |= line.simulations()

    def owner(execution_id: str, sequence: int) -> str:
        line = lines.get(execution_id)
        return execution_id if line is None else line.owner(sequence)

    # Where each execution's log holds each decision: a score names a decision by id only.
    placed: dict[tuple[str, str], int] = {}
    for env in items:
        if env.type == DECISION_EVENT:
            placed.setdefault((env.execution_id, env.payload["decision_id"]), env.sequence)
        elif env.type == EventType.DECISION_RECORDED:
            placed.setdefault((env.execution_id, str(env.payload["name"])), env.sequence)

    def decision_owner(execution_id: str, decision_id: str, fallback: int) -> str:
        return owner(execution_id, placed.get((execution_id, decision_id), fallback))

    decisions: dict[tuple[str, str], dict[str, Any]] = {}
    # (owner, decision) -> key -> (rank, score): the lowest rank wins, then the first seen.
    scores: dict[tuple[str, str], dict[str, tuple[int, float]]] = {}

    def score(key: tuple[str, str], name: str, rank: int, value: float) -> None:
        keyed = scores.setdefault(key, {})
        if name not in keyed or rank < keyed[name][0]:
            keyed[name] = (rank, value)

    for env in items:
        t, p = env.type, env.payload
        if t == DECISION_EVENT:
            first = owner(env.execution_id, env.sequence)
            if first in simulated and not include_simulations:
                continue
            decisions[(first, p["decision_id"])] = {
                "action": p["action"],
                "context": p.get("context"),
                "actions": tuple(p.get("actions") or ()) or None,
                "propensity": p.get("propensity"),
                "policy_id": p.get("policy_id"),
                "policy_version": p.get("policy_version"),
            }
        elif t == EventType.DECISION_RECORDED and not str(p["name"]).startswith(_INTERNAL):
            first = owner(env.execution_id, env.sequence)
            if first in simulated and not include_simulations:
                continue
            decisions.setdefault((first, p["name"]), {"action": p["value"]})
        elif t == OUTCOME_EVENT and p.get("decision_id") is not None:
            recorder = owner(env.execution_id, env.sequence)
            if recorder in simulated and not include_simulations:
                continue
            did = p["decision_id"]
            first = decision_owner(env.execution_id, did, env.sequence)
            score((first, did), p["key"], 0 if recorder == first else 2, float(p["score"]))
        elif t == OUTCOME_ATTACHED_EVENT:
            # Scored after the fact (runtime.record_outcome): its own record names the
            # execution it scored, which may be a branch scoring a decision it inherited.
            scored, did = p["execution_id"], p["decision_id"]
            if scored in simulated and not include_simulations:
                continue
            first = decision_owner(scored, did, _AFTER_ALL)
            score((first, did), p["key"], 1 if scored == first else 3, float(p["score"]))
    out = []
    for (eid, did), d in decisions.items():
        got = scores.get((eid, did))
        reward = got[min(got)][1] if got else None
        out.append(Trajectory(eid, did, reward=reward, **d))
    return out


async def trajectories(
    store: Any,
    query: ExecutionQuery | None = None,
    *,
    decision_id: str | None = None,
    include_simulations: bool = False,
) -> list[Trajectory]:
    """Trajectories of every execution ``query`` lists from ``store`` (all by default),
    optionally only those of one ``decision_id``. Forks and simulations as in
    :func:`trajectories_from_envelopes`."""
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
    out = trajectories_from_envelopes(logs, include_simulations=include_simulations)
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
