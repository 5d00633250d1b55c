"""Test support shipped with Loom: conformance kits users can run against their own stores and
dispatchers, and helpers for testing flows."""

from loom.testing._clock import SkippingClock
from loom.testing._dispatcher_conformance import (
    DISPATCHER_CHECKS,
    run_execution_dispatcher_conformance,
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

__all__ = [
    "DISPATCHER_CHECKS",
    "STORE_CHECKS",
    "TIMER_CHECKS",
    "SkippingClock",
    "StoreFactory",
    "TimeSkippingEnvironment",
    "replay_flow",
    "run_event_store_conformance",
    "run_execution_dispatcher_conformance",
    "run_store_check",
    "run_timer_store_conformance",
]
