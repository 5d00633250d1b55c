"""``loom worker serve``: serve a WorkflowRuntime's flows to remote dispatchers over HTTP.

Wired into the main CLI as ``loom worker``; also runnable as ``python -m loom.cli._worker``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from loom.cli._common import fail
from loom.errors import ConfigurationError, LoomError
from loom.runtime import WorkflowRuntime

if TYPE_CHECKING:
    from loom.placement.http import Authenticator, WorkerService

__all__ = ["build_authenticator", "load_runtime", "worker_app"]

log = logging.getLogger("loom.placement.http")

worker_app = typer.Typer(
    help="Run your flows for remote dispatchers (the HTTP worker).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@worker_app.callback()
def _group() -> None:
    """Run your flows for remote dispatchers (the HTTP worker)."""


async def load_runtime(spec: str) -> WorkflowRuntime:
    """Resolve ``module:attribute`` to a WorkflowRuntime: the instance itself, or a zero-argument
    Python function (sync or async) returning one, called inside the server's event loop.
    Builtins are never called (``--app os:system`` is refused)."""
    from loom.cli._load import call_factory, import_target

    target = await call_factory(spec, import_target(spec))
    if not isinstance(target, WorkflowRuntime):
        raise ConfigurationError(
            f"--app {spec!r} is not a WorkflowRuntime (nor a function returning one)",
            hint="Point it at the runtime that registers your flows, e.g. myapp.worker:runtime",
        )
    if not target.flows:
        raise ConfigurationError(f"the runtime at {spec!r} has no registered flows")
    return target


def build_authenticator(
    *,
    token_env: str | None,
    google_audience: str | None,
    google_emails: list[str] | None,
    google_certs_file: Path | None,
    no_auth: bool,
) -> Authenticator:
    """The worker's authenticator from the CLI options. Refuses to guess: with no option at
    all, it raises (serving without authentication takes ``--no-auth``)."""
    from loom.placement.http import AnyOfAuth, BearerTokenAuth, GoogleIdTokenAuth, NoAuth

    chosen: list[Authenticator] = []
    if token_env:
        secret = os.environ.get(token_env)
        if not secret:
            raise ConfigurationError(
                f"--token-env {token_env}: the environment variable {token_env} is not set"
            )
        chosen.append(BearerTokenAuth(secret))
    if google_audience:
        certs: dict[str, str | bytes] | None = None
        if google_certs_file is not None:
            try:
                loaded = json.loads(google_certs_file.read_text())
            except (OSError, ValueError) as exc:
                raise ConfigurationError(f"cannot read --google-certs-file: {exc}") from exc
            if not isinstance(loaded, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in loaded.items()
            ):
                raise ConfigurationError("--google-certs-file must hold {key id: PEM, ...}")
            certs = dict(loaded)
        chosen.append(
            GoogleIdTokenAuth(google_audience, certs=certs, allowed_emails=google_emails or None)
        )
    elif google_emails or google_certs_file:
        raise ConfigurationError("--google-email and --google-certs-file need --google-audience")
    if no_auth:
        if chosen:
            raise ConfigurationError("--no-auth contradicts the authentication options given")
        log.warning("serving WITHOUT authentication (--no-auth): anyone who reaches it runs flows")
        return NoAuth()
    if not chosen:
        raise ConfigurationError(
            "the worker needs authentication: --token-env NAME (a shared secret), "
            "--google-audience URL (Google ID tokens), or --no-auth to serve without any"
        )
    return chosen[0] if len(chosen) == 1 else AnyOfAuth(*chosen)


def _bind(host: str, port: int) -> socket.socket:
    """Bind and listen now, so ``--port 0`` can report the port the OS picked."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


async def _serve(
    *,
    app_spec: str,
    auth: Authenticator,
    host: str,
    port: int,
    max_body_bytes: int,
    drain_timeout: float,
    port_file: Path | None,
    log_level: str,
) -> None:
    try:
        import uvicorn

        from loom.placement.http import create_worker_app
    except ImportError as exc:
        raise ConfigurationError(
            f"the HTTP worker needs the 'server' extra ({exc.name} is not installed)",
            hint="pip install 'loom-runtime[server]'",
        ) from exc

    runtime = await load_runtime(app_spec)
    app = create_worker_app(
        runtime,
        auth=auth,
        max_body_bytes=max_body_bytes,
        drain_timeout=drain_timeout,
        close_runtime=True,
    )
    service: WorkerService = app.state.loom_worker
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Refuse new work (503, /readyz down) the moment the platform asks us to stop,
            # not only once uvicorn gets round to the lifespan shutdown.
            service.begin_drain()
            super().handle_exit(sig, frame)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                log.info(
                    "worker serving flows %s on http://%s:%d (POST /execute)",
                    ", ".join(sorted({f.id for f in runtime.flows})),
                    host,
                    bound_port,
                )
            if port_file is not None and not self.should_exit:
                # Written only once serving: a supervisor waiting for it can connect at once.
                tmp = port_file.with_name(port_file.name + ".tmp")
                tmp.write_text(f"{bound_port}\n")
                tmp.replace(port_file)

    config = uvicorn.Config(
        app,
        host=host,
        port=bound_port,
        log_level=log_level,
        lifespan="on",
        # Longer than the drain: at the drain deadline our handlers answer 503 themselves,
        # so uvicorn never has to cancel a request mid-answer.
        timeout_graceful_shutdown=int(drain_timeout) + 2,
        access_log=True,  # one line per request (uvicorn.access, at INFO)
    )
    server = _Server(config)
    try:
        await server.serve(sockets=[sock])
    finally:
        sock.close()


@worker_app.command("serve")
def serve(
    app: Annotated[
        str,
        typer.Option(
            "--app",
            metavar="MODULE:ATTR",
            envvar="LOOM_APP",
            help="module:attribute of your WorkflowRuntime (or a function returning one).",
        ),
    ],
    host: Annotated[
        str,
        typer.Option(
            "--host", metavar="HOST", envvar="LOOM_WORKER_HOST", help="Interface to bind."
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", metavar="PORT", envvar="PORT", help="Port (0: any free port).")
    ] = 8080,
    token_env: Annotated[
        str | None,
        typer.Option(
            "--token-env",
            metavar="NAME",
            envvar="LOOM_WORKER_TOKEN_ENV",
            help="Name of the environment variable holding the shared bearer secret.",
        ),
    ] = None,
    google_audience: Annotated[
        str | None,
        typer.Option(
            "--google-audience",
            metavar="URL",
            envvar="LOOM_WORKER_GOOGLE_AUDIENCE",
            help="Accept Google-signed ID tokens minted for this audience (e.g. the service URL).",
        ),
    ] = None,
    google_email: Annotated[
        list[str] | None,
        typer.Option(
            "--google-email",
            metavar="EMAIL",
            envvar="LOOM_WORKER_GOOGLE_EMAILS",
            help="Only accept ID tokens of these (service) accounts. Repeatable.",
        ),
    ] = None,
    google_certs_file: Annotated[
        Path | None,
        typer.Option(
            "--google-certs-file",
            metavar="PATH",
            envvar="LOOM_WORKER_GOOGLE_CERTS_FILE",
            help="JSON {key id: PEM} to verify ID tokens with instead of Google's published "
            "certificates (air-gapped setups, tests).",
        ),
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            envvar="LOOM_WORKER_NO_AUTH",
            help="Serve without authentication (only behind a front that authenticates).",
        ),
    ] = False,
    max_body_bytes: Annotated[
        int,
        typer.Option("--max-body-bytes", metavar="BYTES", help="Largest accepted request body."),
    ] = 1 << 20,
    drain_timeout: Annotated[
        float,
        typer.Option(
            "--drain-timeout",
            metavar="SECONDS",
            envvar="LOOM_WORKER_DRAIN_TIMEOUT",
            help="Seconds in-flight attempts get to finish on SIGTERM (keep it under the "
            "platform's grace period); the rest are left resumable.",
        ),
    ] = 8.0,
    port_file: Annotated[
        Path | None,
        typer.Option("--port-file", metavar="PATH", help="Write the bound port here once serving."),
    ] = None,
    log_level: Annotated[
        str,
        typer.Option("--log-level", metavar="LEVEL", envvar="LOOM_LOG_LEVEL", help="Log level."),
    ] = "info",
    as_json: Annotated[
        bool, typer.Option("--json", help="Errors as JSON on stdout.", show_default=False)
    ] = False,
) -> None:
    """Serve the flows of --app on POST /execute (plus /healthz, /readyz, /inflight)."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("loom").setLevel(log_level.upper())
    try:
        auth = build_authenticator(
            token_env=token_env,
            google_audience=google_audience,
            google_emails=google_email,
            google_certs_file=google_certs_file,
            no_auth=no_auth,
        )
        asyncio.run(
            _serve(
                app_spec=app,
                auth=auth,
                host=host,
                port=port,
                max_body_bytes=max_body_bytes,
                drain_timeout=drain_timeout,
                port_file=port_file,
                log_level=log_level.lower(),
            )
        )
    except LoomError as exc:
        fail(exc, as_json)
    except OSError as exc:
        fail(ConfigurationError(f"cannot serve on {host}:{port}: {exc}"), as_json)


if __name__ == "__main__":  # pragma: no cover - exercised by the end-to-end tests
    sys.exit(worker_app())
