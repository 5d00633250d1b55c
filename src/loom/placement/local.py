"""LocalWorkerRuntime: the zero-cloud worker, running packages on an in-process runtime."""

from __future__ import annotations

import uuid
from typing import Any

from loom.errors import ConfigurationError, ExecutionNotFoundError, NotWaitingError, StorageError
from loom.model import ExecutionStatus, execution_id_problem
from loom.placement._spi import Health, WorkerLease, is_redispatch
from loom.placement._wire import ExecutionPackage, ExecutionResult, ResumeEvent
from loom.runtime import ExecutionHandle, WorkflowRuntime
from loom.storage import Timer

__all__ = ["TIMER_WAKE", "LocalWorkerRuntime", "timer_package"]

#: The resume event of a timer wake package (the payload names the waiting position).
TIMER_WAKE = "loom.timer-wake"


def timer_package(timer: Timer) -> ExecutionPackage:
    """The package a TimerService dispatches to wake ``timer``'s execution."""
    return ExecutionPackage(
        execution_id=timer.execution_id,
        flow_id=timer.flow_id or "unknown",
        resume_event=ResumeEvent(TIMER_WAKE, {"position": timer.position}),
    )


def _timer_position(package: ExecutionPackage) -> int | None:
    payload = package.resume_event.payload if package.resume_event else None
    position = payload.get("position") if isinstance(payload, dict) else None
    return position if isinstance(position, int) else None


class LocalWorkerRuntime:
    """Runs a package on ``runtime`` (its "code bundle"). Every attempt takes a new fence in
    :meth:`allocate`, so a redispatch always supersedes the attempt before it."""

    def __init__(self, runtime: WorkflowRuntime, *, name: str = "local") -> None:
        self.runtime = runtime
        self.name = name
        self._leases: dict[str, WorkerLease] = {}

    async def allocate(self, package: ExecutionPackage) -> WorkerLease:
        # A start or redispatch may need to take over from a dead holder, so it is fenced up
        # front (ADR 0004). A resume or timer wake is not: it continues a waiting execution
        # through a conditional take-over in execute(), so a duplicate or late one can never
        # fence out the holder that already moved the execution on (fence 0 = none yet).
        problem = execution_id_problem(package.execution_id)
        if problem is not None:
            # Refused before the fence below: a malformed id must not leave even that behind.
            raise ConfigurationError(f"cannot allocate: {problem} (got {package.execution_id!r})")
        fence = 0
        if package.resume_event is None:
            fence = await self.runtime.store.acquire_fence(package.execution_id)
        lease = WorkerLease(uuid.uuid4().hex, package.execution_id, fence, self.name)
        self._leases[lease.lease_id] = lease
        return lease

    async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
        """The idempotent execute of ADR 0004: start, resume, recover or just report."""
        rt = self.runtime
        eid = package.execution_id
        state = await rt.load_state(eid)
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
        handle: ExecutionHandle[Any]
        if state is None:
            if package.resume_event is not None:
                raise ExecutionNotFoundError(
                    f"cannot resume {eid!r}: it does not exist in this worker's store",
                    execution_id=eid,
                )
            handle = await rt.start(
                package.flow_id,
                package.input,
                execution_id=eid,
                fence=lease.fence,
                flow_version=package.flow_version,
                metadata={"workflow_id": package.workflow_id} if package.workflow_id else None,
            )
        elif package.resume_event is not None and package.resume_event.event_type == TIMER_WAKE:
            position = _timer_position(package)
            woken = None
            if position is not None:
                _, woken = await rt.fire_timer(eid, position)
            if woken is None:
                # Not due, already fired, or the execution moved on: report, take nothing over.
                state = await rt.load_state(eid) or state
                return ExecutionResult.from_state(state)
            handle = woken
        elif (
            package.resume_event is not None
            and state.status is ExecutionStatus.SUSPENDED
            and state.waiting is not None
            and state.waiting.event_type == package.resume_event.event_type
        ):
            event = package.resume_event
            try:
                handle = await rt.resume(eid, event.event_type, event.payload)
            except NotWaitingError:
                # Another decision or holder moved first (a duplicate or late dispatch):
                # report what the log says now.
                state = await rt.load_state(eid) or state
                return ExecutionResult.from_state(state)
        elif state.status in (ExecutionStatus.RUNNING, ExecutionStatus.PENDING):
            if package.resume_event is not None and not is_redispatch(package):
                # The decision was applied already and someone is driving: a duplicate or
                # late resume must not take over the live holder. Only a dispatcher's retry
                # after its own failed attempt (the holder died mid-resume) recovers it.
                return ExecutionResult.from_state(state)
            fence = lease.fence or await rt.store.acquire_fence(eid)
            handle = await rt.recover(eid, fence=fence)
        else:
            # Suspended or terminal: a lost-response redispatch. Report, re-run nothing.
            return ExecutionResult.from_state(state)
        return ExecutionResult.from_state(await handle.settled())

    async def release(self, lease: WorkerLease) -> None:
        self._leases.pop(lease.lease_id, None)

    async def health(self) -> Health:
        return Health(True, len(self._leases), {"worker": self.name})
