"""Tasks: an execution seen through the A2A lifecycle, and awaiting one by id."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from loom.model import ExecutionState, ExecutionStatus, Gate, replay
from loom.storage import Store

__all__ = ["Task", "TaskState", "fold", "settled"]

_REJECTED = "TaskRejectedError"
_RUNTIME_GATES = "loom."
_LIVE = (ExecutionStatus.RUNNING, ExecutionStatus.PENDING)


class TaskState(enum.StrEnum):
    """The A2A task lifecycle."""

    SUBMITTED = "submitted"
    WORKING = "working"
    INPUT_REQUIRED = "input-required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    REJECTED = "rejected"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED, TaskState.REJECTED}
)


def task_state(state: ExecutionState | None) -> TaskState:
    """The A2A state of an execution: a human gate is ``input-required``; a durable sleep is
    still ``working``; a failure raised as ``TaskRejectedError`` is ``rejected``."""
    if state is None:
        return TaskState.SUBMITTED
    status = state.status
    if status is ExecutionStatus.COMPLETED:
        return TaskState.COMPLETED
    if status is ExecutionStatus.CANCELLED:
        return TaskState.CANCELED
    if status is ExecutionStatus.FAILED:
        return TaskState.REJECTED if _rejected(state.error) else TaskState.FAILED
    if status is ExecutionStatus.SUSPENDED and _human_gate(state.waiting):
        return TaskState.INPUT_REQUIRED
    return TaskState.WORKING


def _rejected(error: Any) -> bool:
    # Raised in the flow, or by a step or a fatal tool (then the flow's error is a
    # StepFailedError whose recorded step error names it).
    for _ in range(4):
        if not isinstance(error, dict):
            return False
        if error.get("type") == _REJECTED or error.get("registered") == _REJECTED:
            return True
        details = error.get("details")
        error = details.get("error") if isinstance(details, dict) else None
    return False


def _human_gate(gate: Gate | None) -> bool:
    # The runtime's own waits (a durable sleep, a parent awaiting its children) are "loom.*"
    # gates: the task is still working, nobody is asked for input.
    return gate is not None and not gate.event_type.startswith(_RUNTIME_GATES)


@dataclass(frozen=True, slots=True)
class Task:
    """One task: an execution (``id`` is its execution id) and its A2A state.

    ``gate`` is the gate an ``input-required`` task waits on (its event type says which
    decision it takes); ``output``/``error`` are the execution's once it ended.
    """

    id: str
    state: TaskState
    agent: str | None = None
    context_id: str | None = None
    output: Any = None
    error: dict[str, Any] | None = None
    gate: Gate | None = None
    last_sequence: int = -1

    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal

    @classmethod
    def of(
        cls,
        task_id: str,
        state: ExecutionState | None,
        *,
        agent: str | None = None,
        context_id: str | None = None,
    ) -> Task:
        if state is None:
            return cls(task_id, TaskState.SUBMITTED, agent, context_id)
        ts = task_state(state)
        workflow = state.metadata.get("workflow_id")
        return cls(
            task_id,
            ts,
            agent or state.flow_id,
            context_id or (workflow if isinstance(workflow, str) else None),
            state.output,
            state.error,
            state.waiting if ts is TaskState.INPUT_REQUIRED else None,
            state.last_sequence,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state.value,
            "agent": self.agent,
            "context_id": self.context_id,
            "output": self.output,
            "error": self.error,
            "gate": None if self.gate is None else self.gate.to_dict(),
            "last_sequence": self.last_sequence,
        }


async def fold(store: Store, execution_id: str) -> ExecutionState | None:
    """The execution's folded state read straight from ``store`` (None if it has no log)."""
    envelopes = await store.read(execution_id)
    if not envelopes:
        return None
    return replay(envelopes, execution_id=execution_id)


def _asks_or_ended(state: ExecutionState | None) -> bool:
    ts = task_state(state)
    return ts.is_terminal or ts is TaskState.INPUT_REQUIRED


async def settled(
    store: Store,
    execution_id: str,
    *,
    timeout: float | None = None,
    load: Callable[[str], Awaitable[ExecutionState | None]] | None = None,
    wait: Callable[[str, float | None], Awaitable[ExecutionState]] | None = None,
) -> ExecutionState:
    """Await ``execution_id`` by id until it ends or asks for input (``input-required``);
    a durable sleep or a wait on child executions is still working, so it waits on.

    Whichever process drives it: every change is an append, so this waits on ``wait`` (a
    runtime's ``wait(until="settled")``) when given, else on the store's ``wait_for_append``
    (LISTEN/NOTIFY on PostgreSQL), re-folding only when the log grew. This is how a
    superseded refusal is answered (ADR 0004): the caller gets the winner's outcome. Raises
    ``TimeoutError`` after ``timeout`` seconds.
    """
    loop = asyncio.get_running_loop()
    give_up = None if timeout is None else loop.time() + timeout

    def left() -> float | None:
        if give_up is None:
            return None
        remaining = give_up - loop.time()
        if remaining <= 0:
            raise TimeoutError(f"{execution_id!r} did not settle within {timeout}s")
        return remaining

    while True:
        if wait is not None:
            state: ExecutionState | None = await wait(execution_id, left())
        elif load is not None:
            state = await load(execution_id)
        else:
            state = await fold(store, execution_id)
        if state is not None and _asks_or_ended(state):
            return state
        if state is not None and wait is not None and state.status in _LIVE:
            continue  # the runtime's wait returned early (it should not); ask again
        last = -1 if state is None else state.last_sequence
        remaining = left()
        await store.wait_for_append(
            execution_id, last, timeout=1.0 if remaining is None else min(1.0, remaining)
        )
