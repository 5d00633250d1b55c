"""simulate: explore alternatives at a gate, one forked branch per variant, in parallel.

Each variant's branch is forked at the gate (marked as a simulation, so steps can dry-run
their effects: ``StepInfo.simulation``, :class:`loom.runtime.DryRun`), registered as a ref
``<prefix><variant>``, and resumed with the variant's payload by a resume dispatch through the
dispatcher, all at once. The parent is only read. The result counts what each branch ran after
the fork point (effects, model calls, dry-run substitutions) and moves each ref's tip to its
branch's head, ready for ``runtime.promote(ref, "main", by=...)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loom.errors import ExecutionNotFoundError, NotWaitingError, RefExistsError
from loom.model import EventType, ExecutionStatus
from loom.placement import (
    ExecutionDispatcher,
    ExecutionPackage,
    LocalDispatcher,
    LocalWorkerRuntime,
    ResumeEvent,
)
from loom.runtime._dryrun import SIMULATED
from loom.runtime._fork import Branch, registry_of

if TYPE_CHECKING:
    from loom.runtime import WorkflowRuntime

__all__ = ["SimulatedBranch", "Simulation", "simulate"]

#: A model call's record (and, in logs written before it existed, its step's id prefix).
_MODEL_CALLED = "agents.model_called"
_MODEL_STEP = "agents.model:"


@dataclass(frozen=True, slots=True)
class SimulatedBranch:
    """One variant's branch after it ran: where it ended and what it ran past the fork."""

    variant: str
    ref: str
    execution_id: str
    status: ExecutionStatus
    output: Any
    error: Mapping[str, Any] | None
    effects: int
    model_calls: int
    dry_runs: int
    last_sequence: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "ref": self.ref,
            "execution_id": self.execution_id,
            "status": self.status.value,
            "output": self.output,
            "error": None if self.error is None else dict(self.error),
            "effects": self.effects,
            "model_calls": self.model_calls,
            "dry_runs": self.dry_runs,
            "last_sequence": self.last_sequence,
        }


@dataclass(frozen=True, slots=True)
class Simulation:
    """What :func:`simulate` found; ``summary`` is the one-line account."""

    parent_id: str
    at_sequence: int
    event_type: str
    branches: tuple[SimulatedBranch, ...]
    parent_head_before: int
    parent_head_after: int
    parent_status: ExecutionStatus = field(default=ExecutionStatus.SUSPENDED)

    @property
    def parent_unchanged(self) -> bool:
        return self.parent_head_before == self.parent_head_after

    @property
    def model_calls(self) -> int:
        return sum(b.model_calls for b in self.branches)

    @property
    def summary(self) -> str:
        head = "unchanged" if self.parent_unchanged else "MOVED"
        return (
            f"{len(self.branches)} strategies simulated, {self.model_calls} model calls, "
            f"parent head {head}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "parent_id": self.parent_id,
            "at_sequence": self.at_sequence,
            "event_type": self.event_type,
            "summary": self.summary,
            "parent_unchanged": self.parent_unchanged,
            "branches": [b.to_dict() for b in self.branches],
        }


async def simulate(
    runtime: WorkflowRuntime,
    parent_id: str,
    event_type: str,
    variants: Mapping[str, Any],
    *,
    at_sequence: int | None = None,
    prefix: str = "sim/",
    dispatcher: ExecutionDispatcher | None = None,
    dry_run: bool = True,
) -> Simulation:
    """Fork ``parent_id`` at its gate ``event_type`` once per variant (``name -> payload``),
    resume every branch with its payload through ``dispatcher`` (the runtime's, else a
    :class:`LocalDispatcher` on it) in parallel, and report how each ended.

    ``at_sequence`` (default: the parent's head) must be a point where the parent waits on
    ``event_type``: :class:`NotWaitingError` otherwise, nothing forked. ``dry_run`` marks the
    branches as simulations. Refs are named ``prefix + variant`` (a taken name raises
    :class:`~loom.errors.RefExistsError` before anything is forked).
    """
    registry = registry_of(runtime)
    head = await runtime.store.last_sequence(parent_id)
    state = await runtime.load_state(parent_id, at_sequence=at_sequence)
    if state is None:
        raise ExecutionNotFoundError(f"no execution {parent_id!r}", execution_id=parent_id)
    gate = state.waiting
    if (
        state.status is not ExecutionStatus.SUSPENDED
        or gate is None
        or (gate.event_type != event_type)
    ):
        raise NotWaitingError(
            f"execution {parent_id!r} does not wait for {event_type!r} at sequence "
            f"{state.last_sequence} (it is {state.status}); nothing to simulate",
            execution_id=parent_id,
        )
    names = {name: f"{prefix}{name}" for name in variants}
    for ref in names.values():
        if await registry.get_ref(ref) is not None:
            raise RefExistsError(f"ref {ref!r} already exists; nothing was forked", ref=ref)
    at = state.last_sequence
    forks: dict[str, Branch] = {}
    for name in variants:
        forks[name] = await runtime.fork(parent_id, at, branch=names[name], simulation=dry_run)
    disp: ExecutionDispatcher = (
        dispatcher or runtime.dispatcher or LocalDispatcher(LocalWorkerRuntime(runtime))
    )

    async def run(name: str) -> SimulatedBranch:
        b = forks[name]
        package = ExecutionPackage(
            execution_id=b.execution_id,
            flow_id=b.state.flow_id,
            flow_version=b.state.flow_version,
            resume_event=ResumeEvent(event_type, variants[name], position=gate.position),
        )
        result = await disp.dispatch(package)
        tail = await runtime.store.read(b.execution_id, from_sequence=b.state.last_sequence + 1)
        steps = [e for e in tail if e.type == EventType.STEP_COMPLETED]
        calls = [e for e in tail if e.type == _MODEL_CALLED]
        if b.ref is not None and result.last_sequence > b.ref.tip:
            await registry.move_tip(b.ref.name, result.last_sequence, expected=b.ref.tip)
        return SimulatedBranch(
            name,
            names[name],
            b.execution_id,
            result.status,
            result.output,
            result.error,
            len(steps) + len(calls),
            len(calls)
            + sum(1 for e in steps if str(e.payload.get("step_id", "")).startswith(_MODEL_STEP)),
            sum(1 for e in steps if (e.payload.get("annotations") or {}).get(SIMULATED)),
            result.last_sequence,
        )

    ran = await asyncio.gather(*(run(name) for name in variants))
    after = await runtime.load_state(parent_id)
    return Simulation(
        parent_id,
        at,
        event_type,
        tuple(ran),
        head,
        await runtime.store.last_sequence(parent_id),
        after.status if after is not None else ExecutionStatus.PENDING,
    )
