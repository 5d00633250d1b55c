"""The A2A protocol edge (extra ``a2a``): one registered agent served over A2A 1.0 JSON-RPC.

    from loom.orchestration import InProcessA2ABus
    from loom.orchestration.a2a import create_a2a_app
    bus = InProcessA2ABus(runtime); bus.register(review)
    app = create_a2a_app(bus, agent="review", url="https://agents.example.com/")

Routes: ``GET /.well-known/agent-card.json`` (the agent card) and ``POST /`` (JSON-RPC
``SendMessage``, ``SendStreamingMessage`` and ``SubscribeToTask`` over server-sent events,
``GetTask``, ``CancelTask``). Every task is a bus task, so a durable execution: a server killed
mid-task loses nothing; after a restart ``GetTask`` answers from the log, and ``recover=``
continues the tasks its predicate claims. A new task's id derives from the message id, and a
follow-up message's id is its decision's idempotency key, so a retried request never runs
twice. Bad input (malformed JSON or JSON-RPC, an unknown method, an oversized body, wrong-typed
or unsupported parts) is answered with the protocol's error code before anything is dispatched.

Messages and tasks are read and written as the a2a-sdk's own protobuf types (its JSON mapping),
so the wire is the SDK's, field for field.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

try:
    from a2a.types import a2a_pb2 as pb
    from google.protobuf import json_format  # type: ignore[import-untyped]
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        f"loom.orchestration.a2a needs the 'a2a' extra ({exc.name} is missing): "
        "pip install 'loom-runtime[a2a]'"
    ) from exc

from loom.errors import ResumeError
from loom.model import ExecutionState
from loom.orchestration._bus import InProcessA2ABus
from loom.orchestration._errors import TaskNotFoundError, TaskTerminalError, UnknownAgentError
from loom.orchestration._tasks import Task, TaskState

__all__ = ["A2A_ERRORS", "PROTOCOL_VERSION", "agent_card_json", "create_a2a_app", "task_json"]

log = logging.getLogger("loom.orchestration.a2a")

PROTOCOL_VERSION = "1.0"
CARD_PATH = "/.well-known/agent-card.json"

#: The JSON-RPC error codes of A2A 1.0 this edge answers with.
A2A_ERRORS = {
    "parse": -32700,
    "invalid_request": -32600,
    "method_not_found": -32601,
    "invalid_params": -32602,
    "internal": -32603,
    "task_not_found": -32001,
    "task_not_cancelable": -32002,
    "unsupported_operation": -32004,
    "content_type_not_supported": -32005,
}

_STATES = {
    TaskState.SUBMITTED: "TASK_STATE_SUBMITTED",
    TaskState.WORKING: "TASK_STATE_WORKING",
    TaskState.INPUT_REQUIRED: "TASK_STATE_INPUT_REQUIRED",
    TaskState.COMPLETED: "TASK_STATE_COMPLETED",
    TaskState.FAILED: "TASK_STATE_FAILED",
    TaskState.CANCELED: "TASK_STATE_CANCELED",
    TaskState.REJECTED: "TASK_STATE_REJECTED",
}


class _RpcError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.code = A2A_ERRORS[kind]
        self.message = message


def agent_card_json(bus: InProcessA2ABus, agent: str, url: str) -> dict[str, Any]:
    """The A2A agent card of ``agent`` (as the SDK's ``AgentCard`` JSON)."""
    card = bus.card(agent)
    proto = pb.AgentCard(
        name=card.name,
        description=card.description or card.name,
        version=card.version,
        supported_interfaces=[
            pb.AgentInterface(
                url=url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION
            )
        ],
        capabilities=pb.AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=list(card.input_modes),
        default_output_modes=list(card.output_modes),
        skills=[
            pb.AgentSkill(
                id=s.id,
                name=s.name,
                description=s.description or s.name,
                tags=list(s.tags) or [card.name],
                examples=list(s.examples),
                input_modes=list(s.input_modes or ()),
                output_modes=list(s.output_modes or ()),
            )
            for s in card.skills
        ],
    )
    return dict(json_format.MessageToDict(proto))


def _part(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {"text": value, "mediaType": "text/plain"}
    return {"data": value, "mediaType": "application/json"}


def task_json(task: Task) -> dict[str, Any]:
    """``task`` as an A2A ``Task`` (checked against the SDK's type)."""
    status: dict[str, Any] = {
        "state": _STATES[task.state],
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    note: dict[str, Any] | None = None
    if task.state is TaskState.INPUT_REQUIRED and task.gate is not None:
        note = {"gate": task.gate.event_type, "position": task.gate.position}
    elif task.error is not None:
        note = {"error": task.error.get("message"), "type": task.error.get("type")}
    if note is not None:
        status["message"] = {
            "messageId": f"{task.id}:{task.last_sequence}",
            "taskId": task.id,
            "contextId": task.context_id or task.id,
            "role": "ROLE_AGENT",
            "parts": [_part(note)],
        }
    body: dict[str, Any] = {
        "id": task.id,
        "contextId": task.context_id or task.id,
        "status": status,
        "metadata": {"loom": {"agent": task.agent, "last_sequence": task.last_sequence}},
    }
    if task.state is TaskState.COMPLETED:
        parts = [_part(task.output)] if task.output is not None else []
        text = task.output.get("text") if isinstance(task.output, dict) else None
        if isinstance(text, str) and text:
            parts.insert(0, _part(text))  # an agent's answer, readable as plain text
        body["artifacts"] = [{"artifactId": f"{task.id}:output", "name": "output", "parts": parts}]
    # Round trip through the SDK's type: what leaves is exactly its wire shape.
    return dict(json_format.MessageToDict(json_format.ParseDict(body, pb.Task())))


def _message_value(message: pb.Message, input_modes: tuple[str, ...]) -> Any:
    """What a bus message carries: the one data part's value, or the text parts joined."""
    if not message.parts:
        raise _RpcError("invalid_params", "message.parts must hold at least one part")
    texts: list[str] = []
    data: list[Any] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind == "data":
            data.append(json_format.MessageToDict(part.data))
        elif kind is None:
            raise _RpcError("invalid_params", "a part has no content (text, data, raw or url)")
        else:
            raise _RpcError(
                "content_type_not_supported", f"this agent takes text or data parts, not {kind}"
            )
    if (data and texts) or len(data) > 1:
        raise _RpcError("invalid_params", "send one data part, or text parts only")
    if data:
        if "application/json" not in input_modes:
            raise _RpcError("content_type_not_supported", "this agent takes text only")
        return data[0]
    if "text/plain" not in input_modes:
        raise _RpcError("content_type_not_supported", "this agent takes data only")
    return "\n".join(texts)


def create_a2a_app(
    bus: InProcessA2ABus,
    *,
    agent: str,
    url: str | None = None,
    max_body_bytes: int = 1 << 20,
    recover: Callable[[ExecutionState], bool] | None = None,
) -> Starlette:
    """A Starlette app serving ``agent`` (registered on ``bus``) over A2A.

    ``url`` is the JSON-RPC endpoint announced in the card (default: this app's root as
    requested). A body over ``max_body_bytes`` is refused (``-32600``) unread. ``recover``:
    at startup, :meth:`InProcessA2ABus.recover` continues the running tasks it claims (pass
    ``lambda state: True`` when this server is the only driver of its store).
    """
    card = bus.card(agent)

    async def well_known(request: Request) -> Response:
        return JSONResponse(agent_card_json(bus, agent, url or str(request.url_for("rpc"))))

    async def rpc(request: Request) -> Response:
        request_id: Any = None
        try:
            body = await _read(request, max_body_bytes)
            try:
                envelope = json.loads(body)
            except (ValueError, UnicodeDecodeError) as exc:
                raise _RpcError("parse", f"the body is not JSON: {exc}") from exc
            method, params, request_id = _envelope(envelope)
            if method in ("SendStreamingMessage", "SubscribeToTask"):
                stream = await _stream(method, params)
                return StreamingResponse(_sse(stream, request_id), media_type="text/event-stream")
            handler = methods.get(method)
            if handler is None:
                raise _RpcError("method_not_found", f"no method {method!r}")
            result = await handler(params)
            return JSONResponse({"jsonrpc": "2.0", "id": request_id, "result": result})
        except _RpcError as exc:
            return _error(request_id, exc.code, exc.message)
        except Exception as exc:
            log.exception("A2A request failed")
            return _error(request_id, A2A_ERRORS["internal"], f"{type(exc).__name__}: {exc}")

    def _parse(params: Any, proto: Any) -> Any:
        try:
            return json_format.ParseDict(params, proto, ignore_unknown_fields=True)
        except (json_format.ParseError, TypeError, ValueError) as exc:
            raise _RpcError("invalid_params", f"invalid params: {exc}") from exc

    async def _submit(params: Any, *, wait: bool) -> Task:
        request = _parse(params, pb.SendMessageRequest())
        message = request.message
        if not message.message_id:
            raise _RpcError("invalid_params", "message.messageId is required")
        value = _message_value(message, card.input_modes)
        task_id = message.task_id or None
        if task_id is not None:
            try:
                await bus.get(task_id)
            except TaskNotFoundError as exc:
                raise _RpcError("task_not_found", f"no task {task_id!r}") from exc
        try:
            return await bus.send(
                agent,
                value,
                task_id=task_id,
                context_id=message.context_id or None,
                message_id=message.message_id,
                wait=wait and not request.configuration.return_immediately,
            )
        except TaskTerminalError as exc:
            raise _RpcError("unsupported_operation", exc.message) from exc
        except UnknownAgentError as exc:  # a task id of another agent: not this agent's task
            raise _RpcError("task_not_found", exc.message) from exc
        except ResumeError as exc:  # a malformed or refused decision: nothing recorded
            raise _RpcError("invalid_params", exc.message) from exc

    async def send_message(params: Any) -> dict[str, Any]:
        return {"task": task_json(await _submit(params, wait=True))}

    async def get_task(params: Any) -> dict[str, Any]:
        request = _parse(params, pb.GetTaskRequest())
        try:
            return task_json(await bus.get(request.id))
        except TaskNotFoundError as exc:
            raise _RpcError("task_not_found", f"no task {request.id!r}") from exc

    async def cancel_task(params: Any) -> dict[str, Any]:
        request = _parse(params, pb.CancelTaskRequest())
        try:
            current = await bus.get(request.id)
        except TaskNotFoundError as exc:
            raise _RpcError("task_not_found", f"no task {request.id!r}") from exc
        if current.is_terminal:
            raise _RpcError("task_not_cancelable", f"task {request.id!r} is {current.state.value}")
        return task_json(await bus.cancel(request.id, "cancelled over A2A"))

    async def _stream(method: str, params: Any) -> AsyncIterator[dict[str, Any]]:
        if method == "SendStreamingMessage":
            # A follow-up starts from the input-required state it answers: the stream ends
            # at the NEXT settled state, not at that one.
            task_id = str((params.get("message") or {}).get("taskId") or "") or None
            before = -1
            if isinstance(task_id, str):
                with contextlib.suppress(TaskNotFoundError):
                    before = (await bus.get(task_id)).last_sequence
            first = await _submit(params, wait=False)
            return _events(first.id, before)
        else:
            request = _parse(params, pb.SubscribeToTaskRequest())
            task_id = request.id
            try:
                first = await bus.get(task_id)
            except TaskNotFoundError as exc:
                raise _RpcError("task_not_found", f"no task {task_id!r}") from exc
            if first.is_terminal:
                raise _RpcError("unsupported_operation", f"task {task_id!r} has ended")
        return _events(task_id, -1)

    async def _events(task_id: str, before: int) -> AsyncIterator[dict[str, Any]]:
        sent_task = False
        async for update in bus.updates(task_id):
            body = task_json(update)
            settled = update.is_terminal or (
                update.state is TaskState.INPUT_REQUIRED and update.last_sequence > before
            )
            if not sent_task:
                sent_task = True
                yield {"task": body}
            else:
                yield {
                    "statusUpdate": {
                        "taskId": body["id"],
                        "contextId": body["contextId"],
                        "status": body["status"],
                    }
                }
            if settled:
                return
        if not sent_task:
            yield {"task": task_json(await bus.get(task_id))}

    methods: dict[str, Callable[[Any], Any]] = {
        "SendMessage": send_message,
        "GetTask": get_task,
        "CancelTask": cancel_task,
    }

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if recover is not None:
            claimed = await bus.recover(is_abandoned=recover)
            if claimed:
                log.info("continuing %d task(s) after a restart: %s", len(claimed), claimed)
        yield

    return Starlette(
        routes=[
            Route(CARD_PATH, well_known, methods=["GET"]),
            Route("/", rpc, methods=["POST"], name="rpc"),
        ],
        lifespan=lifespan,
    )


async def _read(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _RpcError("invalid_request", f"payload too large (over {limit} bytes)")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _RpcError("invalid_request", f"payload too large (over {limit} bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def _envelope(envelope: Any) -> tuple[str, Any, Any]:
    if not isinstance(envelope, dict):
        raise _RpcError("invalid_request", "a JSON-RPC request must be an object")
    request_id = envelope.get("id")
    if request_id is not None and (
        isinstance(request_id, bool) or not isinstance(request_id, (str, int))
    ):
        raise _RpcError("invalid_request", "id must be a string, a number or null")
    method = envelope.get("method")
    if envelope.get("jsonrpc") != "2.0" or not isinstance(method, str):
        raise _RpcError("invalid_request", 'a JSON-RPC 2.0 request needs "jsonrpc" and "method"')
    params = envelope.get("params", {})
    if not isinstance(params, dict):
        raise _RpcError("invalid_params", "params must be an object")
    return method, params, request_id


def _error(request_id: Any, code: int, message: str) -> JSONResponse:
    return JSONResponse(
        {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    )


async def _sse(events: AsyncIterator[dict[str, Any]], request_id: Any) -> AsyncIterator[bytes]:
    try:
        async for result in events:
            frame = {"jsonrpc": "2.0", "id": request_id, "result": result}
            yield f"data: {json.dumps(frame)}\n\n".encode()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the stream already started: report it as its last event
        log.exception("A2A stream failed")
        frame = {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": {"code": A2A_ERRORS["internal"], "message": str(exc)},
        }
        yield f"event: error\ndata: {json.dumps(frame)}\n\n".encode()
