"""Await by id: the outcome of any execution, whichever process drives it.

The wait rides on the store's ``wait_for_append`` (LISTEN/NOTIFY on PostgreSQL; in-process
wake-ups plus one shared change watch on SQLite), so a waiter costs no query while nothing
is written to the execution it waits on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Literal

from loom._settings import seconds_setting
from loom.errors import ConfigurationError, ExecutionNotFoundError
from loom.model import Envelope, ExecutionState, ExecutionStatus

if TYPE_CHECKING:
    from loom.runtime._runtime import WorkflowRuntime

__all__ = ["subscribe", "wait"]

Until = Literal["end", "settled"]

#: Terminal event types: a subscription ends after one of them.
_TERMINAL = frozenset({"EXECUTION_COMPLETED", "EXECUTION_FAILED", "EXECUTION_CANCELLED"})


def _reached(state: ExecutionState, until: Until) -> bool:
    if state.is_terminal:
        return True
    return until == "settled" and state.status is ExecutionStatus.SUSPENDED


async def wait(
    rt: WorkflowRuntime,
    execution_id: str,
    timeout: float | None,
    until: Until,
    missing_ok: bool,
) -> ExecutionState:
    """See :meth:`WorkflowRuntime.wait`."""
    if until not in ("end", "settled"):
        raise ConfigurationError(
            f"until must be 'end' or 'settled', not {until!r}", execution_id=execution_id
        )
    if timeout is not None:
        timeout = seconds_setting(timeout, "timeout", zero_ok=True, execution_id=execution_id)
    rt._check_open()
    rt._first_use()  # a process that only awaits must still fire its timers
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        state = await rt.load_state(execution_id)
        if state is None and not missing_ok:
            raise ExecutionNotFoundError(
                f"no execution {execution_id!r} in this store to wait for",
                execution_id=execution_id,
                hint="Check the id, or pass missing_ok=True to wait for it to be started",
            )
        if state is not None and _reached(state, until):
            return state
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            status = "not started" if state is None else f"still {state.status}"
            raise TimeoutError(f"execution {execution_id!r} is {status} after {timeout}s")
        last = -1 if state is None else state.last_sequence
        await rt.store.wait_for_append(execution_id, last, timeout=left)


async def subscribe(
    rt: WorkflowRuntime, execution_id: str, after_sequence: int, missing_ok: bool
) -> AsyncIterator[Envelope]:
    """See :meth:`WorkflowRuntime.subscribe`."""
    rt._check_open()
    last = after_sequence
    state = await rt.load_state(execution_id)
    if state is None and not missing_ok:
        raise ExecutionNotFoundError(
            f"no execution {execution_id!r} in this store to subscribe to",
            execution_id=execution_id,
            hint="Check the id, or pass missing_ok=True to wait for it to be started",
        )
    # Ended already: what is left of its log is all that will come (the caller may be at or
    # past its terminal event, which would otherwise be waited for forever).
    ended = state is not None and state.is_terminal
    while True:
        batch = await rt.store.read(execution_id, from_sequence=last + 1, limit=256)
        for env in batch:
            last = env.sequence
            yield env
            if str(env.type) in _TERMINAL:
                return
        if len(batch) < 256:
            if ended:
                return
            await rt.store.wait_for_append(execution_id, last, timeout=None)
