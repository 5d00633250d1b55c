"""Child executions: a flow runs another flow as its own execution and waits for it durably.

The parent's log records two things per child, each at its own position:

* ``loom.child_started`` (kind ``loom.child``) once the child exists: the child's id, flow
  and version. The child is started *before* this record is written, with a deterministic id
  (the parent's id and the position, or the caller's), so a parent that crashes in between
  finds the child by id on replay and attaches to it: never a second child.
* a gate named ``loom.child:<child id>`` where the parent awaits the child's outcome. The
  parent suspends there (no process held). The child, when it ends, puts its outcome in the
  parent's durable mailbox under one key per child and delivers it, which resumes the parent
  if it waits on that child, or leaves the message for the gate when the parent gets there
  (several children may end in any order; the parent takes their outcomes in the order it
  asks for them). A parent that reaches the gate after the child ended without telling it
  (its process died in between) reads the child's outcome from the store itself.

The child's start record names its parent (``metadata["loom.parent_id"]``), so the execution
index lists a parent's children, and cancelling a parent cancels its running children.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loom.errors import (
    ChildFailedError,
    ConfigurationError,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    FlowNotFoundError,
    LoomError,
    NotWaitingError,
)
from loom.model import (
    Envelope,
    ExecutionResumed,
    ExecutionState,
    ExecutionStatus,
    ExecutionSuspended,
    OpKind,
    OpRecord,
    OpStatus,
    Payload,
    execution_id_problem,
    register_event,
)
from loom.runtime._sdk import Flow
from loom.storage import ExecutionIndex, MailboxStore, Message

if TYPE_CHECKING:
    from loom.runtime._context import WorkflowContext
    from loom.runtime._runtime import WorkflowRuntime

__all__ = [
    "CHILD_GATE_PREFIX",
    "CHILD_KIND",
    "CHILD_STARTED",
    "PARENT_KEY",
    "ChildHandle",
    "ChildStarted",
    "cancel_children",
    "child_ids",
    "notify_parent",
]

log = logging.getLogger("loom.runtime")

CHILD_STARTED = "loom.child_started"
CHILD_KIND = "loom.child"
#: A parent's wait for child ``c`` is the gate ``loom.child:c``.
CHILD_GATE_PREFIX = "loom.child:"
#: How far down a chain of child waits recovery looks for a child that ended untold.
_MAX_DEPTH = 64
#: Where a child's start record names its parent (the execution index reads it too).
PARENT_KEY = "loom.parent_id"
PARENT_POSITION_KEY = "loom.parent_position"


@dataclass(frozen=True, slots=True)
class ChildStarted(Payload):
    """The child ``child_id`` (running ``flow_id`` at ``flow_version``) exists: started by
    the parent at ``position``, or found there by id."""

    position: int
    child_id: str
    flow_id: str
    flow_version: str


def _fold_child_started(state: ExecutionState, e: ChildStarted, env: Envelope) -> None:
    if not isinstance(e.position, int) or e.position < 0 or not isinstance(e.child_id, str):
        raise ValueError("a child start needs a position >= 0 and a child id")
    state.ops[e.position] = OpRecord(
        CHILD_KIND,
        e.flow_id,
        OpStatus.COMPLETED,
        {"child_id": e.child_id, "flow_version": e.flow_version},
    )


register_event(CHILD_STARTED, ChildStarted, _fold_child_started)


def child_ids(state: ExecutionState) -> list[str]:
    """The ids of every child the execution's log records, in position order."""
    return [
        str(op.output["child_id"])
        for _, op in sorted(state.ops.items())
        if op.kind == CHILD_KIND and isinstance(op.output, dict) and "child_id" in op.output
    ]


def refuse_outside_answer(execution_id: str, event_type: str) -> None:
    """A wait for a child is answered by the child's end only, never by a resume or send."""
    if isinstance(event_type, str) and event_type.startswith(CHILD_GATE_PREFIX):
        raise NotWaitingError(
            f"{event_type!r} is execution {execution_id!r}'s wait for child "
            f"{event_type[len(CHILD_GATE_PREFIX) :]!r}: only that child's end answers it",
            execution_id=execution_id,
            hint="Resume or cancel the child itself",
        )


def _gate(child_id: str) -> str:
    return CHILD_GATE_PREFIX + child_id


def _key(child_id: str) -> str:
    # One message per child, whoever reports its end (the child, or the parent reading it).
    return "loom.child-ended:" + child_id


def outcome_payload(state: ExecutionState) -> dict[str, Any]:
    """What the parent's gate records about a child that ended."""
    payload: dict[str, Any] = {"child_id": state.execution_id, "status": state.status.value}
    if state.status is ExecutionStatus.COMPLETED:
        payload["output"] = state.output
    elif state.status is ExecutionStatus.FAILED:
        err = state.error or {}
        payload["error"] = {k: v for k, v in err.items() if k != "traceback"}
    else:
        payload["reason"] = state.cancel_reason
    return payload


class ChildHandle:
    """A child execution started by :meth:`WorkflowContext.start_child`. ``await handle``
    waits durably for its outcome: the child's output, or :class:`ChildFailedError`.

    Awaiting takes a position of the parent (its wait), so a parent awaits its children one
    after the other, in an order its code fixes (they still run at the same time).
    """

    def __init__(
        self,
        ctx: WorkflowContext,
        child_id: str,
        position: int,
        flow: Flow[Any, Any] | None,
        start: asyncio.Task[None] | None,
        input: Any = None,
    ) -> None:
        self._ctx = ctx
        #: The child's execution id.
        self.execution_id = child_id
        #: The parent's position that started it.
        self.position = position
        self._flow = flow
        self._start = start
        self._input = input
        self._raw = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._done = False

    @property
    def child_id(self) -> str:
        return self.execution_id

    def _settle(self, ctx: WorkflowContext, payload: Any) -> None:
        try:
            self._result = _outcome(ctx, self, payload)
        except ChildFailedError as exc:
            self._error = exc
        self._done = True

    def __await__(self) -> Generator[Any, None, Any]:
        return self._wait().__await__()

    async def _wait(self) -> Any:
        if not self._done:
            try:
                self._result = await _await_child(self._ctx, self)
            except ChildFailedError as exc:
                self._error = exc
            self._done = True
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        return f"<ChildHandle {self.execution_id!r} at position {self.position}>"


def _resolve(rt: WorkflowRuntime, flow: Flow[Any, Any] | str, parent_id: str) -> Flow[Any, Any]:
    if isinstance(flow, Flow):
        return flow
    if isinstance(flow, str):
        try:
            return rt.get_flow(flow)
        except FlowNotFoundError as exc:
            raise FlowNotFoundError(
                f"execution {parent_id!r} asked for a child of flow {flow!r}: {exc.message}",
                execution_id=parent_id,
                hint=f"Register flow {flow!r} on this runtime (runtime.register(flow)), or pass "
                "the @loom.flow object itself to ctx.call / ctx.start_child",
                flow_id=flow,
            ) from exc
    raise ConfigurationError(
        f"execution {parent_id!r} asked for a child of {flow!r}: a child runs a @loom.flow "
        "(or a registered flow id)",
        execution_id=parent_id,
    )


def start_child(
    ctx: WorkflowContext,
    flow: Flow[Any, Any] | str,
    input: Any,
    execution_id: str | None,
    *,
    raw: bool = False,
) -> ChildHandle:
    """See :meth:`WorkflowContext.start_child`. With ``raw`` the handle returns the child's
    output as recorded (JSON) instead of loading it through the flow's output type."""
    ctx._enter()
    driver = ctx._driver
    rt = driver.runtime
    parent_id = ctx.execution_id
    if rt is None:
        raise ConfigurationError(
            f"execution {parent_id!r} cannot start children outside a WorkflowRuntime",
            execution_id=parent_id,
        )
    resolved = _resolve(rt, flow, parent_id)
    pos, op = ctx._take_position(CHILD_KIND, resolved.id)
    if op is not None:
        # Started before (this is a replay): the log names the child; nothing is started.
        recorded = op.output if isinstance(op.output, dict) else {}
        handle = ChildHandle(ctx, str(recorded.get("child_id")), pos, resolved, None, input)
        handle._raw = raw
        return handle
    child_id = execution_id if execution_id is not None else f"{parent_id}.{pos}"
    problem = execution_id_problem(child_id)
    if problem is not None:
        raise ConfigurationError(
            f"execution {parent_id!r} cannot start a child with id {child_id!r}: {problem}",
            execution_id=parent_id,
        )
    if child_id == parent_id:
        raise ConfigurationError(
            f"execution {parent_id!r} cannot be its own child", execution_id=parent_id
        )
    # Checked here, at the call: bad input is the parent's bug, raised where it was made.
    encoded = resolved.encode_input(input, child_id, limits=rt.limits)
    if rt._flows.get(resolved.id, {}).get(resolved.version) is not resolved:
        rt.register(resolved)  # replay and the child's wake-up need it here
    task = asyncio.create_task(
        _start(ctx, rt, resolved, encoded, child_id, pos), name=f"loom:start-child:{child_id}"
    )
    rt._own(task)  # closing the runtime stops a start under way, like any of its tasks
    ctx._child_starts.append(task)
    handle = ChildHandle(ctx, child_id, pos, resolved, task, input)
    handle._raw = raw
    return handle


async def _start(
    ctx: WorkflowContext,
    rt: WorkflowRuntime,
    flow: Flow[Any, Any],
    encoded: Any,
    child_id: str,
    pos: int,
) -> None:
    parent_id = ctx.execution_id
    metadata = {PARENT_KEY: parent_id, PARENT_POSITION_KEY: pos}
    dispatcher = rt.dispatcher
    if dispatcher is None:
        try:
            await rt.start(flow, encoded, execution_id=child_id, metadata=metadata)
        except ExecutionAlreadyExistsError:
            # Started before the parent's record of it (a crash in between), or the caller's
            # id is taken: it is this parent's child only if it runs that flow for it.
            await _adopt(rt, child_id, flow, parent_id, pos)
    else:
        await _dispatch(rt, dispatcher, flow, encoded, child_id, metadata)
    # Written with the parent's next append (before any wait and before its outcome): the
    # child exists already, so a crash that loses the record only makes the replay attach.
    ctx._driver.pending_records.append(ChildStarted(pos, child_id, flow.id, flow.version))


async def _adopt(
    rt: WorkflowRuntime, child_id: str, flow: Flow[Any, Any], parent_id: str, pos: int
) -> None:
    state = await rt.load_state(child_id)
    if state is None:
        raise ExecutionNotFoundError(  # pragma: no cover - exists was just reported
            f"child {child_id!r} vanished", execution_id=parent_id
        )
    if (
        state.flow_id != flow.id
        or state.metadata.get(PARENT_KEY) != parent_id
        or state.metadata.get(PARENT_POSITION_KEY) != pos
    ):
        raise ExecutionAlreadyExistsError(
            f"execution {parent_id!r} cannot start child {child_id!r}: that id is taken by "
            f"another execution (flow {state.flow_id!r}, parent "
            f"{state.metadata.get(PARENT_KEY)!r} at position "
            f"{state.metadata.get(PARENT_POSITION_KEY)!r})",
            execution_id=parent_id,
            hint="Pass another execution_id to the child, or none for a derived one",
        )


async def _dispatch(
    rt: WorkflowRuntime,
    dispatcher: Any,
    flow: Flow[Any, Any],
    encoded: Any,
    child_id: str,
    metadata: dict[str, Any],
) -> None:
    """Place the child through the runtime's dispatcher, in the background: a dispatch runs to
    the child's suspension or end, and the parent must not hold its process that long."""
    # Imported here: placement is the layer above the runtime, and it is only needed when
    # the application gave the runtime a dispatcher.
    from loom.placement._wire import ExecutionPackage

    if await rt.store.last_sequence(child_id) >= 0:
        pos = int(metadata[PARENT_POSITION_KEY])
        await _adopt(rt, child_id, flow, str(metadata[PARENT_KEY]), pos)
        return
    package = ExecutionPackage(
        execution_id=child_id,
        flow_id=flow.id,
        input=encoded,
        flow_version=flow.version,
        metadata=dict(metadata),
    )

    async def run() -> None:
        try:
            await dispatcher.dispatch(package)
        except Exception as exc:  # the parent learns it from the child's gate
            log.warning("dispatch of child %s failed: %r", child_id, exc)
            if await rt.store.last_sequence(child_id) < 0:
                await _report(rt, str(metadata[PARENT_KEY]), child_id, _dispatch_failure(exc))

    placing = asyncio.create_task(run(), name=f"loom:dispatch-child:{child_id}")
    rt._own(placing)
    # The parent records the child once it exists (its sequence 0 is durable), as a local
    # start does, or once the dispatch gave up (its failure is then in the parent's mailbox).
    exists = asyncio.ensure_future(rt.store.wait_for_append(child_id, -1, timeout=None))
    try:
        await asyncio.wait({placing, exists}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        exists.cancel()


def _dispatch_failure(exc: BaseException) -> dict[str, Any]:
    error = exc.to_dict() if isinstance(exc, LoomError) else {"message": str(exc)}
    error["type"] = type(exc).__name__
    return {"status": "failed", "error": error, "dispatch": True}


async def _await_child(ctx: WorkflowContext, handle: ChildHandle) -> Any:
    await ctx.settle_child_starts()
    driver = ctx._driver
    rt = driver.runtime
    assert rt is not None
    gate = _gate(handle.execution_id)
    pos = ctx._position
    op = ctx.recorded(pos)
    if op is None:
        # First time here: a child that ended already is taken in one write, without
        # suspending (the common case when children run at the same time).
        message = await ctx._next_message(gate)
        if message is None:
            state = await rt.load_state(handle.execution_id)
            if state is not None and state.is_terminal:
                # Its outcome is durable, its message not (yet): store the message under the
                # child's own key (the child's later put is then a no-op) and take it.
                message = await _put(rt, ctx.execution_id, handle.execution_id, state)
        if message is not None:
            return _outcome(ctx, handle, await _take(ctx, gate, message))
    elif op.status is not OpStatus.RESOLVED:
        # A recovered holder waiting here: the child may have ended without reaching us (its
        # process died after its outcome). Its store record is the truth; report it.
        state = await rt.load_state(handle.execution_id)
        if state is not None and state.is_terminal:
            await _report(rt, ctx.execution_id, handle.execution_id, outcome_payload(state))
    payload = await ctx.suspend(gate)
    return _outcome(ctx, handle, payload)


def _outcome(ctx: WorkflowContext, handle: ChildHandle, payload: Any) -> Any:
    record = payload if isinstance(payload, dict) else {}
    status = record.get("status")
    if status == ExecutionStatus.COMPLETED.value:
        flow = handle._flow
        output = record.get("output")
        return output if flow is None or handle._raw else flow.output.load(output)
    error = record.get("error") if isinstance(record.get("error"), dict) else None
    if status == ExecutionStatus.CANCELLED.value:
        what = f"was cancelled ({record.get('reason')})"
    else:
        err = error or {}
        what = f"failed: {err.get('type', 'Error')}: {err.get('message', '')}"
    raise ChildFailedError(
        f"child execution {handle.execution_id!r} of {ctx.execution_id!r} {what}",
        execution_id=ctx.execution_id,
        hint=f"See `loom show {handle.execution_id}`",
        child_id=handle.execution_id,
        status=status,
        error=error,
        reason=record.get("reason"),
    )


async def _take(ctx: WorkflowContext, gate: str, message: Message) -> Any:
    """Record the wait at ``gate`` and its answer ``message`` in one write (the parent is
    never seen waiting), then mark the message taken."""
    await _take_many(ctx, [(gate, message)])
    return message.payload


async def _take_many(ctx: WorkflowContext, answers: Sequence[tuple[str, Message]]) -> None:
    """Record the waits at the next positions (one per gate, in order) with their answers in
    one write. The messages are marked taken afterwards, off the flow's path: the log is
    what says a message was taken (a mark lost to a crash is caught up when seen)."""
    ctx._enter()
    events: list[Any] = []
    for gate, message in answers:
        pos, _ = ctx._take_position(OpKind.GATE, gate)
        events.append(ExecutionSuspended(pos, gate, None, None))
        events.append(ExecutionResumed(pos, gate, message.payload, message.message_id))
    await ctx._driver.append(events)
    mailbox = ctx._driver.mailbox
    rt = ctx._driver.runtime
    if mailbox is None or rt is None:
        return
    box, eid = mailbox, ctx.execution_id
    ids = [m.message_id for _, m in answers]

    async def mark() -> None:
        try:
            await asyncio.gather(*(box.consume_message(eid, i) for i in ids))
        except Exception as exc:  # caught up when the gate's mailbox is next read
            log.warning("marking child outcomes of %s taken failed: %r", eid, exc)

    rt._spawn(mark(), f"loom:consume:{eid}")


async def _put(
    rt: WorkflowRuntime, parent_id: str, child_id: str, state: ExecutionState
) -> Message:
    from loom.runtime import _mailbox

    store = _mailbox_of(rt, parent_id, child_id)
    message_id = _mailbox.keyed_id(_key(child_id))
    message = Message(
        parent_id, message_id, _gate(child_id), outcome_payload(state), rt.clock.now()
    )
    return await store.put_message(message)


def _mailbox_of(rt: WorkflowRuntime, parent_id: str, child_id: str) -> MailboxStore:
    store = rt.store
    if not isinstance(store, MailboxStore):
        raise ConfigurationError(
            f"execution {parent_id!r} waits on child {child_id!r}, but this runtime's store "
            "keeps no mailbox",
            execution_id=parent_id,
            hint="Use a store that implements MailboxStore (memory, SQLite, PostgreSQL)",
        )
    return store


async def _report(rt: WorkflowRuntime, parent_id: str, child_id: str, payload: Any) -> None:
    """Put the child's outcome in the parent's mailbox (once per child) and deliver it."""
    from loom.runtime import _mailbox

    store = rt.store
    if not isinstance(store, MailboxStore):
        raise ConfigurationError(
            f"execution {parent_id!r} waits on child {child_id!r}, but this runtime's store "
            "keeps no mailbox",
            execution_id=parent_id,
            hint="Use a store that implements MailboxStore (memory, SQLite, PostgreSQL)",
        )
    gate = _gate(child_id)
    message_id = _mailbox.keyed_id(_key(child_id))
    await store.put_message(Message(parent_id, message_id, gate, payload, rt.clock.now()))
    if isinstance(store, ExecutionIndex):
        # The index row is written with each append: a parent not waiting on this child now
        # takes the message itself when it gets to it (it looks again once its wait is
        # durable), so only a parent waiting here is folded and resumed.
        summary = await store.get_summary(parent_id)
        if summary is not None and (
            summary.status is not ExecutionStatus.SUSPENDED or summary.waiting_for != gate
        ):
            return
    await _mailbox.deliver(rt, store, parent_id, gate)


async def notify_parent(rt: WorkflowRuntime, state: ExecutionState) -> None:
    """A child ended: tell its parent (if it has one). Never raises: the parent also reads a
    child's outcome from the store when it reaches its gate."""
    parent_id = state.metadata.get(PARENT_KEY)
    if not isinstance(parent_id, str) or not state.is_terminal:
        return
    try:
        await _report(rt, parent_id, state.execution_id, outcome_payload(state))
    except (NotWaitingError, ExecutionNotFoundError):
        pass  # the parent ended (or is gone): nobody waits
    except Exception as exc:
        log.warning(
            "child %s ended, but telling its parent %s failed (it reads the outcome when "
            "it reaches the child's gate): %r",
            state.execution_id,
            parent_id,
            exc,
            extra={"execution_id": state.execution_id},
        )


async def untold_wait(
    rt: WorkflowRuntime, state: ExecutionState
) -> tuple[ExecutionState, ExecutionState] | None:
    """Along the chain of child waits from ``state`` (a parent waiting on a child waiting on
    its own child, ...), the first ``(parent, child)`` whose child ended without telling its
    parent; None if none did."""
    for _ in range(_MAX_DEPTH):
        gate = state.waiting
        if (
            state.status is not ExecutionStatus.SUSPENDED
            or gate is None
            or not gate.event_type.startswith(CHILD_GATE_PREFIX)
        ):
            return None
        child = await rt.load_state(gate.event_type[len(CHILD_GATE_PREFIX) :])
        if child is None:
            return None
        if child.is_terminal:
            return state, child
        state = child
    return None


async def recheck_wait(rt: WorkflowRuntime, state: ExecutionState) -> bool:
    """A parent suspended on a child that ended without telling it (the child's process died
    between its outcome and its message), here or further down its chain of child waits:
    tell it now. True if that resumed one. Delivery is once per child (a keyed message a
    gate takes once), so a second call, or a racing one, changes nothing."""
    found = await untold_wait(rt, state)
    if found is None:
        return False
    parent, child = found
    await _report(rt, parent.execution_id, child.execution_id, outcome_payload(child))
    return True


async def cancel_children(rt: WorkflowRuntime, state: ExecutionState, reason: str | None) -> None:
    """Cancel every child of ``state`` that has not ended (their children in turn)."""
    why = f"parent {state.execution_id!r} was cancelled" + (f": {reason}" if reason else "")
    for child_id in child_ids(state):
        try:
            child = await rt.load_state(child_id)
            if child is not None and not child.is_terminal:
                await rt.cancel(child_id, reason=why)
        except Exception as exc:
            log.warning("cancelling child %s of %s failed: %r", child_id, state.execution_id, exc)


#: Runs a graph inside a flow on child executions (set by ``loom.orchestration``, the layer
#: that defines graphs): ``runner(ctx, graph, input) -> GraphRun``.
_graph_runner: Callable[[WorkflowContext, Any, Any], Awaitable[Any]] | None = None


def register_graph_runner(runner: Callable[[WorkflowContext, Any, Any], Awaitable[Any]]) -> None:
    """Install what ``ctx.execute_graph`` runs (the orchestration layer does, on import)."""
    global _graph_runner
    _graph_runner = runner


async def execute_graph(ctx: WorkflowContext, graph: Any, input: Any) -> Any:
    """See :meth:`WorkflowContext.execute_graph`."""
    if _graph_runner is None:
        raise ConfigurationError(
            f"execution {ctx.execution_id!r} asked to run a graph, but loom.orchestration "
            "is not loaded",
            execution_id=ctx.execution_id,
            hint="Build the graph with loom.orchestration.Graph",
        )
    return await _graph_runner(ctx, graph, input)


async def fan_out(
    ctx: WorkflowContext,
    branches: Sequence[Any],
    return_exceptions: bool,
) -> list[Any]:
    """See :meth:`WorkflowContext.fan_out`."""
    pairs: list[tuple[Flow[Any, Any] | str, Any]] = []
    for i, branch in enumerate(branches):
        if not isinstance(branch, tuple) or len(branch) != 2:
            raise ConfigurationError(
                f"execution {ctx.execution_id!r}: fan_out branch {i} is {branch!r}, not a "
                "(flow, input) pair",
                execution_id=ctx.execution_id,
            )
        pairs.append(branch)
    handles = [start_child(ctx, flow, inp, None) for flow, inp in pairs]
    return await await_all(ctx, handles, return_exceptions)


async def await_all(
    ctx: WorkflowContext, handles: Sequence[ChildHandle], return_exceptions: bool
) -> list[Any]:
    """Await ``handles`` in order (children that ended already are taken in one write); a
    failed child raises :class:`ChildFailedError`, or with ``return_exceptions`` takes its
    place in the list."""
    await ctx.settle_child_starts()
    results: list[Any] = []
    for i, handle in enumerate(handles):
        if not handle._done and ctx.recorded(ctx._position) is None:
            # Children that ended already (in order from here) are taken in one write.
            ready: list[tuple[ChildHandle, Message]] = []
            for later in handles[i:]:
                message = await ctx._next_message(_gate(later.execution_id))
                if message is None:
                    break
                ready.append((later, message))
            if len(ready) > 1:
                await _take_many(ctx, [(_gate(h.execution_id), m) for h, m in ready])
                for h, m in ready:
                    h._settle(ctx, m.payload)
        try:
            results.append(await handle)
        except ChildFailedError as exc:
            if not return_exceptions:
                raise
            results.append(exc)
    return results
