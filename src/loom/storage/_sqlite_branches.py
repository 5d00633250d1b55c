"""SQLiteStore's BranchRegistry side: refs in ``loom_refs``, each move one write transaction.

Every move reads the ref and writes it inside the store's ``BEGIN IMMEDIATE`` transaction
(the writer's group commit), so SQLite's write lock makes the compare-and-swap exclusive
across every process using the file. A refusal raises before anything is written.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from loom.errors import RefNotFoundError
from loom.model import ExecutionSummary
from loom.storage._branches import (
    REF_COLUMNS,
    BranchRef,
    check_move,
    check_new_ref,
    check_ref_name,
    check_tip,
    lineage,
    promoted,
    put_conflict,
    ref_from_row,
    ref_row,
)
from loom.storage._spi import ExecutionIndex

__all__ = ["SQLiteBranches"]

_SELECT = f"SELECT {REF_COLUMNS} FROM loom_refs"
_UPSERT = f"INSERT OR REPLACE INTO loom_refs ({REF_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


def _get(conn: sqlite3.Connection, name: str) -> BranchRef | None:
    row = conn.execute(f"{_SELECT} WHERE name = ?", (name,)).fetchone()
    return None if row is None else ref_from_row(row)


def _need(conn: sqlite3.Connection, name: str) -> BranchRef:
    ref = _get(conn, name)
    if ref is None:
        raise RefNotFoundError(f"no ref {name!r}", ref=name)
    return ref


class SQLiteBranches:
    """Mixed into :class:`~loom.storage.SQLiteStore` (see the module docstring)."""

    if TYPE_CHECKING:

        def _reader(self) -> sqlite3.Connection: ...

        async def _submit(
            self,
            apply: Callable[[sqlite3.Connection], Any],
            notify: str | None,
            *,
            feed: bool = False,
        ) -> Any: ...

    async def put_ref(
        self,
        name: str,
        execution_id: str,
        tip: int,
        *,
        forked_from: str | None = None,
        fork_sequence: int | None = None,
    ) -> BranchRef:
        """See :meth:`loom.storage.BranchRegistry.put_ref`."""
        check_new_ref(name, execution_id, tip, fork_sequence)

        def apply(conn: sqlite3.Connection) -> BranchRef:
            existing = _get(conn, name)
            if existing is not None:
                return put_conflict(existing, execution_id, tip)
            ref = BranchRef(
                name, execution_id, tip, forked_from, fork_sequence, updated_at=time.time()
            )
            conn.execute(_UPSERT, ref_row(ref))
            return ref

        result: BranchRef = await self._submit(apply, None)
        return result

    async def get_ref(self, name: str) -> BranchRef | None:
        """See :meth:`loom.storage.BranchRegistry.get_ref`."""
        check_ref_name(name)
        return _get(self._reader(), name)

    async def move_tip(self, name: str, sequence: int, *, expected: int) -> BranchRef:
        """See :meth:`loom.storage.BranchRegistry.move_tip`."""
        check_ref_name(name)
        check_tip(sequence)

        def apply(conn: sqlite3.Connection) -> BranchRef:
            ref = _need(conn, name)
            # Read inside the write transaction: the head cannot move under the check.
            row = conn.execute(
                "SELECT max(sequence) FROM loom_events WHERE execution_id = ?",
                (ref.execution_id,),
            ).fetchone()
            head = -1 if row is None or row[0] is None else int(row[0])
            check_move(ref, sequence, expected=expected, head=head)
            moved = replace(ref, tip=sequence, version=ref.version + 1, updated_at=time.time())
            conn.execute(_UPSERT, ref_row(moved))
            return moved

        result: BranchRef = await self._submit(apply, None)
        return result

    async def promote(
        self, from_ref: str, to_ref: str, *, by: str, reason: str | None = None
    ) -> BranchRef:
        """See :meth:`loom.storage.BranchRegistry.promote`."""
        check_ref_name(from_ref)
        check_ref_name(to_ref)

        def apply(conn: sqlite3.Connection) -> BranchRef:
            src, dst = _need(conn, from_ref), _need(conn, to_ref)
            moved = promoted(src, dst, by=by, reason=reason, now=time.time())
            conn.execute(_UPSERT, ref_row(moved))
            return moved

        result: BranchRef = await self._submit(apply, None)
        return result

    async def list_refs(self, prefix: str = "") -> list[BranchRef]:
        """See :meth:`loom.storage.BranchRegistry.list_refs`."""
        rows = (
            self._reader()
            .execute(f"{_SELECT} WHERE substr(name, 1, ?) = ? ORDER BY name", (len(prefix), prefix))
            .fetchall()
        )
        return [ref_from_row(r) for r in rows]

    async def children(self, execution_id: str) -> list[ExecutionSummary]:
        """See :meth:`loom.storage.BranchRegistry.children`."""
        return await lineage(cast(ExecutionIndex, self), execution_id)
