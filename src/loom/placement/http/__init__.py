"""Remote compute: the HTTP worker and the WorkerRuntimes that call it.

Worker side (extra ``server``)::

    from loom.placement.http import BearerTokenAuth, create_worker_app
    app = create_worker_app(runtime, auth=BearerTokenAuth(os.environ["LOOM_WORKER_TOKEN"]))
    # or: loom worker serve --app myapp:runtime --token-env LOOM_WORKER_TOKEN

Dispatcher side (extra ``server`` for plain HTTP, ``cloudrun`` for Google ID tokens)::

    from loom.placement import LocalDispatcher
    from loom.placement.http import FailoverWorkerRuntime, RemoteWorkerRuntime
    workers = [RemoteWorkerRuntime(url, token=token) for url in urls]
    dispatcher = LocalDispatcher(FailoverWorkerRuntime(workers), max_attempts=2,
                                 execute_timeout=600)

Names are imported lazily, so a dispatcher-only install does not need Starlette and a worker
that checks bearer tokens does not need google-auth.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loom.placement.http._auth import (
        GOOGLE_CERTS_URL,
        GOOGLE_ISSUERS,
        AnyOfAuth,
        Authenticator,
        BearerTokenAuth,
        GoogleCerts,
        GoogleIdTokenAuth,
        NoAuth,
        Principal,
    )
    from loom.placement.http._cloudrun import (
        CloudRunWorkerRuntime,
        IdTokenCache,
        fetch_google_id_token,
    )
    from loom.placement.http._errors import AuthenticationError, RemoteWorkerError
    from loom.placement.http._failover import FailoverWorkerRuntime
    from loom.placement.http._holders import HoldsExecutions, no_live_holder
    from loom.placement.http._remote import RemoteWorkerRuntime, TokenSource
    from loom.placement.http._server import WorkerService, create_worker_app

__all__ = [
    "GOOGLE_CERTS_URL",
    "GOOGLE_ISSUERS",
    "AnyOfAuth",
    "AuthenticationError",
    "Authenticator",
    "BearerTokenAuth",
    "CloudRunWorkerRuntime",
    "FailoverWorkerRuntime",
    "GoogleCerts",
    "GoogleIdTokenAuth",
    "HoldsExecutions",
    "IdTokenCache",
    "NoAuth",
    "Principal",
    "RemoteWorkerError",
    "RemoteWorkerRuntime",
    "TokenSource",
    "WorkerService",
    "create_worker_app",
    "fetch_google_id_token",
    "no_live_holder",
]

# name -> (module, the extra that installs what the module imports)
_WHERE: dict[str, tuple[str, str]] = {
    **{
        name: ("loom.placement.http._auth", "server")
        for name in (
            "GOOGLE_CERTS_URL",
            "GOOGLE_ISSUERS",
            "AnyOfAuth",
            "Authenticator",
            "BearerTokenAuth",
            "GoogleCerts",
            "GoogleIdTokenAuth",
            "NoAuth",
            "Principal",
        )
    },
    "CloudRunWorkerRuntime": ("loom.placement.http._cloudrun", "cloudrun"),
    "IdTokenCache": ("loom.placement.http._cloudrun", "cloudrun"),
    "fetch_google_id_token": ("loom.placement.http._cloudrun", "cloudrun"),
    "AuthenticationError": ("loom.placement.http._errors", "server"),
    "RemoteWorkerError": ("loom.placement.http._errors", "server"),
    "FailoverWorkerRuntime": ("loom.placement.http._failover", "server"),
    "HoldsExecutions": ("loom.placement.http._holders", "server"),
    "no_live_holder": ("loom.placement.http._holders", "server"),
    "RemoteWorkerRuntime": ("loom.placement.http._remote", "server"),
    "TokenSource": ("loom.placement.http._remote", "server"),
    "WorkerService": ("loom.placement.http._server", "server"),
    "create_worker_app": ("loom.placement.http._server", "server"),
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, extra = where
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ImportError(
            f"loom.placement.http.{name} needs the {extra!r} extra ({exc.name} is missing): "
            f"pip install 'loom-runtime[{extra}]'"
        ) from exc
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
