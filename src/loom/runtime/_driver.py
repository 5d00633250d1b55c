"""The single writer of one execution inside one process: sequences, fence, snapshots."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from loom.model import Envelope, EventType, ExecutionState, PayloadLimits, apply_event
from loom.runtime._clock import Clock
from loom.runtime._observe import NO_OBSERVER, StepObserver
from loom.storage import CreatesExecutions, Snapshot, Store, Timer

__all__ = ["Driver"]


class Driver:
    """Appends an execution's events under one fence and keeps the folded state current.

    Owned by one asyncio task tree; ``lock`` serialises appends from steps a flow runs
    concurrently (``asyncio.gather``), so sequences stay dense.
    """

    def __init__(
        self,
        store: Store,
        state: ExecutionState,
        fence: int,
        clock: Clock,
        *,
        snapshot_every: int,
        limits: PayloadLimits,
        last_snapshot: int,
    ) -> None:
        self.store = store
        self.state = state
        self.fence = fence
        self.clock = clock
        self.snapshot_every = snapshot_every
        self.limits = limits
        self.last_snapshot = last_snapshot
        self.lock = asyncio.Lock()
        self.pending_ui: list[tuple[EventType, dict[str, Any]]] = []
        self.done = asyncio.Event()
        self.error: BaseException | None = None
        self.task: asyncio.Task[None] | None = None
        #: Set by the runtime: makes a timer durable (before the wait that needs it is logged).
        self.schedule_timer: Callable[[Timer], Awaitable[None]] | None = None
        self.observer: StepObserver = NO_OBSERVER

    def build(self, events: Sequence[tuple[EventType, dict[str, Any]]]) -> list[Envelope]:
        now = self.clock.now()
        base = self.state.last_sequence + 1
        eid = self.state.execution_id
        return [
            Envelope.create(
                eid, base + i, t, p, fence=self.fence, recorded_at=now, limits=self.limits
            )
            for i, (t, p) in enumerate(events)
        ]

    async def append(self, events: Sequence[tuple[EventType, dict[str, Any]]]) -> None:
        """Append ``events`` (after any buffered UI patches) in one atomic batch."""
        async with self.lock:
            if self.pending_ui:
                events = [*self.pending_ui, *events]
                self.pending_ui = []
            envelopes = self.build(events)
            await self.store.append(envelopes)
            for env in envelopes:
                apply_event(self.state, env)
            if self.state.last_sequence - self.last_snapshot >= self.snapshot_every:
                await self.snapshot()

    async def create(self, events: Sequence[tuple[EventType, dict[str, Any]]]) -> bool:
        """Start the execution with ``events`` under fence 1 in one atomic write (the caller
        checked the store is CreatesExecutions); False means use acquire_fence + append."""
        store = cast(CreatesExecutions, self.store)  # isinstance on a Protocol is slow here
        async with self.lock:
            envelopes = self.build(events)
            if not await store.create_execution(envelopes):
                return False
            for env in envelopes:
                apply_event(self.state, env)
            return True

    async def snapshot(self) -> None:
        if self.state.last_sequence <= self.last_snapshot:
            return
        await self.store.save_snapshot(
            Snapshot(self.state.execution_id, self.state.last_sequence, self.state.to_dict())
        )
        self.last_snapshot = self.state.last_sequence
