"""Another connection holding a SQLite file's write lock (what another process's transaction
does), for as long as a test needs it."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path


@contextlib.asynccontextmanager
async def write_lock_held(db: Path) -> AsyncIterator[None]:
    """Hold ``db``'s write lock (``BEGIN IMMEDIATE`` on a connection of a thread of its own)
    from entry until exit, then roll back: nothing the holder did stays."""
    locked, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(30)
        other.execute("ROLLBACK")
        other.close()

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    try:
        assert await asyncio.to_thread(locked.wait, 10), "the lock was not taken in 10 s"
        yield
    finally:
        release.set()
        await asyncio.to_thread(holder.join, 10)
