"""The DB command center as a service: a JSON API over HTTP (Starlette) in front of the
``db-command-center`` flow, its executions placed through a dispatcher (HTTP worker processes,
or in-process). The service keeps no state of its own: every answer is read from the store.

    POST /api/requests                 {"text": "...", "operator": "..."} -> 202 {"id": ...}
    GET  /api/requests                 newest first: id, status, phase, request
    GET  /api/requests/{id}            status, UI projection, output
    GET  /api/approvals                the writes waiting for approval, with their row counts
    POST /api/requests/{id}/approve    {"by": "..."}
    POST /api/requests/{id}/reject     {"by": "...", "reason": "..."}
    POST /api/requests/{id}/cancel     {"reason": "..."}
    GET  /api/requests/{id}/events     server-sent events: the status and UI projection after
                                       every committed change, until the request ends
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from examples._support import Placement, index_of
from examples.db_command_center.app import FLOW_ID, GATE
from examples.db_command_center.app import Request as CommandRequest
from loom.errors import LoomError
from loom.model import ExecutionState, ExecutionStatus
from loom.storage import ExecutionQuery


def _view(state: ExecutionState) -> dict[str, Any]:
    return {
        "id": state.execution_id,
        "status": str(state.status),
        "phase": state.ui.get("phase"),
        "request": state.ui.get("request"),
        "ui": dict(state.ui),
        "output": state.output if state.status is ExecutionStatus.COMPLETED else None,
        "cancel_reason": state.cancel_reason,
    }


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


class CommandCenterService:
    """The routes, over one placement."""

    def __init__(self, placement: Placement) -> None:
        self.placement = placement
        self.runtime = placement.runtime
        self._running: set[asyncio.Task[Any]] = set()

    def routes(self) -> list[Route]:
        return [
            Route("/api/requests", self.submit, methods=["POST"]),
            Route("/api/requests", self.list_requests, methods=["GET"]),
            Route("/api/requests/{id}", self.get_request, methods=["GET"]),
            Route("/api/approvals", self.approvals, methods=["GET"]),
            Route("/api/requests/{id}/approve", self.approve, methods=["POST"]),
            Route("/api/requests/{id}/reject", self.reject, methods=["POST"]),
            Route("/api/requests/{id}/cancel", self.cancel, methods=["POST"]),
            Route("/api/requests/{id}/events", self.events, methods=["GET"]),
            Route("/healthz", self.health, methods=["GET"]),
        ]

    def app(self) -> Starlette:
        return Starlette(routes=self.routes())

    async def health(self, request: Request) -> Response:
        workers = [{"pid": p.pid, "exit_code": p.poll()} for p in self.placement.procs]
        return JSONResponse({"ok": True, "placement": self.placement.kind, "workers": workers})

    async def _body(self, request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            body = None
        return body if isinstance(body, dict) else {}

    async def submit(self, request: Request) -> Response:
        body = await self._body(request)
        text = str(body.get("text") or "").strip()
        if not text:
            return _error(400, "a request needs a non-empty 'text'")
        eid = f"req-{uuid.uuid4().hex[:10]}"
        job = CommandRequest(text=text, operator=str(body.get("operator") or "operator"))
        # The worker runs it to its gate or its end; the client follows it by id.
        task = asyncio.create_task(self.placement.start(FLOW_ID, job.model_dump(), eid))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return JSONResponse({"id": eid, "status": "submitted"}, status_code=202)

    async def list_requests(self, request: Request) -> Response:
        page = await index_of(self.runtime.store).list_executions(
            ExecutionQuery(flow_id=FLOW_ID, limit=int(request.query_params.get("limit", 50)))
        )
        out = []
        for summary in page.items:
            state = await self.runtime.load_state(summary.execution_id)
            if state is not None:
                view = _view(state)
                view.pop("ui")
                out.append(view)
        return JSONResponse({"requests": out})

    async def get_request(self, request: Request) -> Response:
        state = await self.runtime.load_state(request.path_params["id"])
        if state is None:
            return _error(404, f"no request {request.path_params['id']!r}")
        return JSONResponse(_view(state))

    async def approvals(self, request: Request) -> Response:
        page = await index_of(self.runtime.store).list_executions(
            ExecutionQuery(flow_id=FLOW_ID, statuses=[ExecutionStatus.SUSPENDED], limit=200)
        )
        pending = []
        for summary in page.items:
            state = await self.runtime.load_state(summary.execution_id)
            if state is not None and state.waiting is not None and state.ui.get("pending"):
                pending.append(
                    {"id": state.execution_id, "request": state.ui.get("request"),
                     **state.ui["pending"]}
                )  # fmt: skip
        return JSONResponse({"approvals": pending})

    async def _decide(self, request: Request, approved: bool) -> Response:
        eid = request.path_params["id"]
        body = await self._body(request)
        by = str(body.get("by") or "").strip()
        if not by:
            return _error(400, "a decision needs 'by' (who decides)", id=eid)
        state = await self.runtime.load_state(eid)
        if state is None:
            return _error(404, f"no request {eid!r}")
        if state.waiting is None or state.waiting.event_type != GATE:
            return _error(409, f"request {eid!r} is {state.status}, not waiting for approval")
        decision = {"approved": approved, "by": by, "reason": str(body.get("reason") or "")}
        try:
            result = await self.placement.resume(eid, GATE, decision)
        except LoomError as exc:
            return _error(409, exc.message if hasattr(exc, "message") else str(exc), id=eid)
        return JSONResponse(_view(result.folded))

    async def approve(self, request: Request) -> Response:
        return await self._decide(request, True)

    async def reject(self, request: Request) -> Response:
        return await self._decide(request, False)

    async def cancel(self, request: Request) -> Response:
        eid = request.path_params["id"]
        body = await self._body(request)
        if await self.runtime.load_state(eid) is None:
            return _error(404, f"no request {eid!r}")
        state = await self.runtime.cancel(eid, reason=str(body.get("reason") or "cancelled"))
        return JSONResponse(_view(state))

    async def events(self, request: Request) -> Response:
        eid = request.path_params["id"]

        async def stream() -> AsyncIterator[str]:
            state = await self.runtime.load_state(eid)
            last = -1
            if state is not None:
                last = state.last_sequence
                yield f"data: {json.dumps(_view(state))}\n\n"
                if state.is_terminal:
                    return
            async for envelope in self.runtime.subscribe(eid, after_sequence=last):
                if await request.is_disconnected():
                    return
                state = await self.runtime.load_state(eid)
                if state is None or state.last_sequence < envelope.sequence:
                    continue
                yield f"data: {json.dumps(_view(state))}\n\n"

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )
