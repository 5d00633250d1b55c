"""The LISTEN side of PostgresStore's ``wait_for_append``.

Appends send ``pg_notify(channel, execution_id)`` inside their transaction (so the note goes
out only if the append commits) when their execution's head is marked watched, which a
waiter's first read does, or when they start it (schema rung 11; see ``PostgresStore``).
One dedicated connection per store listens and wakes the local waiters of the execution
named; it reconnects by itself when it drops, and then wakes every waiter to re-check,
because notifications sent while it was down are lost.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import psycopg

from loom._aio import raise_if_cancel_swallowed
from loom.storage._common import Waiters

__all__ = ["NotifyListener"]


class NotifyListener:
    """Holds one ``LISTEN channel`` connection for a store (started on first need).

    ``listening`` is set while LISTEN is in effect; ``waiting`` counts this store's waiters per
    execution id (the ones to wake when a note may have been lost).
    """

    def __init__(
        self,
        dsn: str,
        channel: str,
        *,
        connect_timeout: float,
        waiters: Waiters,
        waiting: Counter[str],
    ) -> None:
        self.dsn = dsn
        self.channel = channel
        self.connect_timeout = connect_timeout
        self.waiters = waiters
        self.waiting = waiting
        self.listening = asyncio.Event()
        self.closed = False
        self._task: asyncio.Task[None] | None = None

    def ensure(self) -> None:
        """Start listening in the background (once; never after :meth:`stop`)."""
        if self._task is None and not self.closed:
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def stop(self) -> None:
        """Stop listening and close the connection. Idempotent."""
        self.closed = True
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, psycopg.Error):
                pass

    async def _listen(self) -> None:
        """Hold a LISTEN connection; reconnect when it drops, then wake every waiter to re-check
        (notifications sent while it was down are lost)."""
        delay = 0.05
        while not self.closed:
            raise_if_cancel_swallowed()
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=max(1, round(self.connect_timeout))
                )
                async with conn:
                    if self.closed:  # stop() came while connecting (its cancel may be lost)
                        return
                    await conn.execute(f"LISTEN {self.channel}")
                    self.listening.set()
                    delay = 0.05
                    self.waiters.notify(list(self.waiting))
                    async for note in conn.notifies():
                        self.waiters.notify([note.payload] if note.payload else list(self.waiting))
            except psycopg.Error:
                pass
            finally:
                self.listening.clear()
            if self.closed:
                return
            self.waiters.notify(list(self.waiting))  # re-check now: a wake-up may be lost
            await asyncio.sleep(delay)  # the server may be restarting: back off, then reconnect
            delay = min(delay * 2, 1.0)
