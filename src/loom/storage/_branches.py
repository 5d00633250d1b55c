"""The BranchRegistry SPI: named refs to (execution, sequence) points, moved by compare-and-swap.

A ref names a state of an execution: ``(execution_id, tip)``, the sequence its name stands
for. A fork registers its branch's ref with the point it was forked from (``forked_from``,
``fork_sequence``), which is what a promotion checks: :meth:`BranchRegistry.promote` is a
fast-forward, so it moves the target ref only while the target still points at an ancestor of
the branch (the parent at or before the fork point, or an earlier tip of the branch itself).
Of two branches forked at one gate only the first promoted wins, whatever the timing.

``children(execution_id)`` is the lineage: every execution forked from it, directly or through
other forks. Stores answer it from their execution index (the ``forked_from`` column), so it
needs no table of its own.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from loom.errors import (
    ConfigurationError,
    InvalidRefMoveError,
    InvalidRefNameError,
    PromotionConflictError,
    RefConflictError,
    RefExistsError,
)
from loom.model import ExecutionSummary, execution_id_problem
from loom.storage._spi import ExecutionIndex, ExecutionQuery

__all__ = [
    "MAX_REF_NAME",
    "REF_COLUMNS",
    "BranchRef",
    "BranchRegistry",
    "check_move",
    "check_ref_name",
    "check_target",
    "check_tip",
    "lineage",
    "promoted",
    "put_conflict",
    "ref_from_row",
    "ref_row",
]

MAX_REF_NAME = 200
_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_REF_NAME = re.compile(rf"{_SEGMENT}(/{_SEGMENT})*")


def check_ref_name(name: object, *, scoped: bool = True) -> str:
    """``name`` if it is a valid ref name, else :class:`InvalidRefNameError`.

    Letters, digits and ``. _ - /``: path-like (``sim/cautious``), no leading dot, dash or
    slash, no ``..``, no empty segment, at most 200 characters, so a name is safe in a URL, a
    shell and a file name alike. With ``scoped`` (what a store accepts) a tenant view's
    scoped form ``"<tenant>:<name>"`` is valid too.
    """
    local = name
    if scoped and isinstance(name, str) and ":" in name:
        tenant, _, local = name.partition(":")
        if not 0 < len(tenant) <= 64 or any(
            unicodedata.category(ch)[0] == "C" or ch.isspace() or ch == "/" for ch in tenant
        ):
            local = None
    if (
        not isinstance(local, str)
        or not 0 < len(local) <= MAX_REF_NAME
        or not _REF_NAME.fullmatch(local)
        or ".." in local
    ):
        raise InvalidRefNameError(f"{str(name)[:80]!r} is not a valid ref name", ref=str(name)[:80])
    return str(name)


def check_tip(sequence: object, what: str = "tip") -> int:
    if type(sequence) is not int or sequence < 0:
        raise ConfigurationError(f"a ref's {what} is a sequence >= 0, not {sequence!r}")
    return sequence


def check_target(execution_id: str) -> None:
    problem = execution_id_problem(execution_id)
    if problem is not None:
        raise ConfigurationError(f"{problem} (got {execution_id!r})")


def check_new_ref(name: str, execution_id: str, tip: int, fork_sequence: int | None) -> None:
    """What every store checks before ``put_ref`` touches anything (one rule, three stores)."""
    check_ref_name(name)
    check_target(execution_id)
    check_tip(tip)
    if fork_sequence is not None:
        check_tip(fork_sequence, "fork sequence")


@dataclass(frozen=True, slots=True)
class BranchRef:
    """A named point of an execution: ``(execution_id, tip)``.

    ``forked_from``/``fork_sequence``: where ``execution_id`` was forked from (None for a ref
    on an execution that is no fork). ``version`` grows by one with every move. ``updated_by``,
    ``promoted_from`` and ``reason`` describe the last promotion into this ref.
    """

    name: str
    execution_id: str
    tip: int
    forked_from: str | None = None
    fork_sequence: int | None = None
    version: int = 1
    updated_at: float = 0.0
    updated_by: str | None = None
    promoted_from: str | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the CLI's and the console's wire shape)."""
        return {
            "name": self.name,
            "execution_id": self.execution_id,
            "tip": self.tip,
            "forked_from": self.forked_from,
            "fork_sequence": self.fork_sequence,
            "version": self.version,
            "updated_at": self.updated_at,
            "updated_by": self.updated_by,
            "promoted_from": self.promoted_from,
            "reason": self.reason,
        }


@runtime_checkable
class BranchRegistry(Protocol):
    """Named refs with compare-and-swap moves, and the fork lineage of executions.

    Concurrency contract: every move is atomic and conditional on what the caller expects (a
    tip, or for a promotion that the target is still an ancestor of the branch); of racing
    moves from one state exactly one succeeds, across threads and processes, and the others
    raise :class:`~loom.errors.RefConflictError` (a promotion:
    :class:`~loom.errors.PromotionConflictError`) having changed nothing. Every method refuses
    an invalid name with :class:`~loom.errors.InvalidRefNameError` before touching anything.
    """

    async def put_ref(
        self,
        name: str,
        execution_id: str,
        tip: int,
        *,
        forked_from: str | None = None,
        fork_sequence: int | None = None,
    ) -> BranchRef:
        """Create ref ``name`` at ``(execution_id, tip)`` and return it.

        Idempotent: if the ref exists at that very point it is returned unchanged (a retried
        fork). A ref of that name pointing elsewhere raises :class:`RefExistsError`.
        """
        ...

    async def get_ref(self, name: str) -> BranchRef | None:
        """The ref, or None."""
        ...

    async def move_tip(self, name: str, sequence: int, *, expected: int) -> BranchRef:
        """Move the ref's tip to ``sequence`` (same execution) only if it is ``expected`` now.

        Raises :class:`RefNotFoundError`, or :class:`RefConflictError` (with ``expected`` and
        ``actual``) when the tip moved meanwhile.
        """
        ...

    async def promote(
        self, from_ref: str, to_ref: str, *, by: str, reason: str | None = None
    ) -> BranchRef:
        """Point ``to_ref`` where ``from_ref`` points, as a fast-forward, and return it.

        Allowed only while ``to_ref`` points at an ancestor of ``from_ref``'s state: the
        execution ``from_ref``'s was forked from, at or before the fork point, or
        ``from_ref``'s own execution at or before its tip. Otherwise
        :class:`PromotionConflictError`, nothing changed. Records ``by`` and ``reason``.
        """
        ...

    async def list_refs(self, prefix: str = "") -> list[BranchRef]:
        """Every ref whose name starts with ``prefix``, by name."""
        ...

    async def children(self, execution_id: str) -> list[ExecutionSummary]:
        """Every execution forked from ``execution_id``, directly or through other forks,
        breadth first (each level by execution id); ``[]`` when none."""
        ...


#: The column order of a stored ref (SQLite and PostgreSQL alike).
REF_COLUMNS = (
    "name, execution_id, tip, forked_from, fork_sequence, version, updated_at, updated_by, "
    "promoted_from, reason"
)


def ref_row(ref: BranchRef) -> tuple[Any, ...]:
    return (
        ref.name,
        ref.execution_id,
        ref.tip,
        ref.forked_from,
        ref.fork_sequence,
        ref.version,
        ref.updated_at,
        ref.updated_by,
        ref.promoted_from,
        ref.reason,
    )


def ref_from_row(row: Any) -> BranchRef:
    name, eid, tip, forked, fork_seq, version, at, by, promoted_from, reason = row
    return BranchRef(
        str(name),
        str(eid),
        int(tip),
        forked,
        None if fork_seq is None else int(fork_seq),
        int(version),
        float(at),
        by,
        promoted_from,
        reason,
    )


def put_conflict(existing: BranchRef, execution_id: str, tip: int) -> BranchRef:
    """What a put onto an existing ref returns: the ref (same point) or a refusal."""
    if existing.execution_id == execution_id and existing.tip == tip:
        return existing
    raise RefExistsError(
        f"ref {existing.name!r} already points at {existing.execution_id!r} sequence "
        f"{existing.tip}",
        ref=existing.name,
    )


def check_move(ref: BranchRef, sequence: int, *, expected: int, head: int) -> None:
    """Refuse a tip move that lost its compare-and-swap, goes backwards, or goes past
    ``head`` (the last sequence ``ref``'s execution has recorded; -1: none)."""
    if ref.tip != expected:
        raise RefConflictError(
            f"ref {ref.name!r} is at sequence {ref.tip}, not {expected}",
            ref=ref.name,
            expected=expected,
            actual=ref.tip,
        )
    if sequence < ref.tip:
        raise InvalidRefMoveError(
            f"ref {ref.name!r} is at sequence {ref.tip} of {ref.execution_id!r}; a tip only "
            f"moves forward, not back to {sequence}",
            ref=ref.name,
            execution_id=ref.execution_id,
            tip=ref.tip,
            sequence=sequence,
            head=head,
            hint=f"Name the earlier point with a new ref, or fork {ref.execution_id!r} there "
            f"(`loom fork {ref.execution_id} --at {sequence} --branch NAME`)",
        )
    if sequence > head:
        raise InvalidRefMoveError(
            f"ref {ref.name!r} cannot move to sequence {sequence}: execution "
            f"{ref.execution_id!r} has recorded "
            + ("nothing" if head < 0 else f"sequences 0..{head}"),
            ref=ref.name,
            execution_id=ref.execution_id,
            tip=ref.tip,
            sequence=sequence,
            head=head,
            hint=f"Move it to a sequence between {ref.tip} and {max(head, ref.tip)}; "
            f"`loom logs {ref.execution_id}` shows them",
        )


def promoted(
    src: BranchRef, dst: BranchRef, *, by: str, reason: str | None, now: float
) -> BranchRef:
    """``dst`` moved onto ``src`` (the registry's promotion rule), or a refusal."""
    if src.name == dst.name:
        raise RefConflictError(f"cannot promote ref {src.name!r} into itself", ref=src.name)
    if not isinstance(by, str) or not by.strip():
        raise ConfigurationError("a promotion names who made it: by='...'")
    from_parent = (
        src.forked_from is not None
        and src.fork_sequence is not None
        and dst.execution_id == src.forked_from
        and dst.tip <= src.fork_sequence
    )
    same_line = dst.execution_id == src.execution_id and dst.tip <= src.tip
    if not (from_parent or same_line):
        raise PromotionConflictError(
            f"cannot promote {src.name!r} into {dst.name!r}: {dst.name!r} points at "
            f"{dst.execution_id!r} sequence {dst.tip}, which is not what {src.name!r} was "
            f"forked from ({src.forked_from!r} sequence {src.fork_sequence}); another branch "
            "was promoted first, or the target moved on",
            ref=dst.name,
            expected=[src.forked_from, src.fork_sequence],
            actual=[dst.execution_id, dst.tip],
        )
    return replace(
        dst,
        execution_id=src.execution_id,
        tip=src.tip,
        forked_from=src.forked_from,
        fork_sequence=src.fork_sequence,
        version=dst.version + 1,
        updated_at=now,
        updated_by=by,
        promoted_from=src.name,
        reason=reason,
    )


async def lineage(index: ExecutionIndex, execution_id: str) -> list[ExecutionSummary]:
    """Every execution forked from ``execution_id``, recursively, breadth first, read from
    the index's ``forked_from`` column (one indexed listing per execution in the lineage)."""
    out: list[ExecutionSummary] = []
    seen = {execution_id}
    level = [execution_id]
    while level:
        below: list[ExecutionSummary] = []
        for parent in level:
            query = ExecutionQuery(forked_from=parent, limit=500)
            while True:
                page = await index.list_executions(query)
                below.extend(s for s in page.items if s.execution_id not in seen)
                if page.next_cursor is None:
                    break
                query = replace(query, cursor=page.next_cursor)
        below.sort(key=lambda s: s.execution_id)
        for s in below:
            seen.add(s.execution_id)
        out.extend(below)
        level = [s.execution_id for s in below]
    return out
