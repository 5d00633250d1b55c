"""LocalWorkerRuntime: the zero-cloud worker, running packages on an in-process runtime."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from loom.errors import ConfigurationError, ExecutionNotFoundError, NotWaitingError, StorageError
from loom.model import (
    ExecutionState,
    ExecutionStatus,
    OpKind,
    WaitOutcome,
    execution_id_problem,
)
from loom.placement._spi import Health, WorkerLease
from loom.placement._wire import (
    TIMER_WAKE,
    ExecutionPackage,
    ExecutionResult,
    Intent,
    ResumeEvent,
)
from loom.runtime import ExecutionHandle, WorkflowRuntime
from loom.storage import Timer

__all__ = ["IDEMPOTENCY_KEY", "TIMER_WAKE", "LocalWorkerRuntime", "timer_package"]

#: A resume package's metadata key for the decision's idempotency key: a gate that already
#: took that key never takes the decision again (``WorkflowRuntime.resume(idempotency_key=)``).
IDEMPOTENCY_KEY = "loom.idempotency_key"

_LIVE = (ExecutionStatus.RUNNING, ExecutionStatus.PENDING)


def timer_package(timer: Timer) -> ExecutionPackage:
    """The package a TimerService dispatches to wake ``timer``'s execution."""
    return ExecutionPackage(
        execution_id=timer.execution_id,
        flow_id=timer.flow_id or "unknown",
        resume_event=ResumeEvent(TIMER_WAKE, {"position": timer.position}),
        intent=Intent.WAKE,
    )


_Run = Callable[[WorkerLease, ExecutionPackage, ExecutionState | None], Awaitable[ExecutionResult]]


class LocalWorkerRuntime:
    """Runs a package on ``runtime`` (its "code bundle"): one method per :class:`Intent`.

    A start or continue takes a new fence in :meth:`allocate`, so a redispatch always
    supersedes the attempt before it; a resume or wake takes over conditionally instead, so a
    duplicate or late one never fences out the holder that already moved the execution on.
    """

    def __init__(self, runtime: WorkflowRuntime, *, name: str = "local") -> None:
        self.runtime = runtime
        self.name = name
        self._leases: dict[str, WorkerLease] = {}
        self._by_intent: dict[Intent, _Run] = {
            Intent.START: self._start,
            Intent.RESUME: self._resume,
            Intent.WAKE: self._wake,
            Intent.CONTINUE: self._continue,
        }

    async def allocate(self, package: ExecutionPackage) -> WorkerLease:
        # A start or continue may need to take over from a dead holder, so it is fenced up
        # front (ADR 0004); fence 0 = none yet (a resume or wake).
        problem = execution_id_problem(package.execution_id)
        if problem is not None:
            # Refused before the fence below: a malformed id must not leave even that behind.
            raise ConfigurationError(f"cannot allocate: {problem} (got {package.execution_id!r})")
        fence = 0
        if package.intent in (Intent.START, Intent.CONTINUE):
            fence = await self.runtime.store.acquire_fence(package.execution_id)
        lease = WorkerLease(uuid.uuid4().hex, package.execution_id, fence, self.name)
        self._leases[lease.lease_id] = lease
        return lease

    async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
        """The idempotent execute of ADR 0004, by the package's intent."""
        eid = package.execution_id
        state = await self.runtime.load_state(eid)
        if package.from_sequence is not None and (
            state is None or state.last_sequence < package.from_sequence
        ):
            have = -1 if state is None else state.last_sequence
            raise StorageError(
                f"this worker's store holds {eid!r} up to sequence {have}, behind the "
                f"package's {package.from_sequence}",
                execution_id=eid,
                hint="Point the worker at the same store as the dispatcher",
            )
        return await self._by_intent[package.intent](lease, package, state)

    async def _start(
        self, lease: WorkerLease, package: ExecutionPackage, state: ExecutionState | None
    ) -> ExecutionResult:
        if state is not None:
            # A redispatched start whose first attempt got as far as writing: continue it.
            return await self._continue(lease, package, state)
        handle: ExecutionHandle[Any] = await self.runtime.start(
            package.flow_id,
            package.input,
            execution_id=package.execution_id,
            holder=lease.holder,
            flow_version=package.flow_version,
            metadata=_start_metadata(package),
        )
        return await _settled(handle)

    async def _resume(
        self, lease: WorkerLease, package: ExecutionPackage, state: ExecutionState | None
    ) -> ExecutionResult:
        state = _require(package, state)
        event = package.resume_event
        assert event is not None  # a RESUME package carries one (checked when it was built)
        gate = state.waiting
        if (
            state.status is ExecutionStatus.SUSPENDED
            and gate
            and gate.event_type == event.event_type
        ):
            try:
                key = package.metadata.get(IDEMPOTENCY_KEY)
                handle = await self.runtime.resume(
                    state.execution_id,
                    event.event_type,
                    event.payload,
                    position=event.position,
                    idempotency_key=key if isinstance(key, str) and key else None,
                )
            except NotWaitingError:
                # Another decision or holder moved first (a duplicate or late dispatch):
                # report what the log says now.
                return await self._report(state)
            return await _settled(handle)
        if state.status in _LIVE and package.redispatch:
            # The decision was applied, and the holder that applied it died mid-resume: only
            # the dispatcher's own retry after that failed attempt takes the execution over.
            return await self._continue(lease, package, state)
        if package.resume_event is not None and not _delivered(
            state, package.resume_event.event_type
        ):
            # Not a lost response: that decision never reached this execution (a typo in the
            # event type, a gate not reached yet or timed out). Say so: 409, nothing changed.
            self.runtime._waiting_gate(state, package.resume_event.event_type)
        # Decided already and driven by someone (a duplicate or late resume), suspended on
        # another gate, or ended: report, take nothing over.
        return ExecutionResult.from_state(state)

    async def _wake(
        self, lease: WorkerLease, package: ExecutionPackage, state: ExecutionState | None
    ) -> ExecutionResult:
        state = _require(package, state)
        position = package.wake_position
        woken = None
        if position is not None:
            _, woken = await self.runtime.fire_timer(state.execution_id, position)
        if woken is None:
            # Not due, already fired, or the execution moved on: report, take nothing over.
            return await self._report(state)
        return await _settled(woken)

    async def _continue(
        self, lease: WorkerLease, package: ExecutionPackage, state: ExecutionState | None
    ) -> ExecutionResult:
        state = _require(package, state)
        if state.status is ExecutionStatus.SUSPENDED:
            # A lost-response redispatch (nothing re-runs), or a parent whose child ended
            # without telling it (the process between the two died): runtime.recover tells
            # it now, once, and the parent goes on from its gate.
            return await _settled(await self.runtime.recover(state.execution_id))
        if state.status not in _LIVE:
            # Terminal: a lost-response redispatch. Report, re-run nothing.
            return ExecutionResult.from_state(state)
        holder = lease.holder or await self.runtime.acquire_lease(state.execution_id)
        return await _settled(await self.runtime.recover(state.execution_id, holder=holder))

    async def _report(self, state: ExecutionState) -> ExecutionResult:
        return ExecutionResult.from_state(
            await self.runtime.load_state(state.execution_id) or state
        )

    async def release(self, lease: WorkerLease) -> None:
        self._leases.pop(lease.lease_id, None)

    async def health(self) -> Health:
        return Health(True, len(self._leases), {"worker": self.name})


#: Package metadata a start records in the execution's own start record (a child's parent).
_RECORDED = ("loom.parent_id", "loom.parent_position")


def _start_metadata(package: ExecutionPackage) -> dict[str, Any] | None:
    metadata = {k: package.metadata[k] for k in _RECORDED if k in package.metadata}
    if package.workflow_id:
        metadata["workflow_id"] = package.workflow_id
    return metadata or None


def _require(package: ExecutionPackage, state: ExecutionState | None) -> ExecutionState:
    if state is None:
        raise ExecutionNotFoundError(
            f"cannot {package.intent} {package.execution_id!r}: it does not exist in this "
            "worker's store",
            execution_id=package.execution_id,
        )
    return state


async def _settled(handle: ExecutionHandle[Any]) -> ExecutionResult:
    return ExecutionResult.from_state(await handle.settled())


def _delivered(state: ExecutionState, event_type: str) -> bool:
    """Whether a decision for ``event_type`` is in the log (so a resume is a duplicate)."""
    return any(
        op.kind == OpKind.GATE and op.name == event_type and op.outcome is WaitOutcome.DECIDED
        for op in state.ops.values()
    )
