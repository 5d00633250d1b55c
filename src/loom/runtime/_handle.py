"""ExecutionHandle: wait for an execution to suspend or end, read its state and result."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from loom._settings import seconds_setting
from loom.errors import (
    ExecutionCancelledError,
    ExecutionFailedError,
    NotWaitingError,
)
from loom.model import ExecutionState, ExecutionStatus
from loom.runtime._driver import Driver

if TYPE_CHECKING:
    from loom.runtime._runtime import WorkflowRuntime

__all__ = ["ExecutionHandle"]

OutputT = TypeVar("OutputT")


class ExecutionHandle(Generic[OutputT]):
    """A handle on one execution: wait for it to suspend or finish, read its state/result."""

    def __init__(self, runtime: WorkflowRuntime, execution_id: str, driver: Driver | None) -> None:
        self.runtime = runtime
        self.execution_id = execution_id
        self._driver = driver

    async def state(self) -> ExecutionState:
        state, _ = await self.runtime._require(self.execution_id)
        return state

    async def _wait(
        self, done: Callable[[ExecutionState], bool], timeout: float | None
    ) -> ExecutionState:
        if timeout is not None:
            timeout = seconds_setting(
                timeout, "timeout", zero_ok=True, execution_id=self.execution_id
            )
        self.runtime._first_use()  # a process that only awaits must still fire its timers
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout

        def remaining() -> float | None:
            return None if deadline is None else max(0.0, deadline - loop.time())

        while True:
            drv = self._driver
            if drv is not None and not drv.done.is_set():
                # Not asyncio.wait_for: on 3.11 it can swallow the caller's cancel.
                async with asyncio.timeout(remaining()):
                    await drv.done.wait()
            if drv is not None and drv.error is not None:
                raise drv.error
            if drv is not None and drv.state.is_terminal:
                # Terminal is final and the driver applies only what is durable: this is the
                # state the store holds, without reading it back.
                state = drv.state
            else:
                state = await self.state()
            if done(state):
                return state
            newer = self.runtime._drivers.get(self.execution_id)
            if newer is not None and newer is not drv:
                self._driver = newer
                continue
            left = remaining()
            if left is not None and left <= 0:
                raise TimeoutError(
                    f"execution {self.execution_id!r} is still {state.status} after {timeout}s"
                )
            await self.runtime.store.wait_for_append(
                self.execution_id, state.last_sequence, timeout=left
            )

    async def settled(self, timeout: float | None = None) -> ExecutionState:
        """Wait until the execution is suspended or terminal."""
        return await self._wait(
            lambda s: s.is_terminal or s.status is ExecutionStatus.SUSPENDED, timeout
        )

    async def wait_for_suspend(self, timeout: float | None = None) -> ExecutionState:
        """Wait until the execution suspends on a gate. Raises NotWaitingError if it ends
        instead."""
        state = await self.settled(timeout)
        if state.is_terminal:
            raise NotWaitingError(
                f"execution {self.execution_id!r} ended {state.status} without suspending",
                execution_id=self.execution_id,
            )
        return state

    async def wait_for_completion(self, timeout: float | None = None) -> ExecutionState:
        """Wait until the execution is completed, failed or cancelled (across any gates)."""
        return await self._wait(lambda s: s.is_terminal, timeout)

    async def result(self, timeout: float | None = None) -> OutputT:
        """The flow's output (validated against its return type). Raises
        :class:`ExecutionFailedError` or :class:`ExecutionCancelledError` otherwise."""
        state = await self.wait_for_completion(timeout)
        if state.status is ExecutionStatus.COMPLETED:
            flow = self.runtime.get_flow(state.flow_id, state.flow_version)
            value: OutputT = flow.output.load(state.output)
            return value
        if state.status is ExecutionStatus.CANCELLED:
            raise ExecutionCancelledError(
                f"execution {self.execution_id!r} was cancelled ({state.cancel_reason})",
                execution_id=self.execution_id,
            )
        err = state.error or {}
        raise ExecutionFailedError(
            f"execution {self.execution_id!r} failed: {err.get('type')}: {err.get('message')}",
            execution_id=self.execution_id,
            error={k: v for k, v in err.items() if k != "traceback"},
        )

    def __repr__(self) -> str:
        return f"<ExecutionHandle {self.execution_id!r}>"
