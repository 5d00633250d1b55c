"""Worker authentication (loom.placement.http._auth): bearer secrets, Google ID tokens,
AnyOfAuth; a refused credential runs nothing."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import loom
from loom.placement.http import (
    GOOGLE_CERTS_URL,
    AnyOfAuth,
    AuthenticationError,
    BearerTokenAuth,
    GoogleCerts,
    GoogleIdTokenAuth,
    NoAuth,
    create_worker_app,
)
from tests.support.http_keys import AUDIENCE, DISPATCHER_EMAIL, kit
from tests.support.http_rig import BASE, SECRET, Rig, pkg

# ------------------------------------------------------------------------------ auth


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "Bearer ",
        f"Bearer {SECRET}x",
        f"Bearer {SECRET[:-1]}",
        "Bearer " + "a" * 20_000,
        f"Token {SECRET}",
    ],
    ids=[
        "none",
        "empty",
        "basic",
        "no-token",
        "blank-token",
        "longer",
        "shorter",
        "huge",
        "other-scheme",
    ],
)
async def test_bearer_auth_refuses_and_runs_nothing(rig: Rig, header: str | None) -> None:
    headers = {"content-type": "application/json"}
    if header is not None:
        headers["authorization"] = header
    response = await rig.client.post("/execute", content=pkg().to_json(), headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["code"] == "unauthenticated"
    await rig.assert_nothing_stored()
    assert rig.effects == {} and rig.errors == []
    inflight = await rig.client.get("/inflight", headers=headers)
    assert inflight.status_code == 401


async def test_bearer_auth_accepts_any_rotated_secret(rig: Rig) -> None:
    auth = BearerTokenAuth([SECRET, "the-next-secret-after-rotation"])
    assert (await auth.authenticate(f"Bearer {SECRET}")).scheme == "bearer"
    assert (await auth.authenticate("bearer the-next-secret-after-rotation")).subject == "bearer"
    with pytest.raises(AuthenticationError):
        await auth.authenticate("Bearer the-old-secret-that-was-dropped")
    with pytest.raises(loom.errors.ConfigurationError):
        BearerTokenAuth("short")
    with pytest.raises(loom.errors.ConfigurationError):
        BearerTokenAuth([])


def _google_cases() -> list[Any]:
    k = kit()
    other = kit("other-key")
    forged = other.mint(kid=k.kid)  # right key id, signed by another key
    header = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT","kid":"loom-test-key"}')
    payload = base64.urlsafe_b64encode(json.dumps({"aud": AUDIENCE, "exp": 2**40}).encode())
    unsigned = f"{header.decode().rstrip('=')}.{payload.decode().rstrip('=')}."
    return [
        pytest.param(k.mint(lifetime=-3600, issued_at=None), id="expired"),
        pytest.param(k.mint(audience="https://another-service.a.run.app"), id="wrong-audience"),
        pytest.param(forged, id="wrong-signer"),
        pytest.param(other.mint(), id="unknown-key-id"),
        pytest.param(k.mint(issuer="https://evil.example.com"), id="wrong-issuer"),
        pytest.param(k.mint(email="intruder@example.com"), id="email-not-allowed"),
        pytest.param(k.mint(email_verified=False), id="email-unverified"),
        pytest.param(k.mint(issued_at=10**10), id="issued-in-the-future"),
        pytest.param(unsigned, id="alg-none"),
        pytest.param("not.a.jwt", id="garbage"),
        pytest.param("a" * 100, id="no-dots"),
    ]


@pytest.fixture
async def google_rig(rig: Rig) -> AsyncIterator[Rig]:
    auth = GoogleIdTokenAuth(AUDIENCE, certs=kit().certs(), allowed_emails=[DISPATCHER_EMAIL])
    app = create_worker_app(rig.runtime, auth=auth, on_error=lambda p, e: rig.errors.append((p, e)))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)
    yield Rig(
        rig.runtime, app, client, rig.effects, rig.gate, rig.later_gate, rig.errors, rig.superseded
    )
    await client.aclose()


@pytest.mark.parametrize("token", _google_cases())
async def test_google_id_token_auth_refuses_and_runs_nothing(google_rig: Rig, token: str) -> None:
    response = await google_rig.post(pkg().to_dict(), token=token)
    assert response.status_code == 401, response.text
    assert response.json()["code"] == "unauthenticated"
    await google_rig.assert_nothing_stored()
    assert google_rig.effects == {} and google_rig.errors == []


async def test_google_id_token_auth_accepts_a_valid_token_and_replay_reruns_nothing(
    google_rig: Rig,
) -> None:
    token = kit().mint()
    first = await google_rig.post(pkg().to_dict(), token=token)
    assert first.status_code == 200, first.text
    # The same request replayed with the same (still valid) token re-runs nothing.
    replay = await google_rig.post(pkg().to_dict(), token=token)
    assert replay.status_code == 200 and replay.json() == first.json()
    assert google_rig.effects == {"one": 1, "two": 1, "three": 1}


async def test_google_auth_backend_failure_is_503_and_runs_nothing(rig: Rig) -> None:
    async def unreachable_certs() -> dict[str, str]:
        raise httpx.ConnectError("googleapis unreachable")

    app = create_worker_app(rig.runtime, auth=GoogleIdTokenAuth(AUDIENCE, certs=unreachable_certs))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        response = await c.post(
            "/execute",
            content=pkg().to_json(),
            headers={"authorization": f"Bearer {kit().mint()}"},
        )
    assert response.status_code == 503
    await rig.assert_nothing_stored()


async def test_google_auth_with_a_custom_verifier_still_checks_claims() -> None:
    claims = {"iss": "accounts.google.com", "aud": AUDIENCE, "email": DISPATCHER_EMAIL}
    auth = GoogleIdTokenAuth(AUDIENCE, verifier=lambda token: claims)
    assert (await auth.authenticate("Bearer whatever")).subject == DISPATCHER_EMAIL
    strict = GoogleIdTokenAuth("https://elsewhere", verifier=lambda token: claims)
    with pytest.raises(AuthenticationError):
        await strict.authenticate("Bearer whatever")

    def broken(token: str) -> dict[str, Any]:
        raise ValueError("signature")

    with pytest.raises(AuthenticationError):
        await GoogleIdTokenAuth(AUDIENCE, verifier=broken).authenticate("Bearer x")


async def test_google_certs_are_cached_per_cache_control_and_refetched_sparingly() -> None:
    fetches: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        fetches.append(str(request.url))
        return httpx.Response(
            200, json=kit().certs(), headers={"cache-control": "public, max-age=600"}
        )

    now = [0.0]
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        certs = GoogleCerts(client=client, clock=lambda: now[0], min_refresh=60)
        auth = GoogleIdTokenAuth(AUDIENCE, certs=certs)
        assert (await auth.authenticate(f"Bearer {kit().mint()}")).subject == DISPATCHER_EMAIL
        await auth.authenticate(f"Bearer {kit().mint()}")
        assert fetches == [GOOGLE_CERTS_URL]  # cached
        # A token with an unknown key id forces one refetch, but not more than once a minute.
        for _ in range(3):
            with pytest.raises(AuthenticationError):
                await auth.authenticate(f"Bearer {kit('rotated-key').mint()}")
        assert len(fetches) == 1  # fetched under a minute ago: no refetch yet
        now[0] += 61
        with pytest.raises(AuthenticationError):
            await auth.authenticate(f"Bearer {kit('rotated-key').mint()}")
        assert len(fetches) == 2
        now[0] += 600  # past max-age: stale, fetched again
        await auth.authenticate(f"Bearer {kit().mint()}")
        assert len(fetches) == 3


async def test_any_of_auth_takes_either_credential(rig: Rig) -> None:
    auth = AnyOfAuth(BearerTokenAuth(SECRET), GoogleIdTokenAuth(AUDIENCE, certs=kit().certs()))
    assert (await auth.authenticate(f"Bearer {SECRET}")).scheme == "bearer"
    assert (await auth.authenticate(f"Bearer {kit().mint()}")).scheme == "google-id-token"
    with pytest.raises(AuthenticationError):
        await auth.authenticate("Bearer neither-of-them-at-all")


async def test_auth_is_required_explicitly(rig: Rig) -> None:
    with pytest.raises(TypeError):
        create_worker_app(rig.runtime)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        create_worker_app(rig.runtime, auth=None)  # type: ignore[arg-type]
    open_app = create_worker_app(rig.runtime, auth=NoAuth())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=open_app), base_url=BASE) as c:
        response = await c.post("/execute", content=pkg().to_json())
    assert response.status_code == 200
