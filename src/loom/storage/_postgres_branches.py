"""PostgresStore's BranchRegistry side: refs in ``{schema}.refs``.

Each move is one transaction on its own connection that locks the rows it reads
(``SELECT ... FOR UPDATE``, in name order so two promotions never deadlock), checks the
compare-and-swap in Python and writes the row: of racing moves from one state, across every
process and host, exactly one commits and the others see the moved row and are refused.
A put is ``INSERT ... ON CONFLICT DO NOTHING`` followed by a read of the winner.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar, cast

import psycopg

from loom.errors import LoomError, RefNotFoundError, StorageWriteError
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

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

__all__ = ["PostgresBranches"]

Conn = psycopg.AsyncConnection[tuple[Any, ...]]
T = TypeVar("T")


class PostgresBranches:
    """Mixed into :class:`~loom.storage.PostgresStore` (see the module docstring)."""

    if TYPE_CHECKING:
        schema: str

        async def _ensure_open(self) -> AsyncConnectionPool[Conn]: ...

        def _writable(self) -> None: ...

        async def _fetch(self, sql: str, params: Any) -> list[tuple[Any, ...]]: ...

    def _refs(self) -> str:
        return f'"{self.schema}".refs'

    async def _in_tx(self, work: Callable[[Conn], Awaitable[T]]) -> T:
        self._writable()
        pool = await self._ensure_open()
        try:
            async with pool.connection() as conn, conn.transaction():
                return await work(conn)
        except LoomError:
            raise
        except psycopg.Error as exc:
            raise StorageWriteError(
                f"PostgreSQL store ({self.schema}): a ref write failed: {exc}",
                hint="Nothing was changed unless the connection was lost at COMMIT; "
                "re-read the ref before retrying",
            ) from exc

    async def _locked(self, conn: Conn, names: list[str]) -> dict[str, BranchRef]:
        cur = await conn.execute(
            f"SELECT {REF_COLUMNS} FROM {self._refs()} WHERE name = ANY(%s) "
            "ORDER BY name FOR UPDATE",
            (sorted(set(names)),),
        )
        return {r.name: r for r in (ref_from_row(row) for row in await cur.fetchall())}

    async def _store_ref(self, conn: Conn, ref: BranchRef) -> None:
        await conn.execute(
            f"UPDATE {self._refs()} SET execution_id = %s, tip = %s, forked_from = %s, "
            "fork_sequence = %s, version = %s, updated_at = %s, updated_by = %s, "
            "promoted_from = %s, reason = %s WHERE name = %s",
            (*ref_row(ref)[1:], ref.name),
        )

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
        ref = BranchRef(name, execution_id, tip, forked_from, fork_sequence, updated_at=time.time())

        async def work(conn: Conn) -> BranchRef:
            marks = ", ".join(["%s"] * 10)
            cur = await conn.execute(
                f"INSERT INTO {self._refs()} ({REF_COLUMNS}) VALUES ({marks}) "
                "ON CONFLICT (name) DO NOTHING",
                ref_row(ref),
            )
            if cur.rowcount == 1:
                return ref
            existing = (await self._locked(conn, [name]))[name]
            return put_conflict(existing, execution_id, tip)

        return await self._in_tx(work)

    async def get_ref(self, name: str) -> BranchRef | None:
        """See :meth:`loom.storage.BranchRegistry.get_ref`."""
        check_ref_name(name)
        rows = await self._fetch(
            f"SELECT {REF_COLUMNS} FROM {self._refs()} WHERE name = %s", (name,)
        )
        return ref_from_row(rows[0]) if rows else None

    async def move_tip(self, name: str, sequence: int, *, expected: int) -> BranchRef:
        """See :meth:`loom.storage.BranchRegistry.move_tip`."""
        check_ref_name(name)
        check_tip(sequence)

        async def work(conn: Conn) -> BranchRef:
            ref = (await self._locked(conn, [name])).get(name)
            if ref is None:
                raise RefNotFoundError(f"no ref {name!r}", ref=name)
            cur = await conn.execute(
                f'SELECT next_sequence FROM "{self.schema}".heads WHERE execution_id = %s',
                (ref.execution_id,),
            )
            row = await cur.fetchone()
            check_move(ref, sequence, expected=expected, head=int(row[0]) - 1 if row else -1)
            moved = replace(ref, tip=sequence, version=ref.version + 1, updated_at=time.time())
            await self._store_ref(conn, moved)
            return moved

        return await self._in_tx(work)

    async def promote(
        self, from_ref: str, to_ref: str, *, by: str, reason: str | None = None
    ) -> BranchRef:
        """See :meth:`loom.storage.BranchRegistry.promote`."""
        check_ref_name(from_ref)
        check_ref_name(to_ref)

        async def work(conn: Conn) -> BranchRef:
            refs = await self._locked(conn, [from_ref, to_ref])
            for name in (from_ref, to_ref):
                if name not in refs:
                    raise RefNotFoundError(f"no ref {name!r}", ref=name)
            moved = promoted(refs[from_ref], refs[to_ref], by=by, reason=reason, now=time.time())
            await self._store_ref(conn, moved)
            return moved

        return await self._in_tx(work)

    async def list_refs(self, prefix: str = "") -> list[BranchRef]:
        """See :meth:`loom.storage.BranchRegistry.list_refs`."""
        rows = await self._fetch(
            f"SELECT {REF_COLUMNS} FROM {self._refs()} WHERE left(name, %s) = %s ORDER BY name",
            (len(prefix), prefix),
        )
        return [ref_from_row(r) for r in rows]

    async def children(self, execution_id: str) -> list[ExecutionSummary]:
        """See :meth:`loom.storage.BranchRegistry.children`."""
        return await lineage(cast(ExecutionIndex, self), execution_id)
