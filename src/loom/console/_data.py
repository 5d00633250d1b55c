"""Everything the console reads and changes, in one place.

The pages and the JSON API call only this module. A store with an execution index (the
``ExecutionIndex`` capability: ``list_executions``) answers listings from it, newest first, one
query per page. A store without one (a third party's) is listed in id order, keyset-paged over
``iterate_execution_ids``, folding only the executions of the page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from loom.errors import ConfigurationError, ExecutionNotFoundError, FlowNotFoundError
from loom.model import Envelope, ExecutionState, ExecutionStatus, replay
from loom.runtime import ExecutionHandle, Flow, WorkflowRuntime

__all__ = ["ConsoleData", "ListPage", "ListQuery"]

TIMER_EVENT = "loom.timer"
#: How many ids one listing request may look at to fill a filtered page.
SCAN_LIMIT = 2000
#: How long a command waits for the execution to settle before answering (it runs on).
SETTLE_WAIT = 0.5


@dataclass(frozen=True, slots=True)
class ListQuery:
    """A listing request: filters, the cursor of the page before, and the page size."""

    status: str | None = None
    flow_id: str | None = None
    id_contains: str | None = None
    created_after: float | None = None
    after: str | None = None
    limit: int = 50


@dataclass(slots=True)
class ListPage:
    """One page of execution rows (see :func:`row_of_state`); ``next_cursor`` is None on the
    last page. ``partial``: a store without an index stopped looking before filling it."""

    items: list[dict[str, Any]]
    next_cursor: str | None
    scanned: int = 0
    partial: bool = field(default=False)


@dataclass(slots=True)
class GatePage:
    items: list[ExecutionState]
    partial: bool = False


def row_of_state(state: ExecutionState) -> dict[str, Any]:
    """The list row of a folded execution (the same keys as an index summary's)."""
    forked = state.forked_from or {}
    return {
        "execution_id": state.execution_id,
        "flow_id": state.flow_id,
        "flow_version": state.flow_version,
        "status": state.status.value,
        "waiting_for": state.waiting.event_type if state.waiting else None,
        "parent_id": None,
        "forked_from": forked.get("parent_id") or forked.get("execution_id"),
        "created_at": state.started_at,
        "updated_at": state.updated_at,
    }


def _matches(state: ExecutionState, q: ListQuery) -> bool:
    if q.status and state.status.value != q.status:
        return False
    if q.flow_id and state.flow_id != q.flow_id:
        return False
    if q.id_contains and q.id_contains not in state.execution_id:
        return False
    created = state.started_at or 0.0
    return not (q.created_after is not None and created <= q.created_after)


class ConsoleData:
    """The console's read and command side over one runtime (and so one store)."""

    def __init__(self, runtime: WorkflowRuntime) -> None:
        self.runtime = runtime
        self.store = runtime.store

    # ------------------------------------------------------------------ reading

    def _index(self) -> Any:
        """The store's execution index, or None (a store without the capability)."""
        return self.store if callable(getattr(self.store, "list_executions", None)) else None

    async def list_executions(self, q: ListQuery) -> ListPage:
        """A page of executions after the cursor ``q.after`` (keyset, never OFFSET)."""
        index = self._index()
        if index is not None:
            from loom.storage import ExecutionQuery

            page = await index.list_executions(
                ExecutionQuery(
                    statuses=[q.status] if q.status else None,
                    flow_id=q.flow_id,
                    id_contains=q.id_contains,
                    created_after=q.created_after,
                    limit=q.limit,
                    cursor=q.after,
                )
            )
            return ListPage([s.to_dict() for s in page.items], page.next_cursor)
        return await self._scan(q)

    async def _scan(self, q: ListQuery) -> ListPage:
        items: list[dict[str, Any]] = []
        scanned = 0
        last: str | None = None
        filtered = bool(q.status or q.flow_id or q.id_contains or q.created_after)
        page_size = q.limit + 1 if not filtered else 256
        async for eid in self.store.iterate_execution_ids(after=q.after, page_size=page_size):
            if len(items) == q.limit:
                return ListPage(items, last, scanned)
            if scanned >= SCAN_LIMIT:
                return ListPage(items, last, scanned, partial=True)
            scanned += 1
            last = eid
            if q.id_contains and q.id_contains not in eid:
                continue
            state = await self.runtime.load_state(eid)
            if state is not None and _matches(state, q):
                items.append(row_of_state(state))
        return ListPage(items, None, scanned)

    async def state(self, execution_id: str, at: int | None = None) -> ExecutionState:
        """The folded state (as of sequence ``at``), or ExecutionNotFoundError."""
        state = await self.runtime.load_state(execution_id, at_sequence=at)
        if state is None:
            raise ExecutionNotFoundError(
                f"no execution {execution_id!r} in this store", execution_id=execution_id
            )
        return state

    async def timeline(self, execution_id: str, after_sequence: int = -1) -> list[Envelope]:
        envelopes = await self.store.read(execution_id, from_sequence=after_sequence + 1)
        if not envelopes and after_sequence < 0:
            raise ExecutionNotFoundError(
                f"no execution {execution_id!r} in this store", execution_id=execution_id
            )
        return envelopes

    async def follow(
        self, execution_id: str, after_sequence: int, *, idle: float = 15.0
    ) -> AsyncIterator[Envelope | None]:
        """New envelopes as they are appended; None after ``idle`` seconds without any (the
        caller's chance to send a keep-alive and to notice a closed connection)."""
        last = after_sequence
        while True:
            envelopes = await self.store.read(execution_id, from_sequence=last + 1)
            for env in envelopes:
                last = env.sequence
                yield env
            if envelopes:
                continue
            highest = await self.store.wait_for_append(execution_id, last, timeout=idle)
            if highest <= last:
                yield None

    async def related(self, execution_id: str) -> dict[str, Any]:
        """The parent, child executions and forks of an execution (from the index; a store
        without one shows the fork parent recorded in the execution's own log only)."""
        index = self._index()
        if index is None:
            return {"parent": None, "children": [], "forks": []}
        from loom.storage import ExecutionQuery

        summary = await index.get_summary(execution_id)
        children = await index.list_executions(ExecutionQuery(parent_id=execution_id, limit=50))
        forks = await index.list_executions(ExecutionQuery(forked_from=execution_id, limit=50))
        return {
            "parent": summary.parent_id if summary is not None else None,
            "children": [s.execution_id for s in children.items],
            "forks": [s.execution_id for s in forks.items],
        }

    async def open_gates(self, limit: int = 100) -> GatePage:
        """Suspended executions waiting on a gate (not a sleep), folded for their forms."""
        index = self._index()
        states: list[ExecutionState] = []
        if index is not None:
            from loom.storage import ExecutionQuery

            cursor = None
            while len(states) < limit:
                page = await index.list_executions(
                    ExecutionQuery(statuses=["suspended"], limit=limit, cursor=cursor)
                )
                for summary in page.items:
                    if summary.waiting_for and summary.waiting_for != TIMER_EVENT:
                        state = await self.runtime.load_state(summary.execution_id)
                        if state is not None and _is_gate(state):
                            states.append(state)
                cursor = page.next_cursor
                if cursor is None:
                    return GatePage(states)
            return GatePage(states[:limit], partial=True)
        scanned = 0
        async for eid in self.store.iterate_execution_ids(page_size=256):
            scanned += 1
            if scanned > SCAN_LIMIT * 5 or len(states) >= limit:
                return GatePage(states, partial=True)
            state = await self.runtime.load_state(eid)
            if state is not None and _is_gate(state):
                states.append(state)
        return GatePage(states)

    def flow_for(self, state: ExecutionState) -> Flow[Any, Any] | None:
        """The registered code of an execution, or None when the console was not given it."""
        try:
            return self.runtime.get_flow(state.flow_id, state.flow_version)
        except FlowNotFoundError:
            return None

    # ------------------------------------------------------------------ commands

    async def resume(self, execution_id: str, event_type: str, payload: Any) -> ExecutionState:
        """Record a gate's decision; the execution continues in this process."""
        state = await self.state(execution_id)
        self._require_flow(state)
        handle = await self.runtime.resume(execution_id, event_type, payload)
        # Answer once the decision is durable; the flow runs on in the background and the
        # page follows it live.
        return await self._settle(handle, execution_id)

    async def cancel(self, execution_id: str, reason: str | None) -> ExecutionState:
        await self.state(execution_id)
        return await self.runtime.cancel(execution_id, reason=reason)

    async def recover(self, execution_id: str) -> ExecutionState:
        state = await self.state(execution_id)
        self._require_flow(state)
        handle = await self.runtime.recover(execution_id)
        return await self._settle(handle, execution_id)

    async def _settle(self, handle: ExecutionHandle[Any], execution_id: str) -> ExecutionState:
        try:
            return await handle.settled(timeout=SETTLE_WAIT)
        except TimeoutError:
            return await self.state(execution_id)

    def _require_flow(self, state: ExecutionState) -> None:
        if self.flow_for(state) is None:
            raise ConfigurationError(
                f"this console was started without the code of flow {state.flow_id!r} "
                f"version {state.flow_version!r}",
                execution_id=state.execution_id,
                hint="Start it with --app module:flows to decide, recover or resume",
            )


def _is_gate(state: ExecutionState) -> bool:
    return (
        state.status is ExecutionStatus.SUSPENDED
        and state.waiting is not None
        and state.waiting.event_type != TIMER_EVENT
    )


def fold_at(envelopes: list[Envelope], at: int) -> ExecutionState:
    """The state as of sequence ``at`` from an already-read timeline."""
    return replay([e for e in envelopes if e.sequence <= at])
