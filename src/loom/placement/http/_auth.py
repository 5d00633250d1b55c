"""Authenticators for the HTTP worker: a shared bearer secret or a Google-signed ID token.

An authenticator sees only the ``Authorization`` header and either returns a
:class:`Principal` or raises :class:`AuthenticationError`. The worker calls it before it reads
the request body, so an unauthenticated caller can neither run anything nor make the worker
buffer a large body. Any other exception (say, Google's certificates cannot be fetched) is a
fault of the worker, answered ``503``: it runs nothing either, but does not blame the token.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from loom.errors import ConfigurationError
from loom.placement.http._errors import AuthenticationError

if TYPE_CHECKING:
    import httpx

__all__ = [
    "GOOGLE_CERTS_URL",
    "GOOGLE_ISSUERS",
    "AnyOfAuth",
    "Authenticator",
    "BearerTokenAuth",
    "GoogleIdTokenAuth",
    "NoAuth",
    "Principal",
]

log = logging.getLogger("loom.placement.http")

#: Where Google publishes the (x509, PEM) certificates that sign its ID tokens.
GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
#: The ``iss`` claims of a Google-signed ID token.
GOOGLE_ISSUERS: tuple[str, ...] = ("accounts.google.com", "https://accounts.google.com")

# A real ID token is about 1 KiB; refusing huge headers early bounds the work a stranger causes.
_MAX_TOKEN_CHARS = 16_384


@dataclass(frozen=True, slots=True)
class Principal:
    """Who called: ``scheme`` is how they proved it, ``subject`` who they are."""

    subject: str
    scheme: str
    claims: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Authenticator(Protocol):
    """Decides whether a request may run anything.

    ``authenticate`` gets the raw ``Authorization`` header (None when absent). It returns the
    caller's :class:`Principal` or raises :class:`AuthenticationError` (answered 401). It must
    not have side effects on Loom's store. Any other exception is answered 503.
    """

    async def authenticate(self, authorization: str | None) -> Principal: ...


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or AuthenticationError."""
    if not authorization:
        raise AuthenticationError("missing Authorization header")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationError("the Authorization header is not 'Bearer <token>'")
    if len(token) > _MAX_TOKEN_CHARS:
        raise AuthenticationError("the bearer token is implausibly long")
    return token


class BearerTokenAuth:
    """Accepts callers presenting a shared secret: ``Authorization: Bearer <secret>``.

    Several secrets may be given to rotate without downtime (accept old and new, then drop the
    old). Comparison is constant-time (:func:`hmac.compare_digest`) against every secret, so
    timing reveals neither the secret nor which one matched. Secrets shorter than
    ``min_length`` are refused at construction: a guessable secret is a misconfiguration.
    """

    def __init__(
        self, secret: str | bytes | Sequence[str | bytes], *, min_length: int = 16
    ) -> None:
        raw: Sequence[str | bytes] = [secret] if isinstance(secret, (str, bytes)) else secret
        secrets = [s.encode() if isinstance(s, str) else bytes(s) for s in raw]
        if not secrets:
            raise ConfigurationError("BearerTokenAuth needs at least one secret")
        if any(len(s) < min_length for s in secrets):
            raise ConfigurationError(
                f"a worker token must be at least {min_length} bytes long",
                hint="Generate one with: python -c 'import secrets; print(secrets.token_hex())'",
            )
        self._secrets = secrets

    async def authenticate(self, authorization: str | None) -> Principal:
        token = bearer_token(authorization).encode()
        matched = False
        for secret in self._secrets:
            matched |= hmac.compare_digest(token, secret)
        if not matched:
            raise AuthenticationError("invalid bearer token")
        return Principal(subject="bearer", scheme="bearer")


class NoAuth:
    """Accepts every caller. Use it only where something in front already authenticates
    (for example Cloud Run's IAM invoker check) or in tests; it must be chosen explicitly."""

    async def authenticate(self, authorization: str | None) -> Principal:
        return Principal(subject="anonymous", scheme="none")


class AnyOfAuth:
    """Accepts a caller that any of ``authenticators`` accepts (tried in order): e.g. a bearer
    secret for an internal dispatcher and Google ID tokens for Cloud Run callers."""

    def __init__(self, *authenticators: Authenticator) -> None:
        if not authenticators:
            raise ConfigurationError("AnyOfAuth needs at least one authenticator")
        self.authenticators = authenticators

    async def authenticate(self, authorization: str | None) -> Principal:
        refused: AuthenticationError | None = None
        for authenticator in self.authenticators:
            try:
                return await authenticator.authenticate(authorization)
            except AuthenticationError as exc:
                refused = exc
        assert refused is not None
        raise refused


CertsSource = Callable[[], Awaitable[Mapping[str, str | bytes]]]
ClaimsVerifier = Callable[[str], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]


class GoogleIdTokenAuth:
    """Accepts callers presenting a Google-signed OpenID Connect ID token for ``audience``.

    This is what Cloud Run and other Google callers send (``Authorization: Bearer <ID token>``,
    minted by ``google.oauth2.id_token.fetch_id_token``). The token's RS256 signature is checked
    against Google's published certificates, then its ``exp``/``iat`` (allowing ``clock_skew``
    seconds), ``aud`` (one of ``audience``), ``iss`` (one of ``issuers``) and, when
    ``allowed_emails`` is given, a verified ``email`` claim in that set (name the dispatcher's
    service accounts there: any Google account can mint a token for any audience).

    ``certs`` replaces Google's certificates: a mapping of key id to PEM certificate or public
    key, or an async callable returning one (tests use a locally generated key), or a
    :class:`GoogleCerts` fetcher of your own (another URL, a shared HTTP client). ``verifier``
    replaces signature checking entirely (a callable from token to claims, sync or async); the
    claim checks above still apply to what it returns. By default the certificates are fetched
    from :data:`GOOGLE_CERTS_URL` with httpx and cached as long as Google's Cache-Control says.

    A valid token can be replayed until it expires (Google's last an hour): send it only over
    TLS. A replayed ``/execute`` runs nothing new (execute is idempotent under redispatch).
    """

    def __init__(
        self,
        audience: str | Sequence[str],
        *,
        certs: Mapping[str, str | bytes] | GoogleCerts | CertsSource | None = None,
        verifier: ClaimsVerifier | None = None,
        issuers: Collection[str] = GOOGLE_ISSUERS,
        allowed_emails: Collection[str] | None = None,
        clock_skew: int = 10,
        certs_url: str = GOOGLE_CERTS_URL,
    ) -> None:
        audiences = [audience] if isinstance(audience, str) else list(audience)
        if not audiences or not all(audiences):
            raise ConfigurationError("GoogleIdTokenAuth needs a non-empty audience")
        if certs is not None and verifier is not None:
            raise ConfigurationError("give GoogleIdTokenAuth certs or a verifier, not both")
        self.audiences = audiences
        self.issuers = frozenset(issuers)
        self.allowed_emails = None if allowed_emails is None else frozenset(allowed_emails)
        self.clock_skew = clock_skew
        self._verifier = verifier
        self._static_certs: Mapping[str, str | bytes] | None = None
        self._certs_source: CertsSource | None = None
        self._fetcher: GoogleCerts | None = None
        if isinstance(certs, Mapping):
            self._static_certs = certs
        elif isinstance(certs, GoogleCerts):
            self._fetcher = certs
        elif certs is not None:
            self._certs_source = certs
        elif verifier is None:
            self._fetcher = GoogleCerts(certs_url)

    async def authenticate(self, authorization: str | None) -> Principal:
        token = bearer_token(authorization)
        claims = await self._claims(token)
        if claims.get("iss") not in self.issuers:
            raise AuthenticationError("ID token has an unexpected issuer")
        aud = claims.get("aud")
        if aud not in self.audiences:
            raise AuthenticationError("ID token was minted for another audience")
        email = claims.get("email")
        if self.allowed_emails is not None and (
            email not in self.allowed_emails or claims.get("email_verified") is not True
        ):
            raise AuthenticationError("ID token's account is not allowed to call this worker")
        subject = str(email or claims.get("sub") or "unknown")
        return Principal(subject=subject, scheme="google-id-token", claims=dict(claims))

    async def _claims(self, token: str) -> Mapping[str, Any]:
        from google.auth import jwt  # the cloudrun extra; imported only when used

        if self._verifier is not None:
            try:
                result = self._verifier(token)
                claims = await result if inspect.isawaitable(result) else result
            except AuthenticationError:
                raise
            except Exception as exc:  # any failure to verify is a refusal, never a pass
                log.info("ID token refused by the verifier: %r", exc)
                raise AuthenticationError("invalid ID token") from None
            if not isinstance(claims, Mapping):
                raise AuthenticationError("invalid ID token")
            return claims
        try:
            kid = jwt.decode_header(token).get("kid")  # type: ignore[no-untyped-call]
        except Exception as exc:
            log.info("malformed ID token refused: %r", exc)
            raise AuthenticationError("invalid ID token") from None
        certs = await self._certs(kid)
        try:
            claims = jwt.decode(  # type: ignore[no-untyped-call]
                token,
                certs=certs,
                audience=self.audiences,
                clock_skew_in_seconds=self.clock_skew,
            )
        except Exception as exc:  # expired, wrong audience, bad signature, unknown key...
            log.info("ID token refused: %s", exc)
            raise AuthenticationError("invalid ID token") from None
        if not isinstance(claims, Mapping):
            raise AuthenticationError("invalid ID token")
        return claims

    async def _certs(self, kid: object) -> Mapping[str, str | bytes]:
        if self._static_certs is not None:
            return self._static_certs
        if self._certs_source is not None:
            return await self._certs_source()
        assert self._fetcher is not None
        certs = await self._fetcher.get()
        if isinstance(kid, str) and kid not in certs:
            # Google rotates keys; a token signed with a brand-new key is worth one refetch.
            certs = await self._fetcher.get(refresh=True)
        return certs


_MAX_AGE = re.compile(r"max-age=(\d+)")


class GoogleCerts:
    """Google's ID-token signing certificates, fetched with httpx and cached per Cache-Control.

    A forced refresh (for an unknown key id) happens at most once per ``min_refresh`` seconds,
    so a stream of tokens with made-up key ids cannot turn the worker into a request amplifier.
    """

    def __init__(
        self,
        url: str = GOOGLE_CERTS_URL,
        *,
        client: httpx.AsyncClient | None = None,
        min_refresh: float = 60.0,
        default_max_age: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self._client = client
        self.min_refresh = min_refresh
        self.default_max_age = default_max_age
        self._clock = clock
        self._certs: Mapping[str, str | bytes] | None = None
        self._expires_at = 0.0
        self._fetched_at = float("-inf")
        self._lock = asyncio.Lock()

    async def get(self, *, refresh: bool = False) -> Mapping[str, str | bytes]:
        # One fetch at a time: a burst of requests on a cold cache waits for the same fetch.
        async with self._lock:
            now = self._clock()
            stale = self._certs is None or now >= self._expires_at
            may_refresh = now - self._fetched_at >= self.min_refresh
            if stale or (refresh and may_refresh):
                await self._fetch()
            assert self._certs is not None
            return self._certs

    async def _fetch(self) -> None:
        import httpx

        client = self._client or httpx.AsyncClient(timeout=10.0)
        try:
            response = await client.get(self.url)
            response.raise_for_status()
            data = response.json()
        finally:
            if self._client is None:
                await client.aclose()
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise ValueError(f"unexpected certificate document from {self.url}")
        match = _MAX_AGE.search(response.headers.get("cache-control", ""))
        max_age = float(match.group(1)) if match else self.default_max_age
        now = self._clock()
        self._certs = data
        self._fetched_at = now
        self._expires_at = now + max_age
