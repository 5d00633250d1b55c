"""Live text of running model calls: a non-durable side channel for UIs.

While an agent with ``stream=True`` waits for its model, the text generated so far is
published here under the execution's id. Nothing here is recorded: a crash loses it, and
replay never republishes it (only the final response is in the log). A console subscribes
to show it; when nobody listens, publishing costs a dictionary lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["LIVE", "LiveText"]


class LiveText:
    """Per-execution fan-out of text chunks to subscribers in this process."""

    def __init__(self, max_buffer: int = 1024) -> None:
        self._subscribers: dict[str, set[asyncio.Queue[str]]] = {}
        self.max_buffer = max_buffer

    def publish(self, execution_id: str, chunk: str) -> None:
        """Hand ``chunk`` to every subscriber of ``execution_id`` (a full queue drops it)."""
        for queue in self._subscribers.get(execution_id, ()):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(chunk)

    @contextlib.asynccontextmanager
    async def subscribe(self, execution_id: str) -> AsyncIterator[asyncio.Queue[str]]:
        """``async with LIVE.subscribe(eid) as queue:`` receives chunks while open."""
        queue: asyncio.Queue[str] = asyncio.Queue(self.max_buffer)
        self._subscribers.setdefault(execution_id, set()).add(queue)
        try:
            yield queue
        finally:
            subscribers = self._subscribers.get(execution_id)
            if subscribers is not None:
                subscribers.discard(queue)
                if not subscribers:
                    del self._subscribers[execution_id]


#: The process-wide live channel agents publish to.
LIVE = LiveText()
