"""Everything the console reads and changes, in one place.

The pages and the JSON API call only this module. Listing is keyset-paged over the store's
execution ids (each page folds only its own executions from their snapshots); when the
execution index (``loom.views``) is available this is the one place that switches to it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from loom.errors import ConfigurationError, ExecutionNotFoundError, FlowNotFoundError
from loom.model import Envelope, ExecutionState, ExecutionStatus, replay
from loom.runtime import ExecutionHandle, Flow, WorkflowRuntime

__all__ = ["ConsoleData", "ExecutionPage", "ExecutionQuery"]

TIMER_EVENT = "loom.timer"
#: How many ids one listing request may look at to fill a filtered page.
SCAN_LIMIT = 2000
#: How long a command waits for the execution to settle before answering (it runs on).
SETTLE_WAIT = 0.5


@dataclass(frozen=True, slots=True)
class ExecutionQuery:
    """A listing request: filters, the cursor of the page before, and the page size."""

    status: str | None = None
    flow_id: str | None = None
    id_contains: str | None = None
    updated_after: float | None = None
    updated_before: float | None = None
    after: str | None = None
    limit: int = 50


@dataclass(slots=True)
class ExecutionPage:
    """One page of executions; ``next_cursor`` is None on the last page."""

    items: list[ExecutionState]
    next_cursor: str | None
    scanned: int = 0
    partial: bool = field(default=False)


def _matches(state: ExecutionState, q: ExecutionQuery) -> bool:
    if q.status and state.status.value != q.status:
        return False
    if q.flow_id and state.flow_id != q.flow_id:
        return False
    if q.id_contains and q.id_contains not in state.execution_id:
        return False
    updated = state.updated_at or state.started_at or 0.0
    if q.updated_after is not None and updated < q.updated_after:
        return False
    return not (q.updated_before is not None and updated > q.updated_before)


class ConsoleData:
    """The console's read and command side over one runtime (and so one store)."""

    def __init__(self, runtime: WorkflowRuntime) -> None:
        self.runtime = runtime
        self.store = runtime.store

    # ------------------------------------------------------------------ reading

    async def list_executions(self, q: ExecutionQuery) -> ExecutionPage:
        """A page of executions in id order after ``q.after`` (keyset, never OFFSET)."""
        items: list[ExecutionState] = []
        scanned = 0
        last: str | None = None
        filtered = bool(q.status or q.flow_id or q.id_contains or q.updated_after)
        page_size = q.limit + 1 if not filtered else 256
        async for eid in self.store.iterate_execution_ids(after=q.after, page_size=page_size):
            if len(items) == q.limit:
                return ExecutionPage(items, last, scanned)
            if scanned >= SCAN_LIMIT:
                return ExecutionPage(items, last, scanned, partial=True)
            scanned += 1
            last = eid
            if q.id_contains and q.id_contains not in eid:
                continue
            state = await self.runtime.load_state(eid)
            if state is not None and _matches(state, q):
                items.append(state)
        return ExecutionPage(items, None, scanned)

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

    async def children(self, execution_id: str) -> list[str]:
        """Executions forked from this one (found by their fork record)."""
        # Without the execution index this would fold every execution; the page links
        # the parent of a fork (from its own log) and leaves children to the index.
        return []

    async def open_gates(self, limit: int = 200) -> ExecutionPage:
        """Suspended executions waiting on a gate (not a sleep), in id order."""
        items: list[ExecutionState] = []
        scanned = 0
        async for eid in self.store.iterate_execution_ids(page_size=256):
            scanned += 1
            if scanned > SCAN_LIMIT * 5 or len(items) >= limit:
                return ExecutionPage(items, eid, scanned, partial=True)
            state = await self.runtime.load_state(eid)
            if (
                state is not None
                and state.status is ExecutionStatus.SUSPENDED
                and state.waiting is not None
                and state.waiting.event_type != TIMER_EVENT
            ):
                items.append(state)
        return ExecutionPage(items, None, scanned)

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


def fold_at(envelopes: list[Envelope], at: int) -> ExecutionState:
    """The state as of sequence ``at`` from an already-read timeline."""
    return replay([e for e in envelopes if e.sequence <= at])
