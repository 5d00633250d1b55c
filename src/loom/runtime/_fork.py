"""Fork and promote: a branch is a new execution whose log starts as a prefix of another's.

``runtime.fork(parent, at)`` writes, in ONE atomic append under the branch's first fence, the
parent's events ``0..at`` (same sequences, types and payloads: sequence 0 stays the parent's
``EXECUTION_STARTED``, so the branch runs the same flow version on the same input), then the
branch's own first record, ``EXECUTION_FORKED`` (parent, fork point, flow, version, branch
name), and when the fork point is an open gate, that gate re-opened with a fresh deadline. A
snapshot of the folded branch is stored right away, so loading the branch reads that snapshot
plus its own tail, never the parent's history. The parent is only read: its log, fence,
status and timers are untouched. Blobs are content-addressed per tenant, so the branch shares
the parent's (nothing is copied); a tenant view can only name its own executions, so a fork
never crosses tenants.

``runtime.promote(from_ref, to_ref, by=...)`` fast-forwards a ref onto a branch and, when the
target pointed at the parent the branch was forked from at a gate, then closes that gate on the
parent with a recorded ``branches.gate_superseded`` (and ends the parent, cancelled, with the
reason): a later approval of the parent is refused with :class:`GateSupersededError`. The ref
moves first so that a promotion losing the registry's compare-and-swap has closed nothing; the
close is idempotent, so re-running a promotion stopped in between completes it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loom.errors import (
    ConfigurationError,
    DuplicateSequenceError,
    ExecutionNotFoundError,
    ForkError,
    GateSupersededError,
    PromotionConflictError,
    RefNotFoundError,
    StaleFenceError,
    StorageError,
)
from loom.model import (
    Envelope,
    ExecutionCancelled,
    ExecutionForked,
    ExecutionState,
    ExecutionStatus,
    ExecutionSuspended,
    Gate,
    OpKind,
    OpStatus,
    Payload,
    new_envelope_id,
    register_event,
    replay,
)
from loom.runtime._cancel import DEADLINE_KEY, DEADLINE_POSITION
from loom.runtime._children import CHILD_GATE_PREFIX
from loom.storage import BranchRef, BranchRegistry, Snapshot, Timer
from loom.storage._branches import check_ref_name, promoted, put_conflict

if TYPE_CHECKING:
    from loom.runtime._runtime import WorkflowRuntime

__all__ = ["SUPERSEDED_EVENT", "Branch", "GateSuperseded", "fork", "promote", "superseded_gate"]

SUPERSEDED_EVENT = "branches.gate_superseded"
_TIMER_EVENT = "loom.timer"
_RETRIES = 8


@dataclass(frozen=True, slots=True)
class GateSuperseded(Payload):
    """The gate at ``position`` was closed because ``branch`` (forked at it) was promoted."""

    position: int
    event_type: str
    branch: str
    ref: str | None = None
    to_ref: str | None = None
    by: str | None = None
    reason: str | None = None


def _fold_superseded(state: ExecutionState, e: GateSuperseded, env: Envelope) -> None:
    op = state.ops.get(e.position)
    if op is None or op.status is not OpStatus.WAITING:
        raise ValueError(f"no gate waits at position {e.position}")
    op.resolve(None, superseded_by=e.branch)
    state.waiting = None


register_event(SUPERSEDED_EVENT, GateSuperseded, _fold_superseded)


def superseded_gate(state: ExecutionState, event_type: str) -> str | None:
    """The branch that superseded ``state``'s gate of ``event_type``, if a promotion did."""
    for op in state.ops.values():
        if (
            op.kind == OpKind.GATE
            and op.name == event_type
            and isinstance(op.output, dict)
            and op.output.get("superseded_by")
        ):
            return str(op.output["superseded_by"])
    return None


@dataclass(frozen=True, slots=True)
class Branch:
    """A fork: the new execution, where it came from, its folded state and its ref (if named).

    ``state.waiting`` is the re-opened gate when the fork point was one (resume it with
    ``runtime.resume(branch.execution_id, ...)``); a branch forked between steps is
    ``running`` with nobody driving it: ``runtime.recover(branch.execution_id)`` runs it on.
    """

    execution_id: str
    parent_id: str
    at_sequence: int
    state: ExecutionState
    ref: BranchRef | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "parent_id": self.parent_id,
            "at_sequence": self.at_sequence,
            "status": self.state.status.value,
            "waiting": None if self.state.waiting is None else self.state.waiting.to_dict(),
            "last_sequence": self.state.last_sequence,
            "ref": None if self.ref is None else self.ref.to_dict(),
        }


def registry_of(runtime: WorkflowRuntime) -> BranchRegistry:
    store = runtime.store
    if not isinstance(store, BranchRegistry):
        raise ConfigurationError(
            f"{type(store).__name__} keeps no branch refs",
            hint="Use a store that implements loom.storage.BranchRegistry (every Loom store)",
        )
    return store


def _fork_point(parent_id: str, state: ExecutionState, at: int, head: int) -> None:
    """Refuse a fork point the branch could not continue from."""
    if state.is_terminal:
        raise ForkError(
            f"sequence {at} of execution {parent_id!r} is its end ({state.status}); a fork "
            "there would have nothing to run",
            execution_id=parent_id,
            at_sequence=at,
            head=head,
            hint="Fork at an earlier sequence",
        )
    waiting = state.waiting
    if waiting is not None and waiting.event_type.startswith(CHILD_GATE_PREFIX):
        child = waiting.event_type[len(CHILD_GATE_PREFIX) :]
        raise ForkError(
            f"sequence {at} of execution {parent_id!r} waits on its child execution "
            f"{child!r}, which reports to {parent_id!r} only; a branch there would wait forever",
            execution_id=parent_id,
            at_sequence=at,
            head=head,
            hint="Fork before the child started, or after the parent took its outcome",
        )
    for pos, op in state.ops.items():
        if op.kind == OpKind.STEP and op.status in (OpStatus.STARTED, OpStatus.RETRYING):
            raise ForkError(
                f"sequence {at} of execution {parent_id!r} is inside step {op.name!r} "
                f"(position {pos}: attempt {op.attempts} {op.status.value}, no final record "
                "yet); a branch cannot start halfway through an effect",
                execution_id=parent_id,
                at_sequence=at,
                head=head,
            )


async def fork(
    runtime: WorkflowRuntime,
    parent_id: str,
    at_sequence: int | None = None,
    *,
    branch: str | None = None,
    execution_id: str | None = None,
    simulation: bool = False,
) -> Branch:
    """See :meth:`loom.WorkflowRuntime.fork`."""
    runtime._check_open()
    store = runtime.store
    registry = registry_of(runtime) if branch is not None else None
    if branch is not None:
        check_ref_name(branch, scoped=False)
    head = await store.last_sequence(parent_id)
    if head < 0:
        raise ExecutionNotFoundError(
            f"no execution {parent_id!r} to fork in this store", execution_id=parent_id
        )
    at = head if at_sequence is None else at_sequence
    if type(at) is not int or not 0 <= at <= head:
        raise ForkError(
            f"cannot fork execution {parent_id!r} at sequence {at!r}: its log holds "
            f"sequences 0..{head}",
            execution_id=parent_id,
            at_sequence=at if type(at) is int else None,
            head=head,
            hint=f"Fork at a sequence between 0 and {head}; `loom logs {parent_id}` shows them",
        )
    prefix = await store.read(parent_id, limit=at + 1)
    if len(prefix) != at + 1:
        raise StorageError(
            f"execution {parent_id!r} returned {len(prefix)} events for sequences 0..{at}",
            execution_id=parent_id,
        )
    parent_state = replay(prefix)
    _fork_point(parent_id, parent_state, at, head)
    eid = execution_id or new_envelope_id()
    runtime_check_id(eid)
    if eid == parent_id:
        raise ConfigurationError("a branch needs its own execution id, not its parent's")
    now = runtime.clock.now()
    # Same sequences, types and payload bytes (checksummed as stored); new ids and fence 1.
    copied = [
        dataclasses.replace(e, execution_id=eid, envelope_id=new_envelope_id(), fence=1)
        for e in prefix
    ]
    source: dict[str, Any] = {
        "parent_id": parent_id,
        "at_sequence": at,
        "flow_id": parent_state.flow_id,
        "flow_version": parent_state.flow_version,
    }
    if branch is not None:
        source["branch"] = branch
    if simulation:
        source["simulation"] = True
    own: list[Any] = [ExecutionForked(source)]
    gate = parent_state.waiting
    timer: Timer | None = None
    if gate is not None and parent_state.status is ExecutionStatus.SUSPENDED:
        if gate.event_type == _TIMER_EVENT:
            if gate.timeout_at is not None:  # a durable sleep ends when it was due to
                timer = Timer(eid, gate.position, gate.timeout_at, "sleep", parent_state.flow_id)
        else:
            # The gate re-opens with a fresh deadline of the same length: the parent's may
            # have passed, and its decision (if any came later) is never the branch's.
            deadline = None
            if gate.timeout_at is not None:
                opened = _opened_at(prefix, gate.position)
                deadline = now + max(0.0, gate.timeout_at - opened)
                timer = Timer(eid, gate.position, deadline, "gate_timeout", parent_state.flow_id)
            own.append(
                ExecutionSuspended(gate.position, gate.event_type, gate.correlation_key, deadline)
            )
    tail = [
        Envelope.of(eid, at + 1 + i, e, fence=1, recorded_at=now, limits=runtime.limits)
        for i, e in enumerate(own)
    ]
    envelopes = [*copied, *tail]
    state = replay(envelopes)  # checks the branch folds before anything is written
    if registry is not None and branch is not None:
        taken = await registry.get_ref(branch)
        if taken is not None:
            # Checked before writing so a taken name leaves no branch behind. (Two forks
            # racing for one new name can both write; the loser's put_ref then refuses and
            # its execution stays, unnamed: harmless, and listed by `children`.)
            put_conflict(taken, eid, state.last_sequence)
    if runtime._timer_store is not None:
        # Stored before the wait is logged, as every timer is: a crash in between leaves a
        # timer that finds nothing (harmless), never a wait nothing ends.
        if timer is not None:
            await runtime._schedule_timer(timer)
        deadline_at = parent_state.metadata.get(DEADLINE_KEY)
        if isinstance(deadline_at, int | float):
            # The execution's own deadline (start(deadline=...)) binds its branches too.
            await runtime._timer_store.schedule_timer(
                Timer(eid, DEADLINE_POSITION, float(deadline_at), "deadline", state.flow_id)
            )
    await store.take_over(envelopes, from_fence=0)
    try:
        await store.save_snapshot(Snapshot(eid, state.last_sequence, state.to_stored()))
    except StorageError:
        pass  # a snapshot only saves time: the branch still loads, from its log
    ref = None
    if registry is not None and branch is not None:
        ref = await registry.put_ref(
            branch, eid, state.last_sequence, forked_from=parent_id, fork_sequence=at
        )
    return Branch(eid, parent_id, at, state, ref)


def runtime_check_id(execution_id: str) -> None:
    from loom.model import execution_id_problem

    problem = execution_id_problem(execution_id)
    if problem is not None:
        raise ConfigurationError(f"{problem} (got {execution_id!r})")


def _opened_at(prefix: list[Envelope], position: int) -> float:
    for env in reversed(prefix):
        if env.type == "EXECUTION_SUSPENDED" and env.payload.get("position") == position:
            return env.recorded_at
    return prefix[-1].recorded_at


async def promote(
    runtime: WorkflowRuntime, from_ref: str, to_ref: str, *, by: str, reason: str | None = None
) -> BranchRef:
    """See :meth:`loom.WorkflowRuntime.promote`."""
    runtime._check_open()
    registry = registry_of(runtime)
    src = await registry.get_ref(from_ref)
    dst = await registry.get_ref(to_ref)
    for name, ref in ((from_ref, src), (to_ref, dst)):
        if ref is None:
            raise RefNotFoundError(f"no ref {name!r}", ref=name)
    assert src is not None and dst is not None
    # The registry's own rule, checked first: a promotion that cannot happen reads no more.
    promoted(src, dst, by=by, reason=reason, now=0.0)
    gate: Gate | None = None
    forked = src.forked_from is not None and src.fork_sequence is not None
    if forked and dst.execution_id == src.forked_from:
        gate = await _gate_at_fork(runtime, src)
        if gate is not None:
            await _closable(runtime, src, gate, to_ref, strict=True)
    elif (
        forked
        and dst.execution_id == src.execution_id
        and dst.promoted_from == src.name
        and (dst.forked_from, dst.fork_sequence) == (src.forked_from, src.fork_sequence)
    ):
        # The ref already points at this branch by this very promotion: a retry after a
        # crash between the ref's move and the gate's close completes it.
        gate = await _gate_at_fork(runtime, src)
    # The ref moves first, by compare-and-swap: a promotion that loses it has touched
    # nothing, so the parent's gate stays open and approvable. Only then is the gate closed
    # (idempotently: a retried promotion finds it closed by this branch already).
    moved = await registry.promote(from_ref, to_ref, by=by, reason=reason)
    if gate is not None:
        await _supersede(runtime, src, gate, to_ref, by, reason)
    return moved


async def _gate_at_fork(runtime: WorkflowRuntime, src: BranchRef) -> Gate | None:
    """The parent's gate ``src`` was forked at, or None (forked between steps, at a sleep)."""
    assert src.forked_from is not None and src.fork_sequence is not None
    then = await runtime.load_state(src.forked_from, at_sequence=src.fork_sequence)
    if then is None or then.status is not ExecutionStatus.SUSPENDED or then.waiting is None:
        return None
    if then.waiting.event_type == _TIMER_EVENT:
        return None
    return then.waiting


async def _closable(
    runtime: WorkflowRuntime, src: BranchRef, gate: Gate, to_ref: str, *, strict: bool
) -> ExecutionState | None:
    """The parent's state if its gate can be closed for ``src`` now; None when ``src``
    closed it already. A gate closed by another branch, or a decision the parent already
    took, raise :class:`PromotionConflictError` (``strict``: before the ref moved)."""
    parent = src.forked_from
    assert parent is not None and src.fork_sequence is not None
    state = await runtime.load_state(parent)
    if state is None:
        return None
    by_branch = superseded_gate(state, gate.event_type)
    if by_branch == src.execution_id:
        return None  # a retried promotion: already recorded
    moved = "" if strict else f" (ref {to_ref!r} was moved onto {src.execution_id!r} already)"
    if by_branch is not None:
        raise PromotionConflictError(
            f"the gate {gate.event_type!r} of {parent!r} was already superseded by branch "
            f"{by_branch!r}; {src.name!r} cannot replace it{moved}",
            execution_id=parent,
            ref=to_ref,
            expected=[parent, src.fork_sequence],
            actual=[by_branch, None],
        )
    waiting = state.waiting
    if (
        state.status is not ExecutionStatus.SUSPENDED
        or waiting is None
        or waiting.position != gate.position
    ):
        raise PromotionConflictError(
            f"execution {parent!r} no longer waits at the gate {gate.event_type!r} "
            f"(position {gate.position}) that {src.name!r} was forked at: it is "
            f"{state.status}; the branch cannot replace a decision already taken{moved}",
            execution_id=parent,
            ref=to_ref,
            expected=[parent, src.fork_sequence],
            actual=[parent, state.last_sequence],
        )
    return state


async def _supersede(
    runtime: WorkflowRuntime,
    src: BranchRef,
    gate: Gate,
    to_ref: str,
    by: str,
    reason: str | None,
) -> None:
    """Close the parent's ``gate`` that ``src`` was forked at (once)."""
    parent = src.forked_from
    assert parent is not None
    for _ in range(_RETRIES):
        if await _closable(runtime, src, gate, to_ref, strict=False) is None:
            return
        state, snap_seq = await runtime._load(parent)
        if state is None:
            return
        why = f"gate {gate.event_type!r} superseded by branch {src.execution_id!r}"
        why += f" (ref {src.name!r} promoted to {to_ref!r} by {by})"
        events: list[Any] = [
            GateSuperseded(
                gate.position, gate.event_type, src.execution_id, src.name, to_ref, by, reason
            ),
            ExecutionCancelled(why if reason is None else f"{why}: {reason}"),
        ]
        current = await runtime.store.current_fence(parent)
        driver = runtime._new_driver(state, current + 1, last_snapshot=snap_seq)
        try:
            await driver.take_over(events, from_fence=current)
        except (StaleFenceError, DuplicateSequenceError) as exc:
            if exc.execution_id != parent:
                raise
            continue  # the parent moved meanwhile: look again
        if runtime._timer_store is not None:
            await runtime._timer_store.cancel_timers(parent)
        return
    raise StorageError(
        f"could not close the gate of {parent!r}: it kept changing", execution_id=parent
    )


def refuse_superseded(state: ExecutionState, event_type: str) -> None:
    """Raise :class:`GateSupersededError` if a promotion closed ``state``'s gate."""
    branch = superseded_gate(state, event_type)
    if branch is not None:
        raise GateSupersededError(
            f"gate {event_type!r} of execution {state.execution_id!r} was superseded by the "
            f"promoted branch {branch!r}; the decision is refused",
            execution_id=state.execution_id,
            event_type=event_type,
            superseded_by=branch,
        )
