"""One change watch per SQLite store and event loop, shared by every waiter on it.

Another process's commit reaches this one through the database files only: a commit appends
to the write-ahead log, which changes the WAL file's size or modification time. One task per
event loop stats the two files every ``interval`` seconds (a system call, no SQL) and wakes
every waiter when their signature moves; each waiter then re-reads its own execution once.
A waiter that nothing wakes costs nothing, however many there are, and a waiter re-checks
every ``safety`` seconds in any case (a filesystem whose times are coarse).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import Callable, Iterator

__all__ = ["ChangeWatch"]

_Signature = tuple[tuple[int, int, int], ...]


def _signature(paths: tuple[str, ...]) -> _Signature:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append((0, 0, 0))
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class ChangeWatch:
    """Calls ``wake()`` (on the waiter's loop) when the files at ``paths`` change."""

    def __init__(self, paths: tuple[str, ...], wake: Callable[[], None], interval: float) -> None:
        self.paths = paths
        self.wake = wake
        self.interval = interval
        self._tasks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )
        self._users: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = (
            weakref.WeakKeyDictionary()
        )

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Keep the watch of the running loop alive while a waiter is inside."""
        loop = asyncio.get_running_loop()
        self._users[loop] = self._users.get(loop, 0) + 1
        task = self._tasks.get(loop)
        if task is None or task.done():
            self._tasks[loop] = loop.create_task(self._run(loop), name="loom:sqlite-watch")
        try:
            yield
        finally:
            self._users[loop] -= 1

    async def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        seen = _signature(self.paths)
        while self._users.get(loop, 0) > 0:
            await asyncio.sleep(self.interval)
            now = _signature(self.paths)
            if now != seen:
                seen = now
                self.wake()

    def stop(self) -> None:
        for task in list(self._tasks.values()):
            if not task.done():
                try:
                    task.cancel()
                except RuntimeError:  # its loop is closed already
                    pass
