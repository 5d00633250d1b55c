"""The placement SPI: WorkerRuntime (where code runs) and ExecutionDispatcher (retry, timeout,
supervision), plus the one predicate every layer agrees on: is_superseded_refusal."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from loom.placement._wire import ExecutionPackage, ExecutionResult
from loom.runtime import Lease

__all__ = [
    "DISPATCHER_SPI_VERSION",
    "ExecutionDispatcher",
    "Health",
    "WorkerLease",
    "WorkerRuntime",
    "is_redispatch",
    "is_superseded_refusal",
    "mark_redispatch",
]

#: 1.1.0: a dispatcher MUST NOT retry or redispatch on a superseded refusal (ADR 0004, L20).
DISPATCHER_SPI_VERSION = "1.1.0"


def mark_redispatch(package: ExecutionPackage) -> ExecutionPackage:
    """The same package, marked as a retry after this dispatcher's own failed attempt: the
    worker may then take over a running execution that a resume left (ADR 0004)."""
    return package if package.redispatch else replace(package, redispatch=True)


def is_redispatch(package: ExecutionPackage) -> bool:
    """Whether ``package`` is a dispatcher's retry after its own failed attempt."""
    return package.redispatch


_SUPERSEDED_NAMES = frozenset(
    {"ExecutionAlreadyExistsError", "StaleFenceError", "ExecutionSupersededError"}
)


def is_superseded_refusal(err: BaseException, execution_id: str) -> bool:
    """True when ``err`` says another holder owns ``execution_id`` (do not retry it).

    That is an ``ExecutionAlreadyExistsError`` (a start lost the sequence-0 race), a
    ``StaleFenceError`` (a newer fence superseded this attempt) or an
    ``ExecutionSupersededError`` (the same, reported by a remote worker), bare or anywhere in
    the ``__cause__`` chain (e.g. under a ``StorageWriteError``), and only if the error names
    THIS execution: a coalesced batch may report another execution's refusal, which for this
    one is a genuine failure. Matching is by class name, so a second copy of the error classes
    (another bundled Loom) cannot hide a refusal. A ``StartFencedOutError`` is not a refusal:
    nothing ran, and the start must be retried.
    """
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names = {cls.__name__ for cls in type(current).__mro__}
        if names & _SUPERSEDED_NAMES and getattr(current, "execution_id", None) == execution_id:
            return True
        current = current.__cause__
    return False


@dataclass(frozen=True, slots=True)
class WorkerLease:
    """A compute allocation for one attempt. ``fence`` is the attempt's fencing token (0 when
    the attempt holds none yet: a resume or wake takes over conditionally instead)."""

    lease_id: str
    execution_id: str
    fence: int
    worker: str = "local"

    @property
    def holder(self) -> Lease | None:
        """The runtime lease this allocation holds, or None when it took no fence."""
        return Lease(self.execution_id, self.fence) if self.fence > 0 else None


@dataclass(frozen=True, slots=True)
class Health:
    healthy: bool
    in_flight: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class WorkerRuntime(Protocol):
    """Runs packages: ``allocate`` -> ``execute`` -> ``release`` per attempt.

    ``execute`` runs to suspend-or-complete and returns; it is idempotent under redispatch
    (no events: start; running/pending: resume from the newest snapshot with
    EXECUTION_RECOVERED; suspended or terminal: return the folded state, re-running nothing).
    It raises on a failed attempt; a superseded refusal names the execution (see
    :func:`is_superseded_refusal`).
    """

    async def allocate(self, package: ExecutionPackage) -> WorkerLease: ...

    async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult: ...

    async def release(self, lease: WorkerLease) -> None: ...

    async def health(self) -> Health: ...


@runtime_checkable
class ExecutionDispatcher(Protocol):
    """Decides where and how often a package runs (SPI :data:`DISPATCHER_SPI_VERSION`).

    ``dispatch`` returns the worker's result, flow failures included (an outcome, never
    retried). It raises when every attempt failed, and rethrows a superseded refusal at once:
    another holder owns the execution, so a caller that needs the outcome awaits it by id
    (``load_state``) instead of treating the refusal as the execution failing.
    """

    spi_version: str

    async def dispatch(self, package: ExecutionPackage) -> ExecutionResult: ...

    async def cancel(self, execution_id: str) -> None: ...

    async def health(self) -> Health: ...
