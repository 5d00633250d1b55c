"""The console's Starlette app: server-rendered pages over :class:`ConsoleData`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from loom.console import _api
from loom.console._data import ConsoleData, ListQuery
from loom.console._decide import form_fields, gate_schema, parse_form
from loom.console._security import ConsoleConfig, CsrfError, TokenMiddleware, check_csrf
from loom.console._views import (
    envelope_row,
    fmt_time,
    parse_sequence,
    pretty,
    step_rows,
)
from loom.errors import (
    BranchError,
    ConfigurationError,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    ForkError,
    GateTimedOutError,
    InvalidRefNameError,
    LoomError,
    NotWaitingError,
    PayloadError,
    RefNotFoundError,
    ResumeValidationError,
)
from loom.model import ExecutionStatus
from loom.runtime import Flow, WorkflowRuntime
from loom.storage import Store

__all__ = ["ConsoleConfig", "ConsolePage", "create_app", "error_status"]

HERE = Path(__file__).parent
STATUSES = [s.value for s in ExecutionStatus]
SINCE = {"hour": 3600.0, "day": 86400.0, "week": 7 * 86400.0}


@dataclass(frozen=True, slots=True)
class ConsolePage:
    """A page a layer adds to the console (the branch board, the learning report, agents).

    ``endpoint`` is a Starlette endpoint; it reaches the data through
    ``request.app.state.data`` (:class:`ConsoleData`) and renders with
    ``request.app.state.render(request, template, context)``. Its ``title`` appears in the nav.
    """

    path: str
    title: str
    endpoint: Callable[[Request], Awaitable[Response]]
    #: HTTP methods it answers (a form's POST target: check ``check_csrf`` in it).
    methods: tuple[str, ...] = ("GET",)
    #: Whether it appears in the nav (a POST target does not).
    nav: bool = True


def error_status(exc: LoomError) -> int:
    if isinstance(exc, ExecutionNotFoundError):
        return 404
    if isinstance(exc, CsrfError):
        return 403
    if isinstance(exc, (ResumeValidationError, PayloadError)):
        return 422
    if isinstance(exc, InvalidRefNameError):
        return 400
    if isinstance(exc, RefNotFoundError):
        return 404
    if isinstance(
        exc,
        (NotWaitingError, GateTimedOutError, ForkError, BranchError, ExecutionAlreadyExistsError),
    ):
        return 409
    if isinstance(exc, ConfigurationError):
        return 400
    return 500


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # nothing from the log is ever markup
        undefined=jinja2.StrictUndefined,
    )
    env.filters["time"] = fmt_time
    env.filters["pretty"] = pretty
    return env


class _Renderer:
    def __init__(self, pages: Sequence[ConsolePage]) -> None:
        self.env = _environment()
        self.nav = [("/executions", "Executions"), ("/gates", "Gates")] + [
            (p.path, p.title) for p in pages if p.nav
        ]

    def __call__(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> HTMLResponse:
        html = self.env.get_template(template).render(
            request=request,
            nav=self.nav,
            path=request.url.path,
            csrf_token=request.state.csrf_token,
            **context,
        )
        return HTMLResponse(html, status_code=status)


def _data(request: Request) -> ConsoleData:
    data: ConsoleData = request.app.state.data
    return data


def _render(request: Request) -> _Renderer:
    render: _Renderer = request.app.state.render
    return render


async def root(request: Request) -> Response:
    return RedirectResponse("/executions", status_code=303)


def _query(request: Request) -> ListQuery:
    p = request.query_params
    status = p.get("status") or None
    if status is not None and status not in STATUSES:
        raise ConfigurationError(f"unknown status {status!r}; one of {', '.join(STATUSES)}")
    since = p.get("since") or None
    if since is not None and since not in SINCE:
        raise ConfigurationError(f"unknown time filter {since!r}; one of {', '.join(SINCE)}")
    try:
        limit = int(p.get("limit") or 50)
    except ValueError:
        raise ConfigurationError(f"limit {p.get('limit')!r} is not a number") from None
    return ListQuery(
        status=status,
        flow_id=p.get("flow") or None,
        id_contains=p.get("q") or None,
        created_after=time.time() - SINCE[since] if since else None,
        after=p.get("after") or None,
        limit=max(1, min(limit, 500)),
    )


async def executions_page(request: Request) -> Response:
    q = _query(request)
    page = await _data(request).list_executions(q)
    params = {k: v for k, v in request.query_params.items() if k != "after" and v}
    return _render(request)(
        request,
        "executions.html",
        {
            "page": page,
            "rows": page.items,
            "q": q,
            "params": params,
            "since": request.query_params.get("since", ""),
            "statuses": STATUSES,
            "title": "Executions",
        },
    )


def _gate_context(data: ConsoleData, state: Any) -> dict[str, Any] | None:
    gate = state.waiting
    if gate is None or state.status is not ExecutionStatus.SUSPENDED:
        return None
    if gate.event_type == "loom.timer":
        return {"timer": True, "gate": gate}
    flow = data.flow_for(state)
    schema = gate_schema(flow, gate.event_type)
    return {
        "timer": False,
        "gate": gate,
        "fields": form_fields(schema),
        "has_code": flow is not None,
        "schema": schema,
    }


async def execution_page(request: Request) -> Response:
    data = _data(request)
    eid = request.path_params["execution_id"]
    envelopes = await data.timeline(eid)
    last = envelopes[-1].sequence
    at = parse_sequence(request.query_params.get("at"), last, eid)
    state = await data.state(eid)
    shown = state if at is None else await data.state(eid, at)
    return _render(request)(
        request,
        "execution.html",
        {
            "state": state,
            "shown": shown,
            "at": last if at is None else at,
            "last": last,
            "events": [envelope_row(e) for e in envelopes],
            "steps": step_rows(state, envelopes),
            "gate": _gate_context(data, state),
            "related": await data.related(eid),
            "error": request.query_params.get("error"),
            "title": eid,
        },
    )


async def gates_page(request: Request) -> Response:
    data = _data(request)
    page = await data.open_gates()
    gates = [(s, _gate_context(data, s)) for s in page.items]
    return _render(request)(request, "gates.html", {"gates": gates, "page": page, "title": "Gates"})


async def _form(request: Request) -> dict[str, str]:
    form = await request.form()
    await check_csrf(request, form)
    return {k: v for k, v in form.items() if isinstance(v, str)}


async def decide(request: Request) -> Response:
    """The gate form: approve / reject / submit, refused with the typed error's message."""
    data = _data(request)
    eid = request.path_params["execution_id"]
    form = await _form(request)
    state = await data.state(eid)
    ctx = _gate_context(data, state)
    event_type = form.get("event_type", "")
    back = form.get("back") or f"/executions/{eid}"
    if not back.startswith("/") or back.startswith("//"):  # a path here, never another site
        back = f"/executions/{eid}"
    try:
        if ctx is None or ctx["timer"]:
            raise NotWaitingError(
                f"execution {eid!r} is {state.status}, not waiting on a gate", execution_id=eid
            )
        payload = parse_form(ctx["schema"], form)
        action = form.get("action")
        if action in ("approve", "reject") and isinstance(payload, dict):
            payload["approved"] = action == "approve"
        await data.resume(eid, event_type, payload)
    except LoomError as exc:
        return _error_page(request, exc, back=back)
    return RedirectResponse(f"/executions/{eid}", status_code=303)


async def cancel(request: Request) -> Response:
    eid = request.path_params["execution_id"]
    form = await _form(request)
    await _data(request).cancel(eid, form.get("reason") or None)
    return RedirectResponse(f"/executions/{eid}", status_code=303)


async def recover(request: Request) -> Response:
    eid = request.path_params["execution_id"]
    await _form(request)
    await _data(request).recover(eid)
    return RedirectResponse(f"/executions/{eid}", status_code=303)


def _error_page(request: Request, exc: LoomError, back: str | None = None) -> Response:
    status = error_status(exc)
    if request.url.path.startswith("/api"):
        return JSONResponse({"error": exc.to_dict()}, status_code=status)
    return _render(request)(
        request,
        "error.html",
        {"error": exc, "status": status, "back": back, "title": "Refused"},
        status=status,
    )


async def _loom_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LoomError)
    return _error_page(request, exc)


def create_app(
    store: Store,
    flows: Sequence[Flow[Any, Any]] = (),
    *,
    config: ConsoleConfig | None = None,
    pages: Sequence[ConsolePage] = (),
    runtime: WorkflowRuntime | None = None,
) -> Starlette:
    """The console as an ASGI app over ``store`` (any store: SQLite, PostgreSQL, a tenant view).

    ``flows`` are needed to decide gates (their resume schemas build the forms) and to recover;
    without them the console only reads and cancels. ``pages`` add layers' pages to the nav.
    The app closes its runtime (and so the store) when it shuts down.
    """
    config = config or ConsoleConfig()
    config.check_binding()
    if runtime is None:
        runtime = WorkflowRuntime(store)
        runtime.register(*flows)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await runtime.close()

    routes: list[BaseRoute] = [
        Route("/", root),
        Route("/executions", executions_page),
        Route("/executions/{execution_id:str}", execution_page),
        Route("/executions/{execution_id:str}/decide", decide, methods=["POST"]),
        Route("/executions/{execution_id:str}/cancel", cancel, methods=["POST"]),
        Route("/executions/{execution_id:str}/recover", recover, methods=["POST"]),
        Route("/gates", gates_page),
        *_api.routes(),
        *(Route(p.path, p.endpoint, methods=list(p.methods)) for p in pages),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    hosts = [*config.allowed_hosts, config.host]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=["*"] if config.token else hosts),
            Middleware(TokenMiddleware, config=config),
        ],
        exception_handlers={LoomError: _loom_error},
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.data = ConsoleData(runtime)
    app.state.render = _Renderer(pages)
    return app
