"""The HTTP worker: a Starlette app that runs ExecutionPackages on a local WorkflowRuntime.

``POST /execute`` takes an :class:`ExecutionPackage` and answers its :class:`ExecutionResult`
(flow failures and suspensions included: they are outcomes). Every refusal is a typed JSON body
(see :mod:`loom.placement.http._protocol`), and every request that is refused before it runs
(unauthenticated, oversized, malformed, wrong wire version, unknown flow) writes nothing at all
to the store: all of those checks happen before the attempt takes its fence.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loom.errors import ExecutionNotFoundError, LoomError, PayloadError, WireFormatError
from loom.placement._spi import is_superseded_refusal
from loom.placement._wire import ExecutionPackage, ExecutionResult, Intent
from loom.placement.http._auth import Authenticator, Principal
from loom.placement.http._errors import AuthenticationError
from loom.placement.http._protocol import (
    EXECUTE_PATH,
    HEALTH_PATH,
    INFLIGHT_PATH,
    READY_PATH,
    error_body,
    status_for,
    superseded_body,
)
from loom.placement.local import LocalWorkerRuntime
from loom.runtime import WorkflowRuntime

__all__ = ["WorkerService", "create_worker_app"]

log = logging.getLogger("loom.placement.http")

#: ``on_superseded(package, error)``; may return an awaitable.
SupersededHook = Callable[[ExecutionPackage, BaseException], object]
#: ``on_error(package or None, error)``; may return an awaitable. None: the body was unreadable.
ErrorHook = Callable[[ExecutionPackage | None, BaseException], object]

DEFAULT_MAX_BODY_BYTES = 1 << 20


class _BodyTooLargeError(Exception):
    pass


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(body, status_code=status, headers=headers)


def _error(status: int, err: LoomError, headers: dict[str, str] | None = None) -> Response:
    return _json(status, error_body(err), headers)


def _internal_body(exc: BaseException, execution_id: str | None) -> dict[str, Any]:
    # An unexpected exception's message may carry internals (paths, DSNs); send its type only.
    message = f"the attempt failed on the worker ({type(exc).__name__}); see the worker's log"
    return {
        "error": message,
        "code": "internal",
        "execution_id": execution_id,
        "detail": {
            "type": "LoomError",
            "code": "internal",
            "message": message,
            "execution_id": execution_id,
            "hint": None,
            "details": {"exception": type(exc).__name__},
        },
    }


class WorkerService:
    """The state behind one worker app: the attempts in flight and the drain.

    Reachable as ``app.state.loom_worker``. ``begin_drain`` (called by ``loom worker serve`` on
    SIGTERM/SIGINT) makes ``/readyz`` and new ``/execute`` calls answer 503 at once, so load
    balancers and dispatchers move on; the lifespan shutdown then waits for the attempts in
    flight until the drain deadline.
    """

    def __init__(
        self,
        worker: LocalWorkerRuntime,
        *,
        auth: Authenticator,
        max_body_bytes: int,
        on_superseded: SupersededHook | None,
        on_error: ErrorHook | None,
        drain_timeout: float,
        close_runtime: bool,
        readiness_timeout: float,
    ) -> None:
        self.worker = worker
        self.runtime: WorkflowRuntime = worker.runtime
        self.auth = auth
        self.max_body_bytes = max_body_bytes
        self.on_superseded = on_superseded
        self.on_error = on_error
        self.drain_timeout = drain_timeout
        self.close_runtime = close_runtime
        self.readiness_timeout = readiness_timeout
        #: every attempt running here, by task (an attempt outlives a cancelled request)
        self.attempts: dict[asyncio.Task[ExecutionResult], str] = {}
        self.draining = False
        self._drain_deadline: float | None = None
        self._expired = asyncio.Event()  # set when the drain deadline passes
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---------------------------------------------------------------- drain

    def begin_drain(self) -> None:
        """Refuse new work from now on; in-flight attempts get ``drain_timeout`` seconds.

        Safe to call from a signal handler: the timer is scheduled thread-safely.
        """
        if self.draining:
            return
        self.draining = True
        self._drain_deadline = time.monotonic() + self.drain_timeout
        log.info("draining: %d attempt(s) in flight", len(self.attempts))
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._arm_drain_timer)

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the app serves on (so a signal handler can arm the drain timer)."""
        self._loop = loop

    def _arm_drain_timer(self) -> None:
        assert self._drain_deadline is not None
        delay = max(0.0, self._drain_deadline - time.monotonic())
        asyncio.get_running_loop().call_later(delay, self._expired.set)

    async def drain(self) -> list[str]:
        """Wait (bounded) for the attempts in flight; return the ids left unfinished.

        At the deadline each unfinished attempt is stopped and its caller answered 503: the
        execution is left exactly as durable as its last append, running in the log and
        resumable by a redispatch or ``recover_abandoned``. Nothing is half-written, because
        every append is one atomic batch.
        """
        self._loop = asyncio.get_running_loop()
        self.begin_drain()
        self._arm_drain_timer()  # again: begin_drain may have run before there was a loop
        tasks = list(self.attempts)
        left: list[str] = []
        if tasks:
            finished = asyncio.ensure_future(asyncio.wait(tasks))
            expired = asyncio.ensure_future(self._expired.wait())
            try:
                await asyncio.wait([finished, expired], return_when=asyncio.FIRST_COMPLETED)
            finally:
                finished.cancel()
                expired.cancel()
            pending = [t for t in tasks if not t.done()]
            # Normally the handlers stopped these at the deadline; catch any stragglers.
            left = sorted({self.attempts.get(t, "?") for t in pending})
            for task in pending:
                self.runtime.stop_driving(self.attempts.get(task, ""), "drain deadline")
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        if self.close_runtime:
            # Stops the drivers of anything still running; their executions stay resumable.
            await self.runtime.close()
        if left:
            log.warning("drain deadline passed; left resumable: %s", ", ".join(left))
        return left

    # ---------------------------------------------------------------- routes

    async def authenticate(self, request: Request) -> Principal | Response:
        try:
            return await self.auth.authenticate(request.headers.get("authorization"))
        except AuthenticationError as exc:
            log.info("refused an unauthenticated %s %s", request.method, request.url.path)
            return _error(401, exc, {"WWW-Authenticate": 'Bearer realm="loom-worker"'})
        except Exception as exc:
            log.exception("the authenticator failed")
            err = LoomError(
                "the worker could not check credentials right now",
                hint="Retry later; see the worker's log",
            )
            err.__cause__ = exc
            return _error(503, err)

    async def execute(self, request: Request) -> Response:
        if self.draining:
            return _error(503, LoomError("the worker is shutting down", hint="Dispatch elsewhere"))
        principal = await self.authenticate(request)
        if isinstance(principal, Response):
            return principal
        package: ExecutionPackage | None = None
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media and media != "application/json":
            wrong = WireFormatError(f"POST {EXECUTE_PATH} takes application/json, not {media!r}")
            await self._call(self.on_error, None, wrong)
            return _error(415, wrong)
        try:
            body = await self._read_body(request)
            package = ExecutionPackage.from_json(body)
            await self._preflight(package)
        except _BodyTooLargeError:
            large = PayloadError(f"the request body is over the {self.max_body_bytes}-byte limit")
            await self._call(self.on_error, None, large)
            return _error(413, large)
        except LoomError as exc:
            await self._call(self.on_error, package, exc)
            return _error(status_for(exc), exc)
        except Exception as exc:
            log.error("refusing a request: the pre-flight check failed", exc_info=exc)
            await self._call(self.on_error, package, exc)
            return _json(500, _internal_body(exc, package.execution_id if package else None))
        eid = package.execution_id
        self._loop = asyncio.get_running_loop()
        task = asyncio.create_task(self._attempt(package), name=f"loom-http:{eid}")
        self.attempts[task] = eid
        task.add_done_callback(self._attempt_done)
        # asyncio.wait never cancels what it waits for: a caller that hangs up (a cancelled
        # request) does not stop the attempt half-way; it runs to suspend-or-complete, and the
        # drain waits for it. Only the drain deadline stops it.
        expired = asyncio.ensure_future(self._expired.wait())
        try:
            await asyncio.wait([task, expired], return_when=asyncio.FIRST_COMPLETED)
        finally:
            expired.cancel()
        if not task.done():
            log.warning("drain deadline passed: stopped the attempt on %s (resumable)", eid)
            # The flow runs in the runtime's driver task, not in this attempt: stop (and fence
            # out) the driver too, or it would run on until runtime.close().
            self.runtime.stop_driving(eid, "drain deadline")
            task.cancel()
            return self._stopped(eid)
        try:
            result = task.result()
        except asyncio.CancelledError:
            return self._stopped(eid)
        except Exception as exc:
            if is_superseded_refusal(exc, eid):
                log.info("superseded on %s: another holder owns it", eid)
                await self._call(self.on_superseded, package, exc)
                return _json(409, superseded_body(eid))
            await self._call(self.on_error, package, exc)
            if isinstance(exc, LoomError):
                return _error(status_for(exc), exc)
            log.error("attempt on %s failed", eid, exc_info=exc)
            return _json(500, _internal_body(exc, eid))
        return Response(result.to_json(), media_type="application/json")

    @staticmethod
    def _stopped(eid: str) -> Response:
        # The drain stopped the attempt, not the caller's fault: say so, it can go elsewhere.
        return _error(
            503,
            LoomError(
                "the worker shut down during the attempt",
                execution_id=eid,
                hint="The execution is resumable: redispatch it (to another worker)",
            ),
        )

    async def healthz(self, request: Request) -> Response:
        return _json(200, {"status": "alive"})

    async def readyz(self, request: Request) -> Response:
        if self.draining:
            return _json(503, {"status": "draining", "in_flight": len(self.attempts)})
        try:
            async with asyncio.timeout(self.readiness_timeout):  # not wait_for (3.11 cancels)
                await self.runtime.store.last_sequence("__readyz__")
        except Exception as exc:
            log.warning("not ready: the store is unreachable: %r", exc)
            code = exc.code if isinstance(exc, LoomError) else type(exc).__name__
            return _json(503, {"status": "store unreachable", "code": code})
        return _json(200, {"status": "ready", "in_flight": len(self.attempts)})

    async def inflight(self, request: Request) -> Response:
        principal = await self.authenticate(request)
        if isinstance(principal, Response):
            return principal
        ids = sorted(set(self.attempts.values()))
        return _json(200, {"execution_ids": ids, "draining": self.draining})

    # ---------------------------------------------------------------- helpers

    async def _read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                raise WireFormatError("the Content-Length header is not a number") from None
            if size > self.max_body_bytes:
                raise _BodyTooLargeError
        # Count what actually arrives too: a chunked body has no Content-Length, and a
        # declared length proves nothing about the bytes that follow.
        buffer = bytearray()
        async for chunk in request.stream():
            buffer += chunk
            if len(buffer) > self.max_body_bytes:
                raise _BodyTooLargeError
        return bytes(buffer)

    async def _preflight(self, package: ExecutionPackage) -> None:
        """Refuse what cannot run before allocate(), which takes a fence (a store write).

        Unknown code is refused always; a resume of an unknown execution and a start whose
        input fails the flow's schema only when the execution does not exist yet (a redispatch
        of an existing one is judged by its own pinned version, inside the attempt).
        """
        eid = package.execution_id
        flow = self.runtime.get_flow(package.flow_id, package.flow_version)
        if await self.runtime.store.last_sequence(eid) >= 0:
            return
        if package.intent is not Intent.START:
            raise ExecutionNotFoundError(
                f"cannot {package.intent} {eid!r}: it does not exist in this worker's store",
                execution_id=eid,
            )
        flow.encode_input(package.input, eid, limits=self.runtime.limits)

    async def _attempt(self, package: ExecutionPackage) -> ExecutionResult:
        lease = await self.worker.allocate(package)
        try:
            return await self.worker.execute(lease, package)
        finally:
            await self.worker.release(lease)

    def _attempt_done(self, task: asyncio.Task[ExecutionResult]) -> None:
        self.attempts.pop(task, None)
        # Retrieve the outcome so an attempt whose request is gone never logs "never retrieved".
        if not task.cancelled():
            task.exception()

    @staticmethod
    async def _call(hook: Callable[..., object] | None, *args: Any) -> None:
        if hook is None:
            return
        try:
            result = hook(*args)
            if inspect.isawaitable(result):
                await result
        except Exception:
            # A failing hook must not change what the caller is told.
            log.exception("a worker hook raised")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    err = LoomError(f"{request.method} {request.url.path}: {exc.detail}")
    return _json(exc.status_code, error_body(err), dict(exc.headers or {}))


def create_worker_app(
    runtime_or_worker: WorkflowRuntime | LocalWorkerRuntime,
    *,
    auth: Authenticator,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    on_superseded: SupersededHook | None = None,
    on_error: ErrorHook | None = None,
    drain_timeout: float = 10.0,
    close_runtime: bool = False,
    readiness_timeout: float = 5.0,
) -> Starlette:
    """An ASGI app serving ``runtime_or_worker``'s flows to remote dispatchers.

    Routes: ``POST /execute`` (package in, result out: allocate -> execute -> release on a
    :class:`LocalWorkerRuntime`), ``GET /healthz`` (the process is alive), ``GET /readyz`` (the
    store answers; 503 while draining), ``GET /inflight`` (authenticated: the execution ids with
    an attempt running here, for a ``recover_abandoned`` predicate).

    ``auth`` is required: pass :class:`BearerTokenAuth`, :class:`GoogleIdTokenAuth`,
    :class:`AnyOfAuth` of them, or :class:`NoAuth` explicitly. Unauthenticated calls get 401
    and run nothing. Bodies over ``max_body_bytes`` (by Content-Length or as streamed) get 413.

    A superseded refusal (:func:`is_superseded_refusal`) is answered ``409 {"error":
    "execution superseded", "code": "superseded", "execution_id": ...}`` and reported to
    ``on_superseded``, never to ``on_error``; every other refusal or failure after
    authentication is reported to ``on_error`` and answered with its typed error.

    On lifespan shutdown, attempts in flight get until the drain deadline (``drain_timeout``
    seconds after :meth:`WorkerService.begin_drain`, or after shutdown began) to finish; the
    rest are left resumable. With ``close_runtime`` the app then closes the runtime.
    """
    if max_body_bytes < 1:
        raise ValueError("max_body_bytes must be positive")
    if isinstance(runtime_or_worker, LocalWorkerRuntime):
        worker = runtime_or_worker
    elif isinstance(runtime_or_worker, WorkflowRuntime):
        worker = LocalWorkerRuntime(runtime_or_worker, name="http")
    else:
        raise TypeError(
            f"create_worker_app() takes a WorkflowRuntime or a LocalWorkerRuntime, "
            f"not {type(runtime_or_worker).__name__}"
        )
    if not isinstance(auth, Authenticator):
        raise TypeError("auth must be an Authenticator (pass NoAuth() to serve without one)")
    service = WorkerService(
        worker,
        auth=auth,
        max_body_bytes=max_body_bytes,
        on_superseded=on_superseded,
        on_error=on_error,
        drain_timeout=drain_timeout,
        close_runtime=close_runtime,
        readiness_timeout=readiness_timeout,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.bind_loop(asyncio.get_running_loop())
        yield
        await service.drain()

    app = Starlette(
        routes=[
            Route(EXECUTE_PATH, service.execute, methods=["POST"]),
            Route(HEALTH_PATH, service.healthz, methods=["GET"]),
            Route(READY_PATH, service.readyz, methods=["GET"]),
            Route(INFLIGHT_PATH, service.inflight, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.loom_worker = service
    return app
