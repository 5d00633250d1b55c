"""The dispatcher's side (loom.placement.http._remote): RemoteWorkerRuntime splits outcomes,
failed attempts and refusals; a lost response or a blackholed worker is redispatched and
reruns nothing."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import loom
from loom.errors import (
    DispatchError,
    ExecutionSupersededError,
    FlowNotFoundError,
    InvalidInputError,
    WireFormatError,
)
from loom.model import EventType, ExecutionStatus
from loom.placement import LocalDispatcher, is_superseded_refusal
from loom.placement.http import FailoverWorkerRuntime, RemoteWorkerError, RemoteWorkerRuntime
from tests.support.http_rig import BASE, SECRET, Rig, pkg

# ------------------------------------------------------------------------------ remote runtime


def _respond(status: int, body: Any) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, bytes):
            return httpx.Response(status, content=body)
        return httpx.Response(status, json=body)

    return handler


def _detail(type_: str, code: str, eid: str | None = "m-1") -> dict[str, Any]:
    return {
        "error": "x",
        "code": code,
        "execution_id": eid,
        "detail": {"type": type_, "code": code, "message": "x", "execution_id": eid},
    }


_SUPERSEDED = {"error": "execution superseded", "code": "superseded", "execution_id": "m-1"}


@pytest.mark.parametrize(
    ("status", "body", "expected", "refusal"),
    [
        (409, _SUPERSEDED, ExecutionSupersededError, True),
        (409, {**_SUPERSEDED, "execution_id": "other"}, RemoteWorkerError, False),
        (409, {**_SUPERSEDED, "code": "not_waiting"}, RemoteWorkerError, False),
        (409, {**_SUPERSEDED, "execution_id": None}, RemoteWorkerError, False),
        (409, {"code": "superseded"}, RemoteWorkerError, False),
        (409, b"superseded", RemoteWorkerError, False),
        (409, _detail("NotWaitingError", "not_waiting"), RemoteWorkerError, False),
        (500, _SUPERSEDED, RemoteWorkerError, False),
        (500, _detail("StaleFenceError", "stale_fence"), RemoteWorkerError, False),
        (400, _detail("ExecutionAlreadyExistsError", "execution_exists"), RemoteWorkerError, False),
        (422, _detail("ExecutionSupersededError", "superseded"), RemoteWorkerError, False),
        (404, _detail("FlowNotFoundError", "flow_not_found"), FlowNotFoundError, False),
        (422, _detail("InvalidInputError", "invalid_input"), InvalidInputError, False),
        (400, _detail("WireFormatError", "wire_format"), WireFormatError, False),
        (503, _detail("StorageError", "storage"), RemoteWorkerError, False),
        (401, _detail("AuthenticationError", "unauthenticated"), RemoteWorkerError, False),
        (502, b"<html>bad gateway</html>", RemoteWorkerError, False),
        (200, b"<html>", WireFormatError, False),
        (200, {"wire_version": 3}, WireFormatError, False),
        (
            200,
            {
                "wire_version": 1,
                "execution_id": "other",
                "status": "completed",
                "last_sequence": 3,
                "state": {},
            },
            WireFormatError,
            False,
        ),
        (200, b"x" * 5000, WireFormatError, False),  # over max_response_bytes
    ],
)
async def test_remote_runtime_splits_outcomes_failures_and_refusals(
    status: int, body: Any, expected: type[BaseException], refusal: bool
) -> None:
    transport = httpx.MockTransport(_respond(status, body))
    async with httpx.AsyncClient(transport=transport) as client:
        remote = RemoteWorkerRuntime(BASE, client=client, max_response_bytes=4096)
        package = pkg("m-1")
        with pytest.raises(expected) as info:
            await remote.execute(await remote.allocate(package), package)
    assert type(info.value) is expected
    assert is_superseded_refusal(info.value, "m-1") is refusal
    if expected is RemoteWorkerError:
        assert isinstance(info.value, DispatchError)
        assert info.value.status == status  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadError("connection reset"),
    ],
)
async def test_transport_failures_are_failed_attempts(exc: Exception) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        remote = RemoteWorkerRuntime(BASE, client=client)
        with pytest.raises(RemoteWorkerError) as info:
            await remote.execute(await remote.allocate(pkg()), pkg())
    assert info.value.unreachable and info.value.status is None
    assert info.value.__cause__ is exc
    assert not is_superseded_refusal(info.value, "e-1")


async def test_a_refused_connection_over_a_real_socket_is_a_failed_attempt() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        async with RemoteWorkerRuntime(f"http://127.0.0.1:{port}", token=SECRET) as remote:
            lease = await remote.allocate(pkg())
            assert lease.fence == 0  # the remote worker fences on its own side
            with pytest.raises(RemoteWorkerError) as info:
                await remote.execute(lease, pkg())
            assert info.value.unreachable
            health = await remote.health()
            assert not health.healthy and "error" in health.detail


async def test_remote_runtime_sends_its_token_and_asks_the_source_each_time() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"status": "ready"})

    tokens = iter(["t1", "t2"])

    async def source() -> str:
        return next(tokens)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        assert (await RemoteWorkerRuntime(BASE, token="fixed", client=client).health()).healthy
        remote = RemoteWorkerRuntime(BASE, token_source=source, client=client)
        await remote.health()
        await remote.health()
    assert seen == ["Bearer fixed", "Bearer t1", "Bearer t2"]
    with pytest.raises(loom.errors.ConfigurationError):
        RemoteWorkerRuntime("ftp://x")
    with pytest.raises(loom.errors.ConfigurationError):
        RemoteWorkerRuntime(BASE, token="a", token_source=source)


class LoseFirstResponse(httpx.AsyncBaseTransport):
    """Delivers each request, but drops the first /execute response after the worker committed
    it: the caller sees a reset connection (scenario 7, a response lost after commit)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.lost = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path == "/execute" and self.lost == 0:
            await response.aread()
            self.lost += 1
            raise httpx.ReadError("connection reset by peer", request=request)
        return response


async def test_a_response_lost_after_commit_is_redispatched_and_reruns_nothing(rig: Rig) -> None:
    transport = LoseFirstResponse(httpx.ASGITransport(app=rig.app))
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
        dispatcher = LocalDispatcher(
            RemoteWorkerRuntime(BASE, token=SECRET, client=client), max_attempts=2
        )
        result = await dispatcher.dispatch(pkg("lost-1"))
    assert transport.lost == 1 and dispatcher.attempts == 2
    assert result.status is ExecutionStatus.COMPLETED and result.output == 4
    assert rig.effects == {"one": 1, "two": 1, "three": 1}  # the retry only reported
    types = [e.type for e in await rig.store.read("lost-1")]
    assert types.count(EventType.EXECUTION_STARTED) == 1
    assert EventType.EXECUTION_RECOVERED not in types


async def test_a_blackholed_worker_times_out_and_the_retry_goes_elsewhere(rig: Rig) -> None:
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(16)  # the kernel accepts connections; nobody ever answers
        url = f"http://127.0.0.1:{blackhole.getsockname()[1]}"
        async with RemoteWorkerRuntime(url, token=SECRET, timeout=None) as silent:
            failover = FailoverWorkerRuntime([silent, rig.remote()])
            dispatcher = LocalDispatcher(failover, max_attempts=2, execute_timeout=0.5)
            result = await dispatcher.dispatch(pkg("bh-1"))
    assert result.status is ExecutionStatus.COMPLETED and dispatcher.attempts == 2
    assert rig.effects == {"one": 1, "two": 1, "three": 1}
