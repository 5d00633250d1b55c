"""CloudRunWorkerRuntime (loom.placement.http._cloudrun): ID tokens minted, cached, refreshed."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from loom.model import ExecutionStatus
from loom.placement import LocalDispatcher
from loom.placement.http import CloudRunWorkerRuntime, GoogleIdTokenAuth, create_worker_app
from tests.support.http_keys import AUDIENCE, DISPATCHER_EMAIL, kit
from tests.support.http_rig import Rig, pkg

# ------------------------------------------------------------------------------ Cloud Run


async def test_cloud_run_runtime_mints_caches_and_refreshes_id_tokens(rig: Rig) -> None:
    now = [1_000_000.0]
    minted: list[str] = []

    def mint(audience: str) -> str:
        assert audience == AUDIENCE  # defaults to the service URL
        token = kit().mint(audience=audience, issued_at=now[0], lifetime=3600)
        minted.append(token)
        return token

    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(200, json={"status": "ready"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        cloud = CloudRunWorkerRuntime(
            AUDIENCE + "/", token_source=mint, client=client, clock=lambda: now[0]
        )
        assert cloud.audience == AUDIENCE
        await cloud.health()
        await cloud.health()
        assert len(minted) == 1  # cached
        now[0] += 3600 - 301  # just outside the refresh margin: still the cached token
        await cloud.health()
        assert len(minted) == 1
        now[0] += 2  # inside the margin (300 s before expiry): mint the next one
        await cloud.health()
        assert len(minted) == 2
        assert seen == [f"Bearer {minted[0]}"] * 3 + [f"Bearer {minted[1]}"]


async def test_cloud_run_runtime_mints_with_google_auth_in_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    import google.auth.transport.requests
    import google.oauth2.id_token

    calls: list[tuple[Any, str, bool]] = []

    def fake_fetch(request: Any, audience: str) -> str:
        calls.append((request, audience, threading.current_thread() is threading.main_thread()))
        return kit().mint(audience=audience)

    monkeypatch.setattr(google.oauth2.id_token, "fetch_id_token", fake_fetch)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"status": "ready"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        cloud = CloudRunWorkerRuntime(AUDIENCE, client=client)
        assert (await cloud.health()).healthy
    [(request, audience, on_main_thread)] = calls
    assert isinstance(request, google.auth.transport.requests.Request)
    assert audience == AUDIENCE and not on_main_thread  # blocking HTTP stays off the loop


async def test_cloud_run_runtime_end_to_end_with_id_tokens(rig: Rig) -> None:
    auth = GoogleIdTokenAuth(AUDIENCE, certs=kit().certs(), allowed_emails=[DISPATCHER_EMAIL])
    app = create_worker_app(rig.runtime, auth=auth)
    tokens = [kit().mint(audience="https://wrong-audience"), kit().mint()]

    async def source(audience: str) -> str:
        return tokens.pop(0)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=AUDIENCE) as c:
        cloud = CloudRunWorkerRuntime(AUDIENCE, token_source=source, client=c)
        dispatcher = LocalDispatcher(cloud, max_attempts=2)
        # The first token is refused (401: a failed attempt); the 401 drops the cached token,
        # so the retry mints a fresh one and succeeds.
        result = await dispatcher.dispatch(pkg("c-1"))
    assert result.status is ExecutionStatus.COMPLETED and dispatcher.attempts == 2
    assert cloud.tokens.mints == 2 and tokens == []
