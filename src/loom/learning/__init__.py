"""Learning from the log: decisions recorded with their propensity, outcomes that score them,
and off-policy evaluation of a policy that never ran (``evaluate_policy``)."""

from loom.learning._decisions import (
    DECISION_EVENT,
    OUTCOME_EVENT,
    DecisionError,
    OutcomeRecorded,
    Policy,
    PolicyDecisionRecorded,
)
from loom.learning._ope import (
    PolicyReport,
    Trajectory,
    evaluate_policy,
    format_report,
    trajectories,
    trajectories_from_envelopes,
)
from loom.learning._outcomes import OUTCOME_ATTACHED_EVENT, OUTCOME_FLOW, OutcomeAttached

__all__ = [
    "DECISION_EVENT",
    "OUTCOME_ATTACHED_EVENT",
    "OUTCOME_EVENT",
    "OUTCOME_FLOW",
    "DecisionError",
    "OutcomeAttached",
    "OutcomeRecorded",
    "Policy",
    "PolicyDecisionRecorded",
    "PolicyReport",
    "Trajectory",
    "evaluate_policy",
    "format_report",
    "trajectories",
    "trajectories_from_envelopes",
]
