"""The HTTP worker and its clients, in process (httpx.ASGITransport) and over real sockets.

Every refused request is checked for its typed body AND for an untouched store: refused
before the attempt takes its fence, nothing is written at all.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import loom
from loom.errors import (
    DispatchError,
    ExecutionSupersededError,
    FlowNotFoundError,
    InvalidInputError,
    ResumeValidationError,
    StaleFenceError,
    StorageWriteError,
    WireFormatError,
)
from loom.model import EventType, ExecutionStatus
from loom.placement import (
    ExecutionPackage,
    ExecutionResult,
    Health,
    LocalDispatcher,
    LocalWorkerRuntime,
    ResumeEvent,
    WorkerLease,
    is_superseded_refusal,
)
from loom.placement.http import (
    GOOGLE_CERTS_URL,
    AnyOfAuth,
    AuthenticationError,
    BearerTokenAuth,
    CloudRunWorkerRuntime,
    FailoverWorkerRuntime,
    GoogleCerts,
    GoogleIdTokenAuth,
    NoAuth,
    RemoteWorkerError,
    RemoteWorkerRuntime,
    create_worker_app,
    no_live_holder,
)
from loom.storage import InMemoryStore, SQLiteStore, Store
from tests.support.http_keys import AUDIENCE, DISPATCHER_EMAIL, kit

SECRET = "s3cret-token-for-the-worker-tests"
BASE = "http://worker.test"


class Decision(pydantic.BaseModel):
    approved: bool


class Effects(dict[str, int]):
    """Effect counts by step id, with a way to wait (event-driven) until one is reached."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Condition()

    async def bump(self, name: str) -> None:
        async with self.changed:
            self[name] = self.get(name, 0) + 1
            self.changed.notify_all()

    async def reach(self, name: str, count: int, timeout: float = 10.0) -> None:
        async with self.changed:
            await asyncio.wait_for(
                self.changed.wait_for(lambda: self.get(name, 0) >= count), timeout
            )


@dataclass
class Rig:
    """A runtime with counted effects behind an ASGI worker app, and a client for it."""

    runtime: loom.WorkflowRuntime
    app: Any
    client: httpx.AsyncClient
    effects: Effects
    gate: asyncio.Event
    later_gate: asyncio.Event
    errors: list[tuple[ExecutionPackage | None, BaseException]] = field(default_factory=list)
    superseded: list[tuple[ExecutionPackage, BaseException]] = field(default_factory=list)

    @property
    def store(self) -> Store:
        return self.runtime.store

    def remote(self, **kw: Any) -> RemoteWorkerRuntime:
        kw.setdefault("token", SECRET)
        return RemoteWorkerRuntime(BASE, client=self.client, **kw)

    async def post(self, body: Any, *, token: str | None = SECRET, **kw: Any) -> httpx.Response:
        headers = kw.pop("headers", {})
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        if not isinstance(body, (bytes, str)) and body is not None and "content" not in kw:
            kw["content"] = json.dumps(body)
            headers.setdefault("content-type", "application/json")
        elif body is not None:
            kw["content"] = body
        return await self.client.post("/execute", headers=headers, **kw)

    async def assert_nothing_stored(self, execution_id: str = "e-1") -> None:
        ids = [eid async for eid in self.store.iterate_execution_ids()]
        assert ids == [], f"a refused request wrote events: {ids}"
        # Not even a fence: refused before the attempt's allocate() took one.
        assert await self.store.current_fence(execution_id) == 0


def _flows(
    effects: Effects, gate: asyncio.Event, later_gate: asyncio.Event | None = None
) -> list[loom.Flow[Any, Any]]:
    """The flows of these tests. ``gated-step`` waits for ``gate`` (its second and later runs
    for ``later_gate`` when given, so a test can release two racing attempts one by one)."""

    def counted(name: str) -> loom.Step[[int], int]:
        @loom.step(id=name)
        async def effect(n: int) -> int:
            await effects.bump(name)
            if name == "gated-step":
                later = later_gate is not None and effects[name] > 1
                await (later_gate if later and later_gate is not None else gate).wait()
            return n + 1

        return effect

    one, two, three, slow = counted("one"), counted("two"), counted("three"), counted("gated-step")

    @loom.flow(id="three", version="1")
    async def three_steps(ctx: loom.WorkflowContext, n: int) -> int:
        return await ctx.run(three, await ctx.run(two, await ctx.run(one, n)))

    @loom.flow(id="slow", version="1")
    async def slow_flow(ctx: loom.WorkflowContext, n: int) -> int:
        return await ctx.run(two, await ctx.run(slow, await ctx.run(one, n)))

    @loom.flow(id="fails", version="1")
    async def fails(ctx: loom.WorkflowContext, n: int) -> int:
        await ctx.run(one, n)
        raise RuntimeError("flow-level failure")

    @loom.flow(id="approve", version="1", resume_schemas={"Go": Decision})
    async def approve(ctx: loom.WorkflowContext, n: int) -> int:
        n = await ctx.run(one, n)
        decision = await ctx.suspend("Go")
        return await ctx.run(two, n) if decision.approved else -1

    return [three_steps, slow_flow, fails, approve]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    effects = Effects()
    gate, later_gate = asyncio.Event(), asyncio.Event()
    runtime = loom.WorkflowRuntime(SQLiteStore(tmp_path / "worker.db"))
    runtime.register(*_flows(effects, gate, later_gate))
    errors: list[tuple[ExecutionPackage | None, BaseException]] = []
    superseded: list[tuple[ExecutionPackage, BaseException]] = []
    app = create_worker_app(
        runtime,
        auth=BearerTokenAuth(SECRET),
        max_body_bytes=4096,
        on_error=lambda p, e: errors.append((p, e)),
        on_superseded=lambda p, e: superseded.append((p, e)),
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)
    yield Rig(runtime, app, client, effects, gate, later_gate, errors, superseded)
    gate.set()
    later_gate.set()
    await client.aclose()
    await runtime.close()


def pkg(eid: str = "e-1", flow: str = "three", n: Any = 1, **kw: Any) -> ExecutionPackage:
    return ExecutionPackage(execution_id=eid, flow_id=flow, input=n, **kw)


# ------------------------------------------------------------------------------ outcomes


async def test_execute_runs_a_package_and_a_redispatch_reruns_nothing(rig: Rig) -> None:
    response = await rig.post(pkg().to_dict())
    assert response.status_code == 200, response.text
    result = ExecutionResult.from_json(response.content)
    assert result.status is ExecutionStatus.COMPLETED and result.output == 4
    assert rig.effects == {"one": 1, "two": 1, "three": 1}
    events = await rig.store.read("e-1")
    # Lost-response redispatch: the same package again returns the same result, runs nothing.
    again = await rig.remote().execute(await rig.remote().allocate(pkg()), pkg())
    assert again == result
    assert rig.effects == {"one": 1, "two": 1, "three": 1}
    assert await rig.store.read("e-1") == events
    assert rig.errors == [] and rig.superseded == []


async def test_a_flow_failure_is_an_outcome_never_retried(rig: Rig) -> None:
    dispatcher = LocalDispatcher(rig.remote(), max_attempts=3)
    result = await dispatcher.dispatch(pkg("f-1", "fails"))
    assert result.status is ExecutionStatus.FAILED
    assert result.error is not None and "flow-level failure" in result.error["message"]
    assert dispatcher.attempts == 1 and rig.effects == {"one": 1}


async def test_suspend_then_resume_by_a_fresh_dispatch(rig: Rig) -> None:
    dispatcher = LocalDispatcher(rig.remote())
    suspended = await dispatcher.dispatch(pkg("g-1", "approve", 10))
    assert suspended.status is ExecutionStatus.SUSPENDED
    before = await rig.store.read("g-1")
    # A wrongly shaped decision is refused with its type across the wire; nothing appended.
    with pytest.raises(ResumeValidationError):
        await dispatcher.dispatch(
            pkg("g-1", "approve", 10, resume_event=ResumeEvent("Go", {"approved": "maybe"}))
        )
    assert await rig.store.read("g-1") == before
    done = await dispatcher.dispatch(
        pkg("g-1", "approve", 10, resume_event=ResumeEvent("Go", {"approved": True}))
    )
    assert done.status is ExecutionStatus.COMPLETED and done.output == 12
    assert [type(e) for _, e in rig.errors] == [ResumeValidationError]


# ------------------------------------------------------------------------------ refusals


def _bad_requests() -> list[Any]:
    good = pkg().to_dict()
    return [
        pytest.param(b"{not json", {}, 400, "wire_format", id="malformed-json"),
        pytest.param(b"\xff\xfe\x00", {}, 400, "wire_format", id="invalid-utf8"),
        pytest.param(b'{"a": NaN}', {}, 400, "wire_format", id="nan"),
        pytest.param(b"[1, 2]", {}, 400, "wire_format", id="not-an-object"),
        pytest.param(b"[" * 200 + b"]" * 200, {}, 400, "wire_format", id="deeply-nested"),
        pytest.param(
            json.dumps({**good, "wire_version": 3}), {}, 400, "wire_format", id="wire-version-3"
        ),
        pytest.param(
            json.dumps({**good, "wire_version": None}), {}, 400, "wire_format", id="no-version"
        ),
        pytest.param(
            json.dumps({**good, "execution_id": ""}), {}, 400, "wire_format", id="empty-id"
        ),
        pytest.param(
            json.dumps({**good, "execution_id": "x" * 300}), {}, 400, "wire_format", id="long-id"
        ),
        pytest.param(
            json.dumps({**good, "execution_id": 7}), {}, 400, "wire_format", id="id-not-a-string"
        ),
        pytest.param(
            json.dumps({**good, "flow_id": "no-such-flow"}),
            {},
            404,
            "flow_not_found",
            id="unknown-flow",
        ),
        pytest.param(
            json.dumps({**good, "flow_version": "9"}), {}, 404, "flow_not_found", id="unknown-ver"
        ),
        pytest.param(
            json.dumps({**good, "input": "x" * 5000}),
            {},
            413,
            "payload",
            id="oversized-by-content-length",
        ),
        pytest.param(
            None,
            {"chunks": [b'{"wire_version": 1, "input": "', b"x" * 3000, b"y" * 3000, b'"}']},
            413,
            "payload",
            id="oversized-streamed-chunked",
        ),
        pytest.param(
            json.dumps(good),
            {"headers": {"content-type": "text/plain"}},
            415,
            "wire_format",
            id="not-json-media-type",
        ),
        pytest.param(
            json.dumps({**good, "input": "not-an-int"}),
            {},
            422,
            "invalid_input",
            id="invalid-input",
        ),
        pytest.param(
            json.dumps(
                {**good, "intent": "resume", "resume_event": {"event_type": "Go", "payload": {}}}
            ),
            {},
            404,
            "execution_not_found",
            id="resume-unknown-execution",
        ),
    ]


@pytest.mark.parametrize(("body", "extra", "status", "code"), _bad_requests())
async def test_bad_requests_get_typed_4xx_and_store_nothing(
    rig: Rig, body: Any, extra: dict[str, Any], status: int, code: str
) -> None:
    kw: dict[str, Any] = {}
    if "chunks" in extra:
        chunks = extra["chunks"]

        async def stream() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        kw["content"] = stream()  # no Content-Length: only the streamed size can tell
        kw["headers"] = {"content-type": "application/json"}
    if "headers" in extra:
        kw["headers"] = extra["headers"]
    response = await rig.post(body, **kw)
    assert response.status_code == status, response.text
    data = response.json()
    assert data["code"] == code
    assert data["detail"]["code"] == code and data["detail"]["type"]
    assert isinstance(data["error"], str) and data["error"]
    await rig.assert_nothing_stored()
    assert rig.effects == {}
    assert len(rig.errors) == 1 and rig.superseded == []


async def test_a_lying_content_length_is_caught_by_the_streamed_size(rig: Rig) -> None:
    async def stream() -> AsyncIterator[bytes]:
        yield b'{"wire_version": 1, "pad": "' + b"x" * 5000 + b'"}'

    response = await rig.post(
        None,
        content=stream(),
        headers={"content-type": "application/json", "content-length": "10"},
    )
    assert response.status_code == 413
    await rig.assert_nothing_stored()


async def test_typed_refusals_are_rebuilt_by_the_remote_runtime(rig: Rig) -> None:
    remote = rig.remote()
    lease = await remote.allocate(pkg())
    with pytest.raises(FlowNotFoundError):
        await remote.execute(lease, pkg(flow="no-such-flow"))
    with pytest.raises(InvalidInputError):
        await remote.execute(lease, pkg(n="not-an-int"))
    await rig.assert_nothing_stored()


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


# ------------------------------------------------------------------------------ superseded


async def test_two_attempts_racing_one_execution_the_loser_gets_the_exact_409(rig: Rig) -> None:
    package = pkg("race", "slow")
    first = asyncio.ensure_future(rig.post(package.to_dict()))
    await rig.effects.reach("gated-step", 1)
    # A duplicate dispatch takes a newer fence and resumes the execution itself.
    second = asyncio.ensure_future(LocalDispatcher(rig.remote(), max_attempts=3).dispatch(package))
    await rig.effects.reach("gated-step", 2)
    # The first attempt finishes its step first: its write is refused (the second holds the
    # newer fence) while the execution still runs, so it answers the superseded 409.
    rig.gate.set()
    lost = await first
    rig.later_gate.set()
    won = await second
    assert lost.status_code == 409
    assert lost.json() == {
        "error": "execution superseded",
        "code": "superseded",
        "execution_id": "race",
    }
    assert won.status is ExecutionStatus.COMPLETED and won.output == 4
    assert len(rig.superseded) == 1 and rig.superseded[0][0] == package
    assert is_superseded_refusal(rig.superseded[0][1], "race")
    assert rig.errors == []  # a superseded refusal never reaches on_error
    assert rig.effects == {"one": 1, "gated-step": 2, "two": 1}


class ScriptedWorker(LocalWorkerRuntime):
    """A LocalWorkerRuntime whose execute raises what the test says."""

    def __init__(self, runtime: loom.WorkflowRuntime, raises: list[BaseException]) -> None:
        super().__init__(runtime)
        self.raises = raises
        self.calls = 0

    async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
        self.calls += 1
        if self.raises:
            raise self.raises.pop(0)
        return await super().execute(lease, package)


def _wrapped_stale(eid: str) -> StorageWriteError:
    err = StorageWriteError("the batch was refused")
    err.__cause__ = StaleFenceError("stale", execution_id=eid)
    return err


@pytest.mark.parametrize(
    ("raised", "status", "refusal"),
    [
        (StaleFenceError("stale", execution_id="s-1"), 409, True),
        (ExecutionSupersededError("gone", execution_id="s-1"), 409, True),
        (loom.ExecutionAlreadyExistsError("lost the race", execution_id="s-1"), 409, True),
        (_wrapped_stale("s-1"), 409, True),
        # Another execution's refusal in a coalesced batch is, for this one, a genuine failure.
        (_wrapped_stale("someone-else"), 503, False),
        (StaleFenceError("stale", execution_id="someone-else"), 503, False),
        (RuntimeError("boom"), 500, False),
        (loom.NonDeterminismError("changed", execution_id="s-1"), 500, False),
    ],
    ids=["stale", "superseded", "exists", "wrapped", "other-wrapped", "other-stale", "bug", "nd"],
)
async def test_superseded_mapping_is_exact(
    rig: Rig, raised: BaseException, status: int, refusal: bool
) -> None:
    worker = ScriptedWorker(rig.runtime, [raised])
    errors: list[Any] = []
    superseded: list[Any] = []
    app = create_worker_app(
        worker,
        auth=BearerTokenAuth(SECRET),
        on_error=lambda p, e: errors.append(e),
        on_superseded=lambda p, e: superseded.append(e),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        remote = RemoteWorkerRuntime(BASE, token=SECRET, client=c)
        raw = await c.post(
            "/execute", content=pkg("s-1").to_json(), headers={"authorization": f"Bearer {SECRET}"}
        )
        assert raw.status_code == status
        if refusal:
            assert raw.json() == {
                "error": "execution superseded",
                "code": "superseded",
                "execution_id": "s-1",
            }
            assert superseded == [raised] and errors == []
        else:
            assert raw.json()["code"] != "superseded"
            assert errors == [raised] and superseded == []
            assert "boom" not in raw.text  # an unexpected error's message stays on the worker
        # Through a dispatcher: a refusal is rethrown at once, anything else retried.
        worker.raises = [raised]
        dispatcher = LocalDispatcher(remote, max_attempts=2)
        if refusal:
            with pytest.raises(ExecutionSupersededError) as info:
                await dispatcher.dispatch(pkg("s-1"))
            assert is_superseded_refusal(info.value, "s-1")
            assert dispatcher.attempts == 1
        else:
            result = await dispatcher.dispatch(pkg("s-1"))
            assert result.status is ExecutionStatus.COMPLETED
            assert dispatcher.attempts == 2


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


# ------------------------------------------------------------------------------ health, drain


async def test_health_and_readiness(rig: Rig) -> None:
    assert (await rig.client.get("/healthz")).json() == {"status": "alive"}
    ready = await rig.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    health = await rig.remote().health()
    assert health.healthy and health.detail["status"] == 200
    assert (await rig.client.get("/nowhere")).status_code == 404
    assert (await rig.client.get("/execute")).status_code == 405


async def test_readiness_fails_when_the_store_does_not_answer(tmp_path: Path) -> None:
    class DeadStore(InMemoryStore):
        async def last_sequence(self, execution_id: str) -> int:
            raise loom.errors.StorageError("connection refused")

    runtime = loom.WorkflowRuntime(DeadStore())
    app = create_worker_app(runtime, auth=NoAuth())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        assert (await c.get("/healthz")).status_code == 200  # alive, but not ready
        ready = await c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["code"] == "storage"
        assert not (await RemoteWorkerRuntime(BASE, client=c).health()).healthy
    await runtime.close()


async def test_drain_lets_in_flight_attempts_finish_and_refuses_new_work(rig: Rig) -> None:
    service = rig.app.state.loom_worker
    async with rig.app.router.lifespan_context(rig.app):
        in_flight = asyncio.ensure_future(rig.post(pkg("d-1", "slow").to_dict()))
        await rig.effects.reach("gated-step", 1)
        inflight = await rig.client.get("/inflight", headers={"authorization": f"Bearer {SECRET}"})
        assert inflight.json() == {"execution_ids": ["d-1"], "draining": False}
        service.begin_drain()  # what SIGTERM does under `loom worker serve`
        refused = await rig.post(pkg("d-2").to_dict())
        assert refused.status_code == 503
        assert (await rig.client.get("/readyz")).status_code == 503
        rig.gate.set()  # the in-flight step finishes within the drain bound
    response = await in_flight
    assert response.status_code == 200
    assert ExecutionResult.from_json(response.content).status is ExecutionStatus.COMPLETED
    assert rig.effects == {"one": 1, "gated-step": 1, "two": 1}


async def test_drain_bound_leaves_the_execution_resumable(tmp_path: Path) -> None:
    effects = Effects()
    gate = asyncio.Event()
    db = tmp_path / "drain.db"
    runtime = loom.WorkflowRuntime(SQLiteStore(db))
    runtime.register(*_flows(effects, gate))
    app = create_worker_app(runtime, auth=NoAuth(), drain_timeout=0.2, close_runtime=True)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)
    async with app.router.lifespan_context(app):
        in_flight = asyncio.ensure_future(
            client.post("/execute", content=pkg("d-3", "slow").to_json())
        )
        await effects.reach("gated-step", 1)
    # The step never finished within the bound: the attempt was stopped, the caller told so.
    response = await in_flight
    assert response.status_code == 503 and response.json()["execution_id"] == "d-3"
    await client.aclose()
    # Nothing half-written: the execution is running in the log and a fresh runtime finishes it.
    gate.set()
    fresh = loom.WorkflowRuntime(SQLiteStore(db))
    fresh.register(*_flows(effects, gate))
    state = await fresh.load_state("d-3")
    assert state is not None and state.status is ExecutionStatus.RUNNING
    report = await loom.recover_abandoned(fresh, is_abandoned=lambda s: True, timeout=10)
    assert report.outcomes["d-3"].status is ExecutionStatus.COMPLETED
    assert effects == {"one": 1, "gated-step": 2, "two": 1}
    types = [e.type for e in await fresh.store.read("d-3")]
    assert types.count(EventType.EXECUTION_STARTED) == 1
    await fresh.close()


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


# ------------------------------------------------------------------------------ failover


class FakeWorker:
    def __init__(self, name: str, script: list[BaseException | None]) -> None:
        self.name = name
        self.script = script
        self.executed: list[str] = []

    async def allocate(self, package: ExecutionPackage) -> WorkerLease:
        return WorkerLease(f"{self.name}-lease", package.execution_id, 0, self.name)

    async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
        self.executed.append(package.execution_id)
        step = self.script.pop(0) if self.script else None
        if step is not None:
            raise step
        state = loom.ExecutionState(package.execution_id, status=ExecutionStatus.COMPLETED)
        return ExecutionResult.from_state(state)

    async def release(self, lease: WorkerLease) -> None:
        pass

    async def health(self) -> Health:
        return Health(True, 0, {"name": self.name})


async def test_failover_sends_the_retry_to_another_worker() -> None:
    dead = FakeWorker("a", [RemoteWorkerError("reset", unreachable=True)])
    alive = FakeWorker("b", [])
    failover = FailoverWorkerRuntime([dead, alive])
    result = await LocalDispatcher(failover, max_attempts=2).dispatch(pkg("f-1"))
    assert result.status is ExecutionStatus.COMPLETED
    assert dead.executed == ["f-1"] and alive.executed == ["f-1"]
    # The unreachable worker cools down: new executions go to the live one meanwhile.
    for i in range(3):
        await LocalDispatcher(failover).dispatch(pkg(f"n-{i}"))
    assert dead.executed == ["f-1"] and len(alive.executed) == 4
    assert (await failover.health()).healthy


async def test_failover_round_robins_and_passes_refusals_through() -> None:
    a, b = FakeWorker("a", []), FakeWorker("b", [])
    failover = FailoverWorkerRuntime([a, b])
    for i in range(4):
        await LocalDispatcher(failover).dispatch(pkg(f"r-{i}"))
    assert a.executed == ["r-0", "r-2"] and b.executed == ["r-1", "r-3"]
    refused = FakeWorker("c", [ExecutionSupersededError("gone", execution_id="x-1")])
    failover = FailoverWorkerRuntime([refused, FakeWorker("d", [])])
    dispatcher = LocalDispatcher(failover, max_attempts=3)
    with pytest.raises(ExecutionSupersededError):
        await dispatcher.dispatch(pkg("x-1"))
    assert dispatcher.attempts == 1


async def test_failover_counts_a_timed_out_attempt_against_the_worker() -> None:
    class Wedged(FakeWorker):
        async def execute(self, lease: WorkerLease, package: ExecutionPackage) -> ExecutionResult:
            self.executed.append(package.execution_id)
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    wedged, alive = Wedged("a", []), FakeWorker("b", [])
    dispatcher = LocalDispatcher(
        FailoverWorkerRuntime([wedged, alive]), max_attempts=2, execute_timeout=0.05
    )
    result = await dispatcher.dispatch(pkg("w-1"))
    assert result.status is ExecutionStatus.COMPLETED
    assert wedged.executed == ["w-1"] and alive.executed == ["w-1"]


# ------------------------------------------------------------------------------ holders


async def test_no_live_holder_asks_every_worker(rig: Rig) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with RemoteWorkerRuntime(dead_url, token=SECRET) as dead:
            live = rig.remote()
            running = asyncio.ensure_future(rig.post(pkg("h-1", "slow").to_dict()))
            await rig.effects.reach("gated-step", 1)
            held = loom.ExecutionState("h-1", status=ExecutionStatus.RUNNING)
            orphan = loom.ExecutionState("o-1", status=ExecutionStatus.RUNNING)
            generous = no_live_holder([dead, live], unreachable_is_dead=True)
            cautious = no_live_holder([dead, live], unreachable_is_dead=False)
            assert await generous(held) is False  # the live worker holds it
            assert await generous(orphan) is True  # nobody alive holds it
            assert await cautious(orphan) is False  # an unreachable worker might
            wrong = no_live_holder(
                [rig.remote(token="wrong-token-wrong-token")], unreachable_is_dead=True
            )
            assert await wrong(orphan) is False  # a worker that refuses is not dead
            rig.gate.set()
            assert (await running).status_code == 200


# ------------------------------------------------------------------------------ CLI, surface


def test_cli_refuses_to_serve_without_authentication(monkeypatch: pytest.MonkeyPatch) -> None:
    from loom.cli._worker import worker_app

    runner = CliRunner()
    monkeypatch.delenv("LOOM_WORKER_TOKEN_ENV", raising=False)
    monkeypatch.delenv("LOOM_WORKER_GOOGLE_AUDIENCE", raising=False)
    monkeypatch.delenv("LOOM_WORKER_NO_AUTH", raising=False)
    result = runner.invoke(worker_app, ["serve", "--app", "tests.support.http_flows:make_runtime"])
    assert result.exit_code == 1 and "needs authentication" in result.output
    monkeypatch.delenv("LOOM_TEST_UNSET_TOKEN", raising=False)
    result = runner.invoke(
        worker_app,
        [
            "serve",
            "--app",
            "tests.support.http_flows:make_runtime",
            "--token-env",
            "LOOM_TEST_UNSET_TOKEN",
        ],
    )
    assert result.exit_code == 1 and "LOOM_TEST_UNSET_TOKEN is not set" in result.output


async def test_cli_builds_authenticators_and_loads_runtimes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loom.cli._worker import build_authenticator, load_runtime

    monkeypatch.setenv("LOOM_TEST_TOKEN", SECRET)
    certs = tmp_path / "certs.json"
    certs.write_text(json.dumps(kit().certs()))
    both = build_authenticator(
        token_env="LOOM_TEST_TOKEN",
        google_audience=AUDIENCE,
        google_emails=[DISPATCHER_EMAIL],
        google_certs_file=certs,
        no_auth=False,
    )
    assert isinstance(both, AnyOfAuth)
    assert (await both.authenticate(f"Bearer {kit().mint()}")).subject == DISPATCHER_EMAIL
    with pytest.raises(loom.errors.ConfigurationError):
        build_authenticator(
            token_env="LOOM_TEST_TOKEN",
            google_audience=None,
            google_emails=None,
            google_certs_file=None,
            no_auth=True,
        )
    monkeypatch.setenv("LOOM_TEST_STORE", f"sqlite:{tmp_path / 'cli.db'}")
    runtime = await load_runtime("tests.support.http_flows:make_runtime")
    assert {f.id for f in runtime.flows} == {"held-three", "gated"}
    await runtime.close()
    for bad in [
        "tests.support.http_flows",
        "tests.support.http_flows:nope",
        "no_such_module:x",
        "tests.support.http_flows:FLOWS",
    ]:
        with pytest.raises(loom.errors.ConfigurationError):
            await load_runtime(bad)


def test_public_names_resolve_lazily() -> None:
    import loom.placement.http as http

    for name in http.__all__:
        assert getattr(http, name) is not None
    with pytest.raises(AttributeError):
        http.NoSuchThing  # noqa: B018


# ------------------------------------------------------------------------------ fuzz


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.one_of(
        st.binary(max_size=600),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
            lambda children: st.lists(children) | st.dictionaries(st.text(), children),
            max_leaves=30,
        ).map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries(
            {
                "wire_version": st.sampled_from([1, 1, 2, "1", None]),
                "execution_id": st.one_of(st.text(max_size=300), st.integers()),
                "flow_id": st.sampled_from(["three", "nope", "../etc/passwd", "'; DROP TABLE"]),
                "input": st.one_of(st.integers(-(2**70), 2**70), st.text(), st.none()),
                "resume_event": st.one_of(st.none(), st.integers(), st.just({"event_type": 1})),
            }
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_fuzzed_bodies_are_answered_typed_and_never_500(body: bytes) -> None:
    async def run() -> None:
        runtime = loom.WorkflowRuntime(InMemoryStore())
        runtime.register(*_flows(Effects(), asyncio.Event()))
        app = create_worker_app(runtime, auth=NoAuth(), max_body_bytes=4096)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
            response = await c.post("/execute", content=body)
            assert response.status_code in (200, 400, 404, 413, 422), response.text
            data = response.json()
            if response.status_code != 200:
                assert data["detail"]["type"] and data["code"]
                ids = [eid async for eid in runtime.store.iterate_execution_ids()]
                assert ids == []
            else:
                assert ExecutionResult.from_dict(data).status is ExecutionStatus.COMPLETED
        await runtime.close()

    asyncio.run(run())
