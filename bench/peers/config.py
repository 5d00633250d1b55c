"""Names, sizes and per-run settings shared by the orchestrator, the workers and the children."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Final

__all__ = [
    "BACKENDS",
    "DEFAULT_PG_DSN",
    "SYSTEMS",
    "WORKLOADS",
    "Sizes",
    "Workload",
]

SYSTEMS: Final = ("loom", "dbos", "langgraph", "floor")
PEERS: Final = ("dbos", "langgraph")
BACKENDS: Final = ("sqlite", "postgres")
DEFAULT_PG_DSN: Final = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    unit: str
    higher_is_better: bool


WORKLOADS: Final = {
    w.key: w
    for w in (
        Workload("per_step", "per-step durable overhead (200-step flow)", "µs/step", False),
        Workload(
            "per_step_floor_ratio", "per-step overhead ÷ raw floor measured alongside", "x", False
        ),
        Workload(
            "per_step_above_floor",
            "per-step overhead above the raw floor measured alongside",
            "µs/step",
            False,
        ),
        Workload("throughput", "throughput, 3-step workflows", "wf/s", True),
        Workload("throughput_steps", "throughput, steps of 3-step workflows", "steps/s", True),
        Workload("one_step", "throughput, 1-step workflows", "wf/s", True),
        Workload("recovery", "recovery of a 1,000-step flow (spawn→done)", "ms", False),
        Workload("recovery_reexec", "re-executed completed steps after SIGKILL", "steps", False),
        Workload("gate", "human gate, resume→done", "ms", False),
    )
}


@dataclass(frozen=True)
class Sizes:
    """How much work one run does; ``quick()`` is the smoke-test preset."""

    reps: int = 5
    steps: int = 200  # per-step workload: steps in the sequential flow
    floor_rows: int = 1000  # raw-floor commits per repetition (more than steps: it is noisy)
    flows: int = 1000  # throughput workloads: workflows started at once
    warmup_flows: int = 100
    gate_trips: int = 20  # gate round trips per repetition (the repetition's value is their median)
    recovery_steps: int = 1000
    kill_at: int = 500
    child_timeout: float = 120.0

    @classmethod
    def quick(cls, reps: int | None = None) -> Sizes:
        return cls(reps=reps or 1, flows=200, warmup_flows=20, gate_trips=5)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
