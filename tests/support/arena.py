"""A deterministic arena for placement races: several dispatchers over one store, and an effect
whose timing is driven by events, not timers.

The effect of an attempt holding fence f waits until either a newer fence exists (it has been
superseded: its record will be refused) or every other expected dispatch has finished. That makes
every race in ADR 0004 play out the same way on every run, so effect counts are exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import loom
from loom.model import Envelope
from loom.placement import (
    ExecutionDispatcher,
    ExecutionPackage,
    ExecutionResult,
    LocalWorkerRuntime,
    WorkerLease,
)
from loom.storage import Store


class Arena:
    def __init__(self, shared: Store, make_view: Any) -> None:
        self.shared = shared
        self.make_view = make_view  # shared store -> the store a runtime sees (plain or tenant)
        self.cond = asyncio.Condition()
        self.latest_fence = 0
        self.remaining = 2  # top-level dispatches the scenario makes that have not finished
        self.effect_fences: list[int] = []
        self.hang_fence: int | None = None
        self.wake = asyncio.Event()
        self.in_effect = asyncio.Event()
        self.runtimes: list[loom.WorkflowRuntime] = []

        @loom.step(id="effect")
        async def effect() -> str:
            info = loom.current_step()
            assert info is not None
            self.effect_fences.append(info.fence)
            self.in_effect.set()
            if info.fence == self.hang_fence:
                await self.wake.wait()  # a wedged instance: it wakes only when told
            async with self.cond:
                await self.cond.wait_for(
                    lambda: self.latest_fence > info.fence or self.remaining <= 1
                )
            return "done"

        @loom.flow(id="one-effect", version="1")
        async def one_effect(ctx: loom.WorkflowContext) -> str:
            return await ctx.run(effect)

        self.flow = one_effect

    @property
    def effects(self) -> int:
        return len(self.effect_fences)

    async def fence_taken(self, fence: int) -> None:
        async with self.cond:
            self.latest_fence = max(self.latest_fence, fence)
            self.cond.notify_all()

    def runtime(self, store: Store | None = None) -> loom.WorkflowRuntime:
        rt = loom.WorkflowRuntime(store or self.make_view(self.shared))
        rt.register(self.flow)
        self.runtimes.append(rt)
        return rt

    async def run(self, dispatcher: ExecutionDispatcher, package: ExecutionPackage) -> Any:
        """Dispatch; return the result or the exception raised, and count it finished."""
        try:
            return await dispatcher.dispatch(package)
        except Exception as exc:
            return exc
        finally:
            async with self.cond:
                self.remaining -= 1
                self.cond.notify_all()

    async def close(self) -> None:
        for rt in self.runtimes:
            await rt.close()


class ArenaWorker(LocalWorkerRuntime):
    """A LocalWorkerRuntime that reports every fence it takes to the arena."""

    def __init__(
        self, arena: Arena, runtime: loom.WorkflowRuntime, after_first_allocate: Any = None
    ) -> None:
        super().__init__(runtime)
        self.arena = arena
        self.after_first_allocate = after_first_allocate
        self.allocations = 0

    async def allocate(self, package: ExecutionPackage) -> WorkerLease:
        lease = await super().allocate(package)
        self.allocations += 1
        await self.arena.fence_taken(lease.fence)
        if self.allocations == 1 and self.after_first_allocate is not None:
            await self.after_first_allocate()
        return lease

    async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
        return await super().execute(lease, package)


class DelayedBootstrap:
    """A store view whose first sequence-0 append waits until someone else's has landed:
    it puts this holder's start squarely into the sequence-0 race, deterministically."""

    def __init__(self, inner: Store, execution_id: str) -> None:
        self.inner = inner
        self.execution_id = execution_id
        self.delayed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def append(self, envelopes: Sequence[Envelope]) -> None:
        if not self.delayed and envelopes[0].sequence == 0:
            self.delayed = True
            await self.inner.wait_for_append(self.execution_id, -1, timeout=30)
        await self.inner.append(envelopes)
