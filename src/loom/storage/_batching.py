"""One group-commit engine for every store that commits batches.

A store wraps each write in a :class:`WriteRequest` (its own subclass, typed) and hands it to
:meth:`GroupCommit.submit`. Concurrent writers are coalesced: the first writer to find no batch
collecting leads, yields once so that every task that is ready now can queue behind it, then
takes the queue and commits it with the store's ``run_batch`` (one transaction, one durable
commit for all of them). A lone write (no batch collecting or running, nothing else ready to
run on the loop) commits in the caller's own task with no yield, no future and no queue: the
common case of one execution stepping; a shared batch runs in a task of its own, so a
cancelled caller never strands the others. When a batch finishes, what queued
meanwhile goes in the next one. At most ``max_inflight`` batches run at once (SQLite: 1, its
single writer; PostgreSQL: a few, one per pooled connection).

``run_batch`` must give every request of its batch a result or an error (a refusal fails only
its own caller); the engine then answers the callers' futures. If ``run_batch`` itself raises,
every request it left unanswered fails with a :class:`~loom.errors.StorageWriteError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from loom.errors import StorageWriteError

__all__ = ["GroupCommit", "WriteRequest"]


@dataclass(eq=False, kw_only=True)
class WriteRequest:
    """One caller's write; ``run_batch`` fills ``result`` or ``error``. ``future`` is made by
    the engine when the write has to wait for a batch (a lone write needs none)."""

    future: asyncio.Future[Any] | None = field(default=None, repr=False)
    result: Any = None
    error: BaseException | None = None
    answered: bool = field(default=False, repr=False)


R = TypeVar("R", bound=WriteRequest)


def _others_ready(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """Whether another callback (another writer's task, say) is ready to run on this loop.

    The leader yields once so that writers ready now can join its batch; when nothing else is
    ready the yield would only come straight back (a lone writer: one execution stepping), so
    it is skipped, saving a loop iteration per write. The ready queue is asyncio's own
    (``BaseEventLoop._ready``); a loop without one (uvloop) always yields.
    """
    # ``loop``: the running loop when the caller has it at hand (on Python 3.11 every
    # get_running_loop() is a getpid() system call).
    ready = getattr(loop or asyncio.get_running_loop(), "_ready", None)
    return ready is None or len(ready) > 0


def answer(req: WriteRequest) -> None:
    """Tell ``req``'s caller its outcome (once; a caller that gave up is skipped)."""
    if req.answered:
        return
    req.answered = True
    future = req.future
    if future is None or future.done():  # the caller gave up (cancelled): nothing to tell it
        return
    if req.error is not None:
        future.set_exception(req.error)
    else:
        future.set_result(req.result)


class GroupCommit(Generic[R]):
    """Coalesces the writes submitted on ONE event loop into batches (see the module doc)."""

    def __init__(
        self,
        run_batch: Callable[[list[R]], Awaitable[None]],
        *,
        run_now: Callable[[list[R]], bool] | None = None,
        coalesce: bool = True,
        max_batch: int = 1024,
        max_inflight: int = 1,
        where: str = "store",
    ) -> None:
        self._run_batch = run_batch
        self._run_now = run_now
        self.coalesce = coalesce
        self.max_batch = max_batch if coalesce else 1
        self.max_inflight = max_inflight
        self.where = where
        self._pending: list[R] = []
        self._collecting = False
        self._inflight = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    def alone(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Whether a write now is a lone write (no batch collecting or running, nothing else
        ready to run on the loop) that the store may commit in the caller's frame, as
        :meth:`commit_alone` does; the store must then finish it without awaiting."""
        return (
            self._run_now is not None
            and not self._inflight
            and not self._pending
            and not (self.coalesce and _others_ready(loop))
        )

    def idle(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Whether nothing is being written, queued or ready to run on the loop: a write now is
        a lone write (what :meth:`submit` checks first), which a store may run itself between
        :meth:`lone_begins` and :meth:`lone_ends`."""
        return (
            not self._inflight and not self._pending and not (self.coalesce and _others_ready(loop))
        )

    def others_in_flight(self) -> bool:
        """Whether a batch other than the caller's is being written now (the caller's own
        batch, or lone write, counts as one in flight)."""
        return self._inflight > 1

    def lone_begins(self) -> None:
        """A lone write of the store's own is under way: writers arriving meanwhile queue
        behind it, as behind :meth:`submit`'s lone writer."""
        self._inflight += 1

    def lone_ends(self) -> None:
        """That write is over: whatever queued behind it is started as a batch."""
        self._inflight -= 1
        if self._pending:
            self._maybe_start_batch_task()

    def commit_alone(self, req: R) -> bool:
        """Commit ``req`` now, in the caller's own frame, if it is a lone write (as in
        :meth:`submit`) and the store's ``run_now`` can commit it without waiting; then
        ``req.result`` or ``req.error`` is its outcome. False: nothing was committed, submit it.

        ``run_now`` (optional) is ``run_batch`` without awaiting: it returns False, having
        committed nothing, when the batch would have to wait (another process holds the lock).
        """
        if (
            self._run_now is None
            or self._inflight
            or self._pending
            or (self.coalesce and _others_ready())
        ):
            return False
        self._inflight += 1
        try:
            return self._run_now([req])
        finally:
            self._inflight -= 1

    async def submit(self, req: R) -> Any:
        """Commit ``req``, coalesced with every write queued meanwhile; return its result."""
        if not self._inflight and not self._pending and not (self.coalesce and _others_ready()):
            # A lone writer: no batch to join and nobody ready to join its own, so it commits
            # here with nothing to coordinate (the yield, the future and the queue would only
            # come straight back). Marked in flight so that writers arriving while it awaits
            # the store queue behind it, and are started as a batch when it ends.
            self._inflight += 1
            try:
                await self._run_batch([req])
            finally:
                self._inflight -= 1
                if self._pending:
                    self._maybe_start_batch_task()
            if req.error is not None:
                raise req.error
            return req.result
        if req.future is None:
            req.future = asyncio.get_running_loop().create_future()
        future = req.future
        self._pending.append(req)
        if self._collecting or self._inflight >= self.max_inflight:
            return await future  # a batch that is collecting, or the next free one, takes it
        self._collecting = True
        self._inflight += 1
        if self.coalesce and _others_ready():
            try:
                await asyncio.sleep(0)
            except BaseException:  # cancelled while collecting: hand the others to a batch task
                self._collecting = False
                self._inflight -= 1
                if req in self._pending:
                    self._pending.remove(req)
                self._maybe_start_batch_task()
                raise
        batch = self._take_batch()
        if len(batch) != 1 or batch[0] is not req:
            self._spawn(self._flush(batch))
            return await future
        try:
            await self._run(batch)
        except BaseException:
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: the caller gets the interruption instead
            raise
        finally:
            self._inflight -= 1
            self._maybe_start_batch_task()
        return future.result()

    def fail_pending(self, error: Callable[[], BaseException]) -> None:
        """Refuse every queued write that no batch took (the store is closing)."""
        pending, self._pending = self._pending, []
        for req in pending:
            req.error = error()
            answer(req)

    async def drain(self) -> None:
        """Wait for the batches running now (the store is closing)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _take_batch(self) -> list[R]:
        batch = self._pending[: self.max_batch]
        del self._pending[: self.max_batch]
        self._collecting = False
        self._maybe_start_batch_task()  # what is left beyond max_batch
        return batch

    def _maybe_start_batch_task(self) -> None:
        if self._pending and not self._collecting and self._inflight < self.max_inflight:
            self._collecting = True
            self._inflight += 1
            self._spawn(self._flush(None))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, batch: list[R] | None) -> None:
        """Run ``batch`` (or take one: this task was started while writers queued), then keep
        taking what queued meanwhile, as long as no other batch is collecting it."""
        try:
            while True:
                if batch is None:
                    batch = self._take_batch()
                if batch:
                    await self._run(batch)
                if not self._pending or self._collecting:
                    return
                self._collecting = True
                batch = None
        finally:
            self._inflight -= 1

    async def _run(self, batch: list[R]) -> None:
        try:
            await self._run_batch(batch)
        except BaseException as exc:
            err = StorageWriteError(f"{self.where}: the write was interrupted: {exc!r}")
            err.__cause__ = exc
            for req in batch:
                if not req.answered and req.error is None:
                    req.error = err
                    req.result = None
            raise
        finally:
            for req in batch:
                answer(req)
