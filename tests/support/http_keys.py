"""Locally generated RSA keys that mint Google-style ID tokens for the HTTP worker tests.

The worker verifies them exactly as it verifies Google's (google.auth.jwt, RS256, x509 PEM
certificates by key id); only the certificates come from here instead of Google.
"""

from __future__ import annotations

import datetime
import functools
import time
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt

AUDIENCE = "https://loom-worker-test.a.run.app"
DISPATCHER_EMAIL = "dispatcher@loom-test.iam.gserviceaccount.com"


@dataclass(frozen=True)
class TokenKit:
    kid: str
    private_pem: bytes
    cert_pem: str

    def certs(self) -> dict[str, str]:
        return {self.kid: self.cert_pem}

    def mint(
        self,
        *,
        audience: str = AUDIENCE,
        email: str = DISPATCHER_EMAIL,
        email_verified: bool = True,
        issuer: str = "https://accounts.google.com",
        lifetime: float = 3600.0,
        issued_at: float | None = None,
        kid: str | None = None,
        **extra: Any,
    ) -> str:
        now = time.time() if issued_at is None else issued_at
        payload = {
            "iss": issuer,
            "aud": audience,
            "sub": "1234567890",
            "email": email,
            "email_verified": email_verified,
            "iat": int(now),
            "exp": int(now + lifetime),
            **extra,
        }
        signer = crypt.RSASigner.from_string(self.private_pem, key_id=kid or self.kid)
        token: bytes = jwt.encode(signer, payload)  # type: ignore[no-untyped-call]
        return token.decode()


@functools.cache
def kit(kid: str = "loom-test-key") -> TokenKit:
    """A fresh RSA key (cached per kid, keygen is slow) with a self-signed certificate."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, kid)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .sign(key, hashes.SHA256())
    )
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return TokenKit(kid, private_pem, cert.public_bytes(serialization.Encoding.PEM).decode())
