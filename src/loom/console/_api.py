"""The JSON API under ``/api`` (what the pages' scripts call, and scripts may too) and the
server-sent event stream of an execution's log."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from loom.console._data import ConsoleData
from loom.console._security import check_csrf
from loom.console._views import envelope_row, execution_row, parse_sequence, step_rows
from loom.errors import ConfigurationError, PayloadError
from loom.model import apply_event, decode_json, replay

__all__ = ["routes"]


def _data(request: Request) -> ConsoleData:
    data: ConsoleData = request.app.state.data
    return data


async def list_executions(request: Request) -> Response:
    from loom.console._app import _query

    page = await _data(request).list_executions(_query(request))
    return JSONResponse(
        {
            "items": page.items,
            "next_cursor": page.next_cursor,
            "partial": page.partial,
        }
    )


async def execution(request: Request) -> Response:
    data = _data(request)
    eid = request.path_params["execution_id"]
    envelopes = await data.timeline(eid)
    state = await data.state(eid)
    return JSONResponse(
        {
            "execution": execution_row(state),
            "related": await data.related(eid),
            "state": state.to_dict(),
            "steps": step_rows(state, envelopes),
            "timeline": [envelope_row(e) for e in envelopes],
        }
    )


async def state_at(request: Request) -> Response:
    """The folded state as of ``?at=N`` (the slider)."""
    data = _data(request)
    eid = request.path_params["execution_id"]
    envelopes = await data.timeline(eid)
    at = parse_sequence(request.query_params.get("at"), envelopes[-1].sequence, eid)
    state = replay(envelopes if at is None else envelopes[: at + 1])
    event = envelopes[state.last_sequence]
    return JSONResponse(
        {"sequence": state.last_sequence, "event": envelope_row(event), "state": state.to_dict()}
    )


async def export(request: Request) -> Response:
    """The execution's log itself: a JSON array of envelopes that replays in a test."""
    eid = request.path_params["execution_id"]
    envelopes = await _data(request).timeline(eid)
    return JSONResponse(
        [e.to_dict() for e in envelopes],
        headers={"content-disposition": f'attachment; filename="{eid}.json"'},
    )


async def gates(request: Request) -> Response:
    page = await _data(request).open_gates()
    return JSONResponse(
        {
            "items": [
                {**execution_row(s), "gate": s.waiting.to_dict() if s.waiting else None}
                for s in page.items
            ],
            "partial": page.partial,
        }
    )


async def _json_body(request: Request) -> dict[str, Any]:
    await check_csrf(request)
    raw = (await request.body()).decode("utf-8", "replace") or "{}"
    try:
        body = decode_json(raw)
    except PayloadError as exc:
        raise PayloadError(f"the request body is not acceptable JSON: {exc.message}") from None
    if not isinstance(body, dict):
        raise PayloadError("the request body must be a JSON object")
    return body


async def resume(request: Request) -> Response:
    """``{"event_type": ..., "payload": ...}``: decide a gate (validated by its schema)."""
    eid = request.path_params["execution_id"]
    body = await _json_body(request)
    event_type = body.get("event_type")
    if not isinstance(event_type, str):
        raise ConfigurationError("the body needs an event_type", execution_id=eid)
    state = await _data(request).resume(eid, event_type, body.get("payload"))
    return JSONResponse({"execution": execution_row(state), "state": state.to_dict()})


async def cancel(request: Request) -> Response:
    eid = request.path_params["execution_id"]
    body = await _json_body(request)
    reason = body.get("reason")
    state = await _data(request).cancel(eid, reason if isinstance(reason, str) else None)
    return JSONResponse({"execution": execution_row(state)})


async def recover(request: Request) -> Response:
    eid = request.path_params["execution_id"]
    await _json_body(request)
    state = await _data(request).recover(eid)
    return JSONResponse({"execution": execution_row(state)})


async def csrf(request: Request) -> Response:
    """This browser's (or script's cookie jar's) CSRF token, for POSTs from scripts."""
    return JSONResponse({"csrf_token": request.state.csrf_token})


async def events(request: Request) -> Response:
    """Server-sent events: every envelope after ``Last-Event-ID`` (or ``?after=``), then new
    ones live. Each event's id is its sequence, so a reconnecting browser resumes exactly."""
    data = _data(request)
    eid = request.path_params["execution_id"]
    envelopes = await data.timeline(eid)
    raw = request.headers.get("last-event-id") or request.query_params.get("after")
    after = -1
    if raw not in (None, "", "-1"):
        parsed = parse_sequence(raw, envelopes[-1].sequence, eid)
        after = -1 if parsed is None else parsed
    state = replay(envelopes[: after + 1]) if after >= 0 else None

    async def stream() -> AsyncIterator[str]:
        nonlocal state
        yield "retry: 1000\n\n"
        async for env in data.follow(eid, after):
            if env is None:
                yield ": keep-alive\n\n"
                continue
            if state is None:
                state = replay([env])
            else:
                apply_event(state, env)
            message = {
                "envelope": envelope_row(env),
                "status": state.status.value,
                "last_sequence": state.last_sequence,
            }
            yield f"id: {env.sequence}\nevent: envelope\ndata: {json.dumps(message)}\n\n"

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


def routes() -> list[Route]:
    base = "/api/executions/{execution_id:str}"
    return [
        Route("/api/executions", list_executions),
        Route("/api/csrf", csrf),
        Route("/api/gates", gates),
        Route(base, execution),
        Route(f"{base}/state", state_at),
        Route(f"{base}/export", export),
        Route(f"{base}/events", events),
        Route(f"{base}/resume", resume, methods=["POST"]),
        Route(f"{base}/cancel", cancel, methods=["POST"]),
        Route(f"{base}/recover", recover, methods=["POST"]),
    ]
