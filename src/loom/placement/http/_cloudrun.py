"""CloudRunWorkerRuntime: the HTTP worker on Cloud Run, called with Google-signed ID tokens."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable

import httpx

from loom.errors import ConfigurationError
from loom.placement._spi import Health, WorkerLease
from loom.placement._wire import ExecutionPackage, ExecutionResult
from loom.placement.http._errors import RemoteWorkerError
from loom.placement.http._remote import RemoteWorkerRuntime

__all__ = ["CloudRunWorkerRuntime", "IdTokenCache", "fetch_google_id_token"]

log = logging.getLogger("loom.placement.http")

#: Mints an ID token for an audience (sync or async).
IdTokenSource = Callable[[str], str | Awaitable[str]]


def fetch_google_id_token(audience: str) -> str:
    """Mint a Google-signed ID token for ``audience`` (blocking; run it in a thread).

    Uses Application Default Credentials: the metadata server on Google Cloud (Cloud Run, GKE,
    GCE), or a service-account key named by ``GOOGLE_APPLICATION_CREDENTIALS`` elsewhere.
    Needs the ``cloudrun`` extra (google-auth and requests).
    """
    import google.auth.transport.requests
    import google.oauth2.id_token

    request = google.auth.transport.requests.Request()
    token: str = google.oauth2.id_token.fetch_id_token(request, audience)  # type: ignore[no-untyped-call]
    return token


def _expiry(token: str) -> float | None:
    """The token's ``exp`` claim (seconds since the epoch), read without verifying it: the
    caller only uses it to know when to mint the next one."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        exp = claims.get("exp")
    except (IndexError, ValueError, AttributeError):
        return None
    return float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None


class IdTokenCache:
    """Caches one ID token per audience and mints the next ``refresh_margin`` seconds before
    the current one expires. Concurrent callers share one mint. A sync ``source`` runs in a
    thread (Google's token fetch blocks on HTTP). A token whose expiry cannot be read is kept
    for ``fallback_ttl`` seconds.
    """

    def __init__(
        self,
        audience: str,
        source: IdTokenSource = fetch_google_id_token,
        *,
        refresh_margin: float = 300.0,
        fallback_ttl: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.audience = audience
        self._source = source
        self.refresh_margin = refresh_margin
        self.fallback_ttl = fallback_ttl
        self._clock = clock
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock = asyncio.Lock()
        self.mints = 0

    async def get(self) -> str:
        """A token valid for at least ``refresh_margin`` more seconds (when one can be had)."""
        async with self._lock:
            if self._token is None or self._clock() >= self._refresh_at:
                token = await self._mint()
                exp = _expiry(token)
                now = self._clock()
                self._refresh_at = (
                    now + self.fallback_ttl if exp is None else exp - self.refresh_margin
                )
                self._token = token
            return self._token

    def invalidate(self) -> None:
        """Forget the cached token (e.g. after a 401): the next call mints a new one."""
        self._token = None

    async def _mint(self) -> str:
        self.mints += 1
        if inspect.iscoroutinefunction(self._source):
            token = await self._source(self.audience)
        else:
            produced = await asyncio.to_thread(self._source, self.audience)
            token = await produced if inspect.isawaitable(produced) else produced
        if not isinstance(token, str) or not token:
            raise ConfigurationError(f"the ID-token source returned no token for {self.audience}")
        return token


class CloudRunWorkerRuntime:
    """A :class:`RemoteWorkerRuntime` for a worker deployed on Cloud Run (or behind any front
    that checks Google-signed ID tokens).

    Every request carries ``Authorization: Bearer <ID token>`` for ``audience`` (default: the
    service URL, which is what Cloud Run checks). Tokens are minted with
    :func:`fetch_google_id_token` in a thread, cached, and renewed ``refresh_margin`` seconds
    before they expire; a 401 drops the cached token so the retry mints a fresh one.
    ``token_source`` (``audience -> token``, sync or async) replaces Google's minting, e.g. in
    tests. Everything else (the outcome / failed-attempt split, the 409 mapping) is the
    RemoteWorkerRuntime's.
    """

    def __init__(
        self,
        service_url: str,
        *,
        audience: str | None = None,
        token_source: IdTokenSource | None = None,
        timeout: float | None = 300.0,
        client: httpx.AsyncClient | None = None,
        refresh_margin: float = 300.0,
        clock: Callable[[], float] = time.time,
        name: str | None = None,
    ) -> None:
        self.service_url = service_url.rstrip("/")
        self.audience = audience or self.service_url
        self.tokens = IdTokenCache(
            self.audience,
            token_source or fetch_google_id_token,
            refresh_margin=refresh_margin,
            clock=clock,
        )
        self.remote = RemoteWorkerRuntime(
            self.service_url,
            token_source=self.tokens.get,
            timeout=timeout,
            client=client,
            name=name,
        )

    async def allocate(self, package: ExecutionPackage) -> WorkerLease:
        return await self.remote.allocate(package)

    async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
        try:
            return await self.remote.execute(lease, package)
        except RemoteWorkerError as exc:
            if exc.status == 401:
                self.tokens.invalidate()
            raise

    async def release(self, lease: WorkerLease) -> None:
        await self.remote.release(lease)

    async def health(self) -> Health:
        return await self.remote.health()

    async def in_flight(self) -> set[str]:
        return await self.remote.in_flight()

    async def close(self) -> None:
        await self.remote.close()

    def __repr__(self) -> str:
        return f"<CloudRunWorkerRuntime {self.service_url}>"
