"""Test support shipped with Loom: conformance kits users can run against their own stores and
dispatchers, and helpers for testing flows."""

from loom.testing._clock import SkippingClock
from loom.testing._dispatcher_conformance import (
    DISPATCHER_CHECKS,
    run_execution_dispatcher_conformance,
)
from loom.testing._store_conformance import (
    STORE_CHECKS,
    StoreFactory,
    run_event_store_conformance,
    run_store_check,
)

__all__ = [
    "DISPATCHER_CHECKS",
    "STORE_CHECKS",
    "SkippingClock",
    "StoreFactory",
    "run_event_store_conformance",
    "run_execution_dispatcher_conformance",
    "run_store_check",
]
