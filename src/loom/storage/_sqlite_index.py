"""SQLiteStore's ExecutionIndex reads: pages, counts, one summary and the change feed, all
on the calling thread's reader connection (the index rows are written with the events, in
the same transaction; see ``_sqlite_sql``)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from loom.model import ExecutionSummary
from loom.storage._index import SUMMARY_COLUMNS, encode_page_cursor, summary_from_row, where_clause
from loom.storage._spi import ExecutionPage, ExecutionQuery

__all__ = ["SQLiteIndexReads"]


class SQLiteIndexReads:
    """Mixed into :class:`~loom.storage.SQLiteStore` (see the module docstring)."""

    if TYPE_CHECKING:

        def _reader(self) -> sqlite3.Connection: ...

    async def list_executions(self, query: ExecutionQuery) -> ExecutionPage:
        """See :meth:`loom.storage.ExecutionIndex.list_executions`."""
        where, params = where_clause(query, "?", paged=True)
        limit = max(query.limit, 1)
        rows = (
            self._reader()
            .execute(
                f"SELECT {SUMMARY_COLUMNS} FROM loom_executions{where} "
                "ORDER BY created_at DESC, execution_id DESC LIMIT ?",
                (*params, limit + 1),
            )
            .fetchall()
        )
        items = [summary_from_row(r) for r in rows[:limit]]
        more = len(rows) > limit
        return ExecutionPage(items, encode_page_cursor(items[-1]) if more else None)

    async def count_executions(self, query: ExecutionQuery) -> int:
        """See :meth:`loom.storage.ExecutionIndex.count_executions`."""
        where, params = where_clause(query, "?", paged=False)
        row = self._reader().execute(f"SELECT count(*) FROM loom_executions{where}", params)
        return int(row.fetchone()[0])

    async def get_summary(self, execution_id: str) -> ExecutionSummary | None:
        """See :meth:`loom.storage.ExecutionIndex.get_summary`."""
        row = (
            self._reader()
            .execute(
                f"SELECT {SUMMARY_COLUMNS} FROM loom_executions WHERE execution_id = ?",
                (execution_id,),
            )
            .fetchone()
        )
        return None if row is None else summary_from_row(row)

    async def changes(
        self, after: int, limit: int = 100, *, id_prefix: str = ""
    ) -> list[ExecutionSummary]:
        """See :meth:`loom.storage.ExecutionIndex.changes`."""
        rows = (
            self._reader()
            .execute(
                f"SELECT {SUMMARY_COLUMNS} FROM loom_executions WHERE cursor > ? "
                "AND substr(execution_id, 1, ?) = ? ORDER BY cursor LIMIT ?",
                (after, len(id_prefix), id_prefix, max(limit, 1)),
            )
            .fetchall()
        )
        return [summary_from_row(r) for r in rows]
