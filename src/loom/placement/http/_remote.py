"""RemoteWorkerRuntime: a WorkerRuntime that runs packages on an HTTP worker."""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import httpx

from loom.errors import (
    ConfigurationError,
    ExecutionSupersededError,
    LoomError,
    PayloadError,
    WireFormatError,
    error_from_dict,
)
from loom.model import DEFAULT_LIMITS, PayloadLimits, decode_json
from loom.placement._spi import Health, WorkerLease
from loom.placement._wire import ExecutionPackage, ExecutionResult
from loom.placement.http._errors import RemoteWorkerError
from loom.placement.http._protocol import (
    EXECUTE_PATH,
    INFLIGHT_PATH,
    READY_PATH,
    REFUSAL_TYPES,
    SUPERSEDED_CODE,
)

__all__ = ["RemoteWorkerRuntime", "TokenSource"]

#: Returns the bearer token to send (called before every request; cache inside it).
TokenSource = Callable[[], str | Awaitable[str]]

# 4xx answers that say nothing about the package itself: the attempt failed, retry it.
_ATTEMPT_FAILURES = frozenset({401, 403, 408, 409, 425, 429})


class RemoteWorkerRuntime:
    """Runs packages on a remote HTTP worker (``loom worker serve`` / ``create_worker_app``).

    ``allocate`` is local and returns a lease with ``fence=0``: the fence is taken by the
    remote worker for each attempt, on its side of the wire. ``execute`` POSTs the package and
    draws a strict line between an outcome and a failed attempt:

    * ``200``: the :class:`ExecutionResult`, whatever the flow did (completed, failed,
      suspended): an outcome, never retried by a dispatcher;
    * ``409`` whose ``code`` is ``"superseded"`` AND whose ``execution_id`` is the package's:
      :class:`ExecutionSupersededError` (another holder owns it; a dispatcher does not retry);
    * a typed 4xx about the package (unknown flow, invalid input, unknown execution...): that
      typed error, rebuilt with :func:`loom.errors.error_from_dict`;
    * anything else (connection refused or reset, timeout, 5xx, 401/403, any other 409, an
      unreadable answer): :class:`RemoteWorkerError` or :class:`WireFormatError`, a failed
      attempt the dispatcher may retry. No refusal type sent by a worker is ever rebuilt as
      such: only the exact 409 counts, so a worker cannot stop retries by mistake.

    ``token`` is a fixed bearer token; ``token_source`` a callable (sync or async) asked before
    every request, which should cache. ``timeout`` bounds the whole wait for an answer (None:
    wait as long as the dispatcher does; give the dispatcher an ``execute_timeout`` then).
    ``client`` lets you share an ``httpx.AsyncClient`` (it is then not closed by :meth:`close`).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        token_source: TokenSource | None = None,
        timeout: float | None = 300.0,
        connect_timeout: float = 10.0,
        client: httpx.AsyncClient | None = None,
        name: str | None = None,
        max_response_bytes: int = 64 << 20,
        health_timeout: float = 5.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigurationError(f"a worker URL must be http(s)://host[:port], not {url!r}")
        if token is not None and token_source is not None:
            raise ConfigurationError("give RemoteWorkerRuntime a token or a token_source, not both")
        self.url = url.rstrip("/")
        self.name = name or parts.netloc
        self._token = token
        self._token_source = token_source
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._health_timeout = httpx.Timeout(health_timeout)
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient()
        self.max_response_bytes = max_response_bytes
        # A folded state nests the flow's own payloads a few levels deep.
        self._limits = PayloadLimits(
            max_bytes=max_response_bytes, max_depth=DEFAULT_LIMITS.max_depth + 8
        )
        self._leases: dict[str, WorkerLease] = {}

    # ---------------------------------------------------------------- WorkerRuntime

    async def allocate(self, package: ExecutionPackage) -> WorkerLease:
        lease = WorkerLease(uuid.uuid4().hex, package.execution_id, 0, self.name)
        self._leases[lease.lease_id] = lease
        return lease

    async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
        eid = package.execution_id
        body = package.to_json().encode()
        headers = {"content-type": "application/json", "accept": "application/json"}
        headers.update(await self._auth_header(eid))
        try:
            async with self._client.stream(
                "POST",
                self.url + EXECUTE_PATH,
                content=body,
                headers=headers,
                timeout=self._timeout,
            ) as response:
                status = response.status_code
                data = await self._read(response, eid)
        except httpx.TimeoutException as exc:
            raise RemoteWorkerError(
                f"worker {self.url} did not answer for {eid!r} in time ({type(exc).__name__})",
                execution_id=eid,
                unreachable=True,
            ) from exc
        except httpx.HTTPError as exc:
            raise RemoteWorkerError(
                f"the attempt on worker {self.url} for {eid!r} got no answer: {exc!r}",
                execution_id=eid,
                unreachable=True,
            ) from exc
        return self._outcome(package, status, data)

    async def release(self, lease: WorkerLease) -> None:
        self._leases.pop(lease.lease_id, None)

    async def health(self) -> Health:
        """Asks the worker's ``/readyz`` (the worker is up and its store answers)."""
        detail: dict[str, Any] = {"worker": self.name, "url": self.url}
        try:
            headers = await self._auth_header()
            response = await self._client.get(
                self.url + READY_PATH, headers=headers, timeout=self._health_timeout
            )
        except Exception as exc:
            detail["error"] = repr(exc)
            return Health(False, len(self._leases), detail)
        detail["status"] = response.status_code
        try:
            detail["ready"] = response.json()
        except ValueError:
            pass
        return Health(response.status_code == 200, len(self._leases), detail)

    # ---------------------------------------------------------------- extras

    async def in_flight(self) -> set[str]:
        """The execution ids with an attempt running on the worker right now.

        Raises :class:`RemoteWorkerError` (``unreachable`` when no answer came at all).
        """
        try:
            headers = await self._auth_header()
            response = await self._client.get(
                self.url + INFLIGHT_PATH, headers=headers, timeout=self._health_timeout
            )
        except httpx.HTTPError as exc:
            raise RemoteWorkerError(
                f"worker {self.url} did not answer: {exc!r}", unreachable=True
            ) from exc
        if response.status_code != 200:
            raise RemoteWorkerError(
                f"worker {self.url} answered {response.status_code} to {INFLIGHT_PATH}",
                status=response.status_code,
            )
        try:
            ids = response.json()["execution_ids"]
        except (ValueError, KeyError, TypeError) as exc:
            raise WireFormatError(f"worker {self.url} sent an unreadable in-flight list") from exc
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise WireFormatError(f"worker {self.url} sent an unreadable in-flight list")
        return set(ids)

    async def close(self) -> None:
        """Close the HTTP client if this runtime created it."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> RemoteWorkerRuntime:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<RemoteWorkerRuntime {self.url}>"

    # ---------------------------------------------------------------- internals

    async def _auth_header(self, execution_id: str | None = None) -> dict[str, str]:
        """The Authorization header; a token source that fails is a typed failed attempt
        (nothing is sent without credentials), naming the execution it was for."""
        token = self._token
        if self._token_source is not None:
            try:
                produced = self._token_source()
                token = await produced if inspect.isawaitable(produced) else produced
            except Exception as exc:
                for_what = f" for {execution_id!r}" if execution_id else ""
                raise RemoteWorkerError(
                    f"the token source for worker {self.url} failed{for_what}: {exc!r}; "
                    "nothing was sent",
                    execution_id=execution_id,
                    hint="Check the dispatcher's credentials (the token source); the "
                    "execution is unchanged and a redispatch retries it",
                ) from exc
        return {"authorization": f"Bearer {token}"} if token else {}

    async def _read(self, response: httpx.Response, eid: str) -> bytes:
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_response_bytes:
            raise self._too_large(eid)
        buffer = bytearray()
        async for chunk in response.aiter_bytes():
            buffer += chunk
            if len(buffer) > self.max_response_bytes:
                raise self._too_large(eid)
        return bytes(buffer)

    def _too_large(self, eid: str) -> WireFormatError:
        return WireFormatError(
            f"worker {self.url} answered over {self.max_response_bytes} bytes for {eid!r}",
            execution_id=eid,
            hint="Raise max_response_bytes, or keep large values out of the flow's state",
        )

    def _outcome(self, package: ExecutionPackage, status: int, data: bytes) -> ExecutionResult:
        eid = package.execution_id
        if status == 200:
            try:
                result = ExecutionResult.from_dict(decode_json(data, limits=self._limits))
            except PayloadError as exc:
                raise WireFormatError(
                    f"worker {self.url} answered an unreadable result for {eid!r}: {exc.message}",
                    execution_id=eid,
                ) from exc
            if result.execution_id != eid:
                raise WireFormatError(
                    f"worker {self.url} answered a result for {result.execution_id!r} to a "
                    f"package for {eid!r}",
                    execution_id=eid,
                )
            return result
        body = _json_object(data)
        if (
            status == 409
            and body is not None
            and body.get("code") == SUPERSEDED_CODE
            and body.get("execution_id") == eid
        ):
            raise ExecutionSupersededError(
                f"worker {self.url} refused {eid!r}: another holder owns the execution",
                execution_id=eid,
            )
        typed = _typed(body)
        if 400 <= status < 500 and status not in _ATTEMPT_FAILURES and typed is not None:
            raise typed
        summary = None
        if body is not None:
            summary = {k: body.get(k) for k in ("error", "code", "execution_id")}
        message = f"worker {self.url} answered {status} for {eid!r}"
        if summary is not None and summary.get("error"):
            message = f"{message}: {summary['error']}"
        hint = None
        if status in (401, 403):
            hint = "Check the dispatcher's token (or ID-token audience) against the worker's"
        err = RemoteWorkerError(message, execution_id=eid, hint=hint, status=status, remote=summary)
        if typed is not None:
            raise err from typed
        raise err


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _typed(body: dict[str, Any] | None) -> LoomError | None:
    """The worker's typed error, unless it is unknown or a refusal type (see the class doc)."""
    detail = body.get("detail") if body is not None else None
    if not isinstance(detail, dict):
        return None
    if detail.get("type") in REFUSAL_TYPES:
        return None
    try:
        err = error_from_dict(detail)
    except Exception:
        return None
    # An unknown type comes back as a bare LoomError: too vague to raise as "the" outcome.
    return None if type(err) is LoomError else err
