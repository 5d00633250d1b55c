"""InProcessA2ABus: agents and flows addressed by name, each task a durable execution placed
through an injected ExecutionDispatcher (ADR 0001)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from loom.errors import FlowNotFoundError, NotWaitingError
from loom.model import ExecutionState, ExecutionStatus
from loom.orchestration._cards import AgentCard, AgentSkill
from loom.orchestration._errors import TaskNotFoundError, TaskTerminalError, UnknownAgentError
from loom.orchestration._tasks import Task, TaskState, settled
from loom.placement import (
    ExecutionDispatcher,
    ExecutionPackage,
    ExecutionResult,
    Intent,
    LocalDispatcher,
    LocalWorkerRuntime,
    ResumeEvent,
    is_superseded_refusal,
)
from loom.placement.local import IDEMPOTENCY_KEY
from loom.runtime import Flow, WorkflowRuntime, _children
from loom.runtime._mailbox import keyed_id, taken

__all__ = ["InProcessA2ABus", "card_for"]

log = logging.getLogger("loom.orchestration")

_LIVE = (ExecutionStatus.RUNNING, ExecutionStatus.PENDING)


def card_for(flow: Flow[Any, Any], **overrides: Any) -> AgentCard:
    """A card describing ``flow`` (an agent is a flow): its id, docstring or instructions,
    one skill named after it, and its input type's JSON schema."""
    description = getattr(flow, "instructions", None) or (flow.__doc__ or "").strip()
    schema = None
    adapter = flow.input.adapter
    if adapter is not None:
        try:
            schema = adapter.json_schema()
        except Exception:  # a type pydantic cannot describe: the card simply has no schema
            schema = None
    fields: dict[str, Any] = {
        "name": flow.id,
        "description": description,
        "version": flow.version,
        "skills": (AgentSkill(id=flow.id, name=flow.id, description=description),),
        "flow_id": flow.id,
        "input_schema": schema,
    }
    fields.update(overrides)
    return AgentCard(**fields)


class InProcessA2ABus:
    """Agents and flows registered with a card; a task is an execution.

    Every run goes through ``dispatcher`` (default ``LocalDispatcher(LocalWorkerRuntime(
    runtime))``): swap in a dispatcher over ``RemoteWorkerRuntime``/``CloudRunWorkerRuntime``
    and tasks run off-box with no other change. The bus reads task state from ``runtime``'s
    store, so remote workers must share it (they do in every Loom deployment of a worker
    pool). A task's state follows the A2A lifecycle (see :class:`TaskState`); a message to an
    ``input-required`` task is a resume dispatch of the gate it waits on, through any number
    of gates. A superseded refusal (another holder owns the execution, ADR 0004) or a
    caller's task id that is already running is awaited by id, never reported as a failure.
    """

    def __init__(
        self,
        runtime: WorkflowRuntime,
        dispatcher: ExecutionDispatcher | None = None,
    ) -> None:
        self.runtime = runtime
        self.dispatcher: ExecutionDispatcher = dispatcher or LocalDispatcher(
            LocalWorkerRuntime(runtime)
        )
        self._cards: dict[str, AgentCard] = {}
        self._running: dict[str, asyncio.Task[Task]] = {}
        #: Packages dispatched by this bus, in order (what ran where is the dispatcher's).
        self.dispatched: list[ExecutionPackage] = []

    # ------------------------------------------------------------------ registry

    def register(
        self, target: Flow[Any, Any] | AgentCard, card: AgentCard | None = None
    ) -> AgentCard:
        """Register an agent or flow (registered on the runtime too, if it is not yet) under
        ``card`` (by default :func:`card_for`), or a bare card for a flow only remote
        workers hold. Returns the card."""
        if isinstance(target, AgentCard):
            card = target
        else:
            try:
                self.runtime.get_flow(target.id, target.version)
            except FlowNotFoundError:
                self.runtime.register(target)
            card = card or card_for(target)
        self._cards[card.name] = card
        return card

    def card(self, name: str) -> AgentCard:
        """The card registered as ``name``; :class:`UnknownAgentError` otherwise."""
        card = self._cards.get(name)
        if card is None:
            known = ", ".join(sorted(self._cards)) or "none"
            raise UnknownAgentError(
                f"no agent {name!r} on this bus (registered: {known})",
                hint="Register it with bus.register(agent)",
            )
        return card

    def cards(self) -> list[AgentCard]:
        return list(self._cards.values())

    # ------------------------------------------------------------------ tasks

    async def send(
        self,
        agent: str,
        message: Any,
        *,
        task_id: str | None = None,
        context_id: str | None = None,
        message_id: str | None = None,
        wait: bool = True,
    ) -> Task:
        """Send ``message`` to ``agent``; returns the task.

        Without ``task_id`` (or with one that does not exist yet) this starts a task whose
        input is ``message``. To an ``input-required`` task the message is the decision for
        the gate it waits on (a resume dispatch pinned to that gate). To a task that is
        working it is not delivered: the task is awaited by id. To a terminal task it is
        refused with :class:`TaskTerminalError`, dispatching nothing.

        ``message_id`` makes a retried send idempotent: a start derives its task id from it
        (when none is given), and a decision carries it as its idempotency key, so a gate
        that took it never takes it again. With ``wait=True`` (the default) this returns once
        the task settled (suspended at a gate, or ended); with ``wait=False`` at once, the
        run going on in the background (see :meth:`updates`).
        """
        card = self.card(agent)
        retried_start = task_id is None and message_id is not None
        if task_id is None:
            task_id = _task_id(agent, message_id)
        state = await self.runtime.load_state(task_id)
        package: ExecutionPackage | None
        if state is not None and retried_start:
            package = None  # this message started the task already: report it, deliver nothing
        elif state is None:
            package = ExecutionPackage(
                execution_id=task_id,
                flow_id=card.flow_id,
                workflow_id=context_id,
                input=message,
            )
        else:
            package = self._next(card, state, message, message_id)
        if package is None:
            # Running (a colliding task id, or another sender's resume): await it by id.
            if not wait:
                return Task.of(task_id, state, agent=agent)
            return await self._await(task_id, agent)
        if wait:
            return await self._run(package, agent)
        task = asyncio.ensure_future(self._run(package, agent))
        self._running[task_id] = task
        task.add_done_callback(functools.partial(self._forget, task_id))
        return Task.of(task_id, state, agent=agent, context_id=context_id)

    def _forget(self, task_id: str, task: asyncio.Task[Task]) -> None:
        if self._running.get(task_id) is task:
            del self._running[task_id]
        if not task.cancelled() and task.exception() is not None:
            log.warning("background task %s failed: %r", task_id, task.exception())

    def _next(
        self, card: AgentCard, state: ExecutionState, message: Any, message_id: str | None
    ) -> ExecutionPackage | None:
        task = Task.of(state.execution_id, state)
        if state.flow_id != card.flow_id:
            raise UnknownAgentError(
                f"task {state.execution_id!r} belongs to {state.flow_id!r}, not {card.name!r}",
                execution_id=state.execution_id,
                hint="Send it to the agent that owns the task, or use another task id",
            )
        if task.is_terminal:
            raise TaskTerminalError(
                f"task {state.execution_id!r} is {task.state.value}: it takes no more messages",
                execution_id=state.execution_id,
                hint="Start a new task (send without task_id)",
                state=task.state.value,
            )
        if task.state is not TaskState.INPUT_REQUIRED or task.gate is None:
            return None
        if message_id is not None and taken(state, keyed_id(message_id)) is not None:
            return None  # this very message was delivered already: report, deliver nothing
        gate = task.gate
        metadata = {IDEMPOTENCY_KEY: message_id} if message_id is not None else {}
        return ExecutionPackage(
            execution_id=state.execution_id,
            flow_id=state.flow_id,
            flow_version=state.flow_version,
            resume_event=ResumeEvent(gate.event_type, message, gate.position),
            from_sequence=state.last_sequence,
            metadata=metadata,
            intent=Intent.RESUME,
        )

    async def _run(self, package: ExecutionPackage, agent: str) -> Task:
        eid = package.execution_id
        self.dispatched.append(package)
        try:
            result: ExecutionResult = await self.dispatcher.dispatch(package)
        except Exception as exc:
            if is_superseded_refusal(exc, eid):
                # Another holder owns it (ADR 0004): its outcome is this task's outcome.
                log.info("dispatch of %s superseded; awaiting the holder by id", eid)
                return await self._await(eid, agent)
            if isinstance(exc, NotWaitingError):
                # The gate moved on under us (a duplicate or late decision): report, no retry.
                return await self.get(eid)
            raise
        task = Task.of(eid, result.folded, agent=agent)
        if task.state is TaskState.WORKING:
            # Suspended on the runtime's own wait (a sleep, its child executions): not a
            # settled task yet. Await it by id.
            return await self._await(eid, agent)
        return task

    async def _await(self, task_id: str, agent: str | None = None) -> Task:
        state = await self._settled(task_id, None)
        return Task.of(task_id, state, agent=agent)

    async def _settled(self, task_id: str, timeout: float | None) -> ExecutionState:
        async def wait(eid: str, left: float | None) -> ExecutionState:
            return await self.runtime.wait(eid, timeout=left, until="settled", missing_ok=True)

        return await settled(self.runtime.store, task_id, timeout=timeout, wait=wait)

    async def get(self, task_id: str) -> Task:
        """The task's current state, folded from the log. :class:`TaskNotFoundError` if no
        task of that id exists (nor one this bus is still submitting)."""
        state = await self.runtime.load_state(task_id)
        if state is None:
            if task_id in self._running:
                return Task(task_id, TaskState.SUBMITTED)
            raise TaskNotFoundError(f"no task {task_id!r}", execution_id=task_id)
        return Task.of(task_id, state)

    async def wait(
        self, task_id: str, *, timeout: float | None = None, missing_ok: bool = False
    ) -> Task:
        """Await the task by id until it ends or asks for input, whichever process drives
        it. :class:`TaskNotFoundError` for an unknown id, unless ``missing_ok`` (then it
        waits for the task to start, e.g. a child a parent is about to start)."""
        run = self._running.get(task_id)
        if run is not None:
            async with asyncio.timeout(timeout):  # not wait_for: 3.11's can swallow a cancel
                await asyncio.shield(run)
        elif not missing_ok and await self.runtime.load_state(task_id) is None:
            raise TaskNotFoundError(f"no task {task_id!r}", execution_id=task_id)
        return Task.of(task_id, await self._settled(task_id, timeout))

    async def cancel(self, task_id: str, reason: str | None = None) -> Task:
        """Cancel the task: the execution is cancelled in the log (its holder, wherever it
        runs, is fenced out and stops) and the dispatcher abandons its attempt. A terminal
        task is returned unchanged."""
        state = await self.runtime.load_state(task_id)
        if state is None:
            raise TaskNotFoundError(f"no task {task_id!r}", execution_id=task_id)
        if not state.is_terminal:
            state = await self.runtime.cancel(task_id, reason)
            await self.dispatcher.cancel(task_id)
        return Task.of(task_id, state)

    async def recover(self, *, is_abandoned: Callable[[ExecutionState], bool]) -> list[str]:
        """Redispatch the running tasks of this bus's agents that ``is_abandoned`` claims
        (e.g. all of them, in a server that is their only driver and just restarted): each
        continues from its log through the dispatcher, completed steps not re-run (ADR 0004).
        Required predicate, no default: only the deployment knows which holders are dead.

        A task suspended on a child execution that ended without telling it (the process
        died between the child's outcome and its message, here or further down a chain of
        child waits) is redispatched too, whatever the predicate says: nobody holds a
        suspended task, and the continue delivers that outcome once, so the task goes on.
        Returns the task ids redispatched; their runs go on in the background."""
        flows = {card.flow_id: card.name for card in self._cards.values()}
        claimed: list[str] = []
        async for summary in self.runtime.executions():
            status = summary.status
            if summary.flow_id not in flows:
                continue
            if status not in _LIVE and status is not ExecutionStatus.SUSPENDED:
                continue
            state = await self.runtime.load_state(summary.execution_id)
            if state is None:
                continue
            if state.status is ExecutionStatus.SUSPENDED:
                if await _children.untold_wait(self.runtime, state) is None:
                    continue  # waiting on a person, a timer or a child still running
            elif state.status not in _LIVE or not is_abandoned(state):
                continue
            package = ExecutionPackage(
                execution_id=state.execution_id,
                flow_id=state.flow_id,
                flow_version=state.flow_version,
                intent=Intent.CONTINUE,
                redispatch=True,
            )
            run = asyncio.ensure_future(self._run(package, flows[state.flow_id]))
            self._running[state.execution_id] = run
            run.add_done_callback(functools.partial(self._forget, state.execution_id))
            claimed.append(state.execution_id)
        return claimed

    async def updates(self, task_id: str, *, until_settled: bool = False) -> AsyncIterator[Task]:
        """The task's states as they commit: first the current one, then one per change,
        ending after a terminal state (or, with ``until_settled``, after ``input-required``).
        Follows ``runtime.subscribe``, so changes made by any process show up."""

        def last_one(task: Task) -> bool:
            return task.is_terminal or (until_settled and task.state is TaskState.INPUT_REQUIRED)

        state = await self.runtime.load_state(task_id)
        task = Task.of(task_id, state)
        yield task
        if last_one(task):
            return
        last = task.last_sequence
        # A task not started yet (its dispatch is under way) is waited for.
        follow = self.runtime.subscribe(task_id, after_sequence=last, missing_ok=state is None)
        async for envelope in follow:
            if envelope.sequence <= last:
                continue
            state = await self.runtime.load_state(task_id)
            task = Task.of(task_id, state)
            if task.last_sequence <= last:
                continue
            last = task.last_sequence
            yield task
            if last_one(task):
                return


def _task_id(agent: str, message_id: str | None) -> str:
    if message_id is None:
        return f"task-{uuid.uuid4().hex}"
    digest = hashlib.sha256(f"{agent}\x00{message_id}".encode()).hexdigest()[:32]
    return f"task-{digest}"
