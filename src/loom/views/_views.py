"""ExecutionViews: queries, paged timelines and live feeds over any store with an index."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator
from typing import Any

from loom.errors import ConfigurationError, ExecutionNotFoundError
from loom.model import Envelope, ExecutionState, ExecutionSummary, replay
from loom.storage import EventStore, ExecutionIndex, ExecutionPage, ExecutionQuery

__all__ = ["ExecutionViews"]

_TERMINAL_TYPES = frozenset({"EXECUTION_COMPLETED", "EXECUTION_FAILED", "EXECUTION_CANCELLED"})


def _type_name(env: Envelope) -> str:
    value: Any = getattr(env.type, "value", env.type)
    return str(value)


class ExecutionViews:
    """Read-only views over ``store`` (an ``EventStore`` that is also an ``ExecutionIndex``:
    every Loom store and the tenant view). Nothing here writes.

    ``poll`` bounds how long a live iterator waits before re-checking (stores wake waiters on
    their own commits at once, and other processes' commits through their notification or
    poll).
    """

    def __init__(self, store: EventStore, *, poll: float = 1.0) -> None:
        if not isinstance(store, ExecutionIndex):
            raise ConfigurationError(
                f"{store!r} keeps no execution index, so it cannot be queried",
                hint="Use InMemoryStore, SQLiteStore, PostgresStore or a tenant view of one",
            )
        self.store = store
        self.index: ExecutionIndex = store
        self.poll = poll

    # ------------------------------------------------------------------ queries

    async def list(self, query: ExecutionQuery | None = None) -> ExecutionPage:
        """One page of executions, newest first (pass ``page.next_cursor`` as the next
        query's ``cursor``)."""
        return await self.index.list_executions(query or ExecutionQuery())

    async def count(self, query: ExecutionQuery | None = None) -> int:
        """How many executions match ``query``."""
        return await self.index.count_executions(query or ExecutionQuery())

    async def all(self, query: ExecutionQuery | None = None) -> AsyncIterator[ExecutionSummary]:
        """Every matching execution, page after page (newest first)."""
        q = query or ExecutionQuery()
        while True:
            page = await self.index.list_executions(q)
            for item in page.items:
                yield item
            if page.next_cursor is None:
                return
            q = ExecutionQuery(
                statuses=q.statuses,
                flow_id=q.flow_id,
                parent_id=q.parent_id,
                forked_from=q.forked_from,
                created_after=q.created_after,
                created_before=q.created_before,
                id_contains=q.id_contains,
                id_prefix=q.id_prefix,
                limit=q.limit,
                cursor=page.next_cursor,
            )

    async def summary(self, execution_id: str) -> ExecutionSummary:
        """The index's summary of one execution; ``ExecutionNotFoundError`` if there is none."""
        found = await self.index.get_summary(execution_id)
        if found is None:
            raise ExecutionNotFoundError(
                f"no execution {execution_id!r} in this store", execution_id=execution_id
            )
        return found

    # ------------------------------------------------------------------ one execution

    async def timeline(
        self, execution_id: str, *, after_sequence: int = -1, limit: int = 100
    ) -> builtins.list[Envelope]:
        """Up to ``limit`` envelopes after ``after_sequence``, in order (a page of the log;
        the next page starts after the last one's sequence)."""
        return await self.store.read(execution_id, from_sequence=after_sequence + 1, limit=limit)

    async def state_at(self, execution_id: str, sequence: int | None = None) -> ExecutionState:
        """The execution folded up to and including ``sequence`` (the whole log when None).

        Raises ``ExecutionNotFoundError`` for an unknown execution and ``ConfigurationError``
        for a sequence the log does not have yet.
        """
        if sequence is not None and sequence < 0:
            raise ConfigurationError(f"sequence must be >= 0, not {sequence}")
        limit = None if sequence is None else sequence + 1
        envelopes = await self.store.read(execution_id, limit=limit)
        if not envelopes:
            raise ExecutionNotFoundError(
                f"no execution {execution_id!r} in this store", execution_id=execution_id
            )
        if sequence is not None and envelopes[-1].sequence < sequence:
            raise ConfigurationError(
                f"execution {execution_id!r} has no sequence {sequence} yet (its last is "
                f"{envelopes[-1].sequence})",
                execution_id=execution_id,
            )
        return replay(envelopes)

    async def follow(
        self, execution_id: str, *, after_sequence: int = -1, page: int = 100
    ) -> AsyncIterator[Envelope]:
        """Every envelope after ``after_sequence`` as it commits; ends after the execution's
        terminal event. Waits (without polling the log) while nothing new is written."""
        last = after_sequence
        while True:
            batch = await self.store.read(execution_id, from_sequence=last + 1, limit=page)
            for env in batch:
                last = env.sequence
                yield env
                if _type_name(env) in _TERMINAL_TYPES:
                    return
            if len(batch) < page:
                await self.store.wait_for_append(execution_id, last, timeout=self.poll)

    async def feed(
        self, after_cursor: int = 0, *, id_prefix: str = "", page: int = 100
    ) -> AsyncIterator[ExecutionSummary]:
        """Every summary change after ``after_cursor`` in commit order, forever (stop by
        breaking out of the loop). An execution that changed several times between two reads
        shows once, as it is now; each item's ``cursor`` is where to resume."""
        after = after_cursor
        while True:
            changes = await self.index.changes(after, page, id_prefix=id_prefix)
            for summary in changes:
                after = summary.cursor
                yield summary
            if len(changes) == page:
                continue
            high = await self.index.wait_for_changes(after, timeout=self.poll)
            if high > after and not await self.index.changes(after, 1, id_prefix=id_prefix):
                # Cursors are commit-ordered: every change up to ``high`` was visible to that
                # query, and none was ours (a tenant view, or a prefix), so skip past them.
                after = high
