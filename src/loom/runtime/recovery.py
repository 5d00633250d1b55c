"""recover_abandoned: a maintenance pass that continues executions whose holder is gone."""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from loom.errors import ConfigurationError
from loom.model import ExecutionState, ExecutionStatus
from loom.runtime import _children
from loom.runtime._clock import Clock
from loom.runtime._runtime import ExecutionHandle, WorkflowRuntime
from loom.storage import LeaseStore

__all__ = ["RecoveryReport", "lease_expired", "recover_abandoned"]

log = logging.getLogger("loom.recovery")

IsAbandoned = Callable[[ExecutionState], bool | Awaitable[bool]]


@dataclass
class RecoveryReport:
    """What one pass did, by execution id."""

    recovered: list[str] = field(default_factory=list)
    #: running, but the predicate did not claim them (possibly live elsewhere): untouched
    not_claimed: list[str] = field(default_factory=list)
    #: claimed, but they settled (suspended or ended) before the pass acted: untouched
    settled: list[str] = field(default_factory=list)
    #: claimed, but the execution moved on after it was judged (a newer fence or sequence:
    #: another pass or holder is driving it): untouched, since the verdict is out of date
    moved: list[str] = field(default_factory=list)
    #: the resume raised; left for the next pass, with the error
    left: dict[str, BaseException] = field(default_factory=dict)
    #: recovered ``max_recoveries`` times already (a poison execution that keeps killing its
    #: holder): left running for an operator (``loom show`` / ``loom cancel`` / ``loom recover``)
    parked: list[str] = field(default_factory=list)
    #: final states of the recovered executions, when the pass waited for them
    outcomes: dict[str, ExecutionState] = field(default_factory=dict)


_LIVE = (ExecutionStatus.RUNNING, ExecutionStatus.PENDING)


def lease_expired(
    runtime: WorkflowRuntime, *, grace: float, clock: Clock | None = None
) -> Callable[[ExecutionState], Awaitable[bool]]:
    """A ready ``is_abandoned`` predicate for :func:`recover_abandoned`, from liveness leases.

    Every runtime heartbeats a lease (in its store) for each execution it drives, renewed every
    ``lease_ttl / 3`` seconds. An execution is judged abandoned when its lease expired more
    than ``grace`` seconds ago (its holder died, or froze: a SIGSTOPped or paused process stops
    renewing), or when it has no lease and its log has been idle for more than ``grace``
    seconds (its holder stopped driving it, or died before its first heartbeat).

    Pick ``grace`` at least ``lease_ttl`` and above the worst pause a live holder may take
    between renewals (GC, a slow store): a holder writes its first lease one beat
    (``lease_ttl / 3``) after it starts driving. A wrong verdict cannot corrupt the log: the
    old holder is fenced out, though its in-flight step may run twice. Needs a store that
    keeps leases (all of Loom's do).
    """
    store = runtime.store
    if not isinstance(store, LeaseStore):
        raise ConfigurationError(
            f"{type(store).__name__} keeps no leases, so lease_expired cannot judge",
            hint="Pass your own is_abandoned predicate to recover_abandoned",
        )
    leases: LeaseStore = store
    now = (clock or runtime.clock).now

    async def is_abandoned(state: ExecutionState) -> bool:
        expires = await leases.lease_expiry(state.execution_id)
        if expires is None:
            last = state.updated_at if state.updated_at is not None else state.started_at
            return last is None or now() > last + grace
        return now() > expires + grace

    return is_abandoned


async def recover_abandoned(
    runtime: WorkflowRuntime,
    *,
    is_abandoned: IsAbandoned,
    source: AsyncIterable[str] | None = None,
    wait: bool = True,
    timeout: float | None = None,
    max_recoveries: int | None = None,
) -> RecoveryReport:
    """Continue running/pending executions that ``is_abandoned`` claims have no live holder.

    ``is_abandoned`` is required and has no default, on purpose: a running execution owned by a
    healthy node elsewhere and one orphaned by a dead process are byte-identical in the log, so
    only the deployment can tell them apart. Defaulting to True would preempt live work;
    defaulting to False would recover nothing while looking as if it did. A predicate that
    wrongly claims a live execution cannot corrupt the log (the old holder is fenced out), but
    its in-flight step may run twice.

    Enumerates ``source`` (default: every execution id in the runtime's store), re-checks each
    claimed execution's status immediately before acting (one that settled meanwhile is
    skipped), and recovers it through the same EXECUTION_RECOVERED path a redispatch uses,
    conditionally on the fence and sequence the predicate judged: one that moved on since
    (another pass or holder took it) is reported as ``moved`` and left alone.
    A recovery that raises is left for the next pass. With ``wait`` the pass waits until each
    recovered execution suspends or ends.

    ``max_recoveries`` parks poison executions: one already recovered that many times (its
    ``EXECUTION_RECOVERED`` events count them, so the limit holds across passes and processes)
    is reported as ``parked`` and not recovered again, so a step that kills every holder cannot
    take healthy executions' workers down with it forever.
    """
    if not callable(is_abandoned):
        raise ConfigurationError(
            f"recover_abandoned needs an is_abandoned predicate, got {is_abandoned!r}",
            hint="Pass a callable that tells whether an execution's holder is gone "
            "(e.g. loom.lease_expired(grace=30))",
        )
    report = RecoveryReport()
    handles: dict[str, ExecutionHandle[Any]] = {}
    ids = source if source is not None else runtime.store.iterate_execution_ids()
    async for execution_id in ids:
        try:
            # The fence is read before the state: the take-over below is conditional on both,
            # so the pass acts only on what its predicate judged.
            judged_fence = await runtime.store.current_fence(execution_id)
            state, snap_seq = await runtime._load(execution_id)
            if state is not None and state.status is ExecutionStatus.SUSPENDED:
                # A parent waiting on a child that ended without telling it (the child's
                # process died in between) is told now; nothing else suspended is touched.
                await _children.recheck_wait(runtime, state)
                continue
            if state is None or state.status not in _LIVE:
                continue
            verdict = is_abandoned(state)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            if not verdict:
                report.not_claimed.append(execution_id)
                continue
            if max_recoveries is not None and state.recoveries >= max_recoveries:
                log.warning(
                    "recover_abandoned parked %s: recovered %d times already",
                    execution_id,
                    state.recoveries,
                )
                report.parked.append(execution_id)
                continue
            fresh = await runtime.load_state(execution_id)
            if fresh is None or fresh.status not in _LIVE:
                report.settled.append(execution_id)
                continue
            handle = None
            if fresh.last_sequence == state.last_sequence:
                handle = await runtime._recover_from(state, snap_seq, from_fence=judged_fence)
            if handle is None:
                log.info("recover_abandoned skipped %s: it moved after it was judged", execution_id)
                report.moved.append(execution_id)
                continue
            handles[execution_id] = handle
            report.recovered.append(execution_id)
        except Exception as exc:
            log.warning("recover_abandoned left %s for the next pass: %r", execution_id, exc)
            report.left[execution_id] = exc
    if wait:
        for execution_id, handle in handles.items():
            try:
                report.outcomes[execution_id] = await handle.settled(timeout)
            except Exception as exc:
                report.recovered.remove(execution_id)
                report.left[execution_id] = exc
    return report
