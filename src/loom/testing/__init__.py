"""Test support shipped with Loom: conformance kits users can run against their own stores and
dispatchers, and helpers for testing flows."""

from loom.testing import _index_conformance  # noqa: F401  (registers the index checks)
from loom.testing._blob_conformance import BLOB_CHECKS, run_blob_store_conformance
from loom.testing._branch_conformance import BRANCH_CHECKS, run_branch_registry_conformance
from loom.testing._clock import SkippingClock
from loom.testing._dispatcher_conformance import (
    DISPATCHER_CHECKS,
    run_execution_dispatcher_conformance,
)
from loom.testing._llm_conformance import (
    LLM_CHECKS,
    WEATHER_TOOL,
    conformance_responder,
    run_llm_provider_conformance,
)
from loom.testing._replayer import replay_flow
from loom.testing._store_conformance import (
    STORE_CHECKS,
    StoreFactory,
    run_event_store_conformance,
    run_store_check,
)
from loom.testing._timer_conformance import TIMER_CHECKS, run_timer_store_conformance
from loom.testing._timeskip import TimeSkippingEnvironment
from loom.testing._upgrade import UpgradeIssue, UpgradeReport, upgrade_check

__all__ = [
    "BLOB_CHECKS",
    "BRANCH_CHECKS",
    "DISPATCHER_CHECKS",
    "LLM_CHECKS",
    "STORE_CHECKS",
    "TIMER_CHECKS",
    "WEATHER_TOOL",
    "SkippingClock",
    "StoreFactory",
    "TimeSkippingEnvironment",
    "UpgradeIssue",
    "UpgradeReport",
    "conformance_responder",
    "replay_flow",
    "run_blob_store_conformance",
    "run_branch_registry_conformance",
    "run_event_store_conformance",
    "run_execution_dispatcher_conformance",
    "run_llm_provider_conformance",
    "run_store_check",
    "run_timer_store_conformance",
    "upgrade_check",
]
