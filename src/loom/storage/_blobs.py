"""The BlobStore SPI: content-addressed bytes (sha256), written before the events naming them.

An agent's conversation lives here: each message is stored once under the sha256 of its bytes
and events refer to it by that hash, so a long conversation stores each message once instead
of re-recording the whole history on every model call.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from loom.model import Envelope

from loom.errors import PayloadError

__all__ = ["AppendsWithBlobs", "BlobStore", "blob_hash", "check_blobs", "check_hashes"]

_HEX64 = re.compile(r"[0-9a-f]{64}")


def blob_hash(data: bytes) -> str:
    """The address of ``data``: its sha256, as 64 lowercase hex digits."""
    return hashlib.sha256(data).hexdigest()


def check_hashes(hashes: Iterable[str]) -> list[str]:
    """The hashes as a list, refusing anything that is not 64 lowercase hex digits."""
    out = list(hashes)
    for h in out:
        if not isinstance(h, str) or not _HEX64.fullmatch(h):
            raise PayloadError(f"{h!r} is not a blob address (64 lowercase hex digits)")
    return out


def check_blobs(blobs: Mapping[str, bytes], max_bytes: int | None = None) -> None:
    """Refuse a put whose keys are not the sha256 of their bytes (or that is too large)."""
    for key, data in blobs.items():
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise PayloadError(f"blob {key!r} is not bytes")
        if max_bytes is not None and len(data) > max_bytes:
            raise PayloadError(
                f"blob {key[:12]}... is {len(data)} bytes, over the {max_bytes}-byte limit"
            )
        if blob_hash(bytes(data)) != key:
            raise PayloadError(f"blob {key!r} does not hash to its key (sha256 of its bytes)")


@runtime_checkable
class BlobStore(Protocol):
    """Content-addressed storage. Optional capability of a store (like TimerStore).

    Contract: ``put_blobs`` stores each ``sha256 hex -> bytes`` pair durably before it
    returns; it is idempotent (putting a stored blob again is a no-op that succeeds) and
    refuses a pair whose key is not the sha256 of its bytes (``PayloadError``, nothing
    stored). ``get_blobs`` returns the stored ones among ``hashes`` (missing ones are absent
    from the result). A caller writes a blob before (or in the same transaction as) the first
    event that names it, so a crash never leaves an event pointing at nothing; a crash after the
    put and before the event leaves an unreferenced blob, which is harmless. ``namespace``
    partitions blobs: a blob put in one namespace is invisible from every other (the tenant
    view gives each tenant its own, so tenants neither see nor share each other's blobs).
    Safe to call concurrently.
    """

    async def put_blobs(self, blobs: Mapping[str, bytes], *, namespace: str = "") -> None: ...

    async def get_blobs(
        self, hashes: Iterable[str], *, namespace: str = ""
    ) -> dict[str, bytes]: ...


@runtime_checkable
class AppendsWithBlobs(Protocol):
    """Optional: append events and the blobs they first name in ONE transaction.

    Same contract as ``append`` (all or nothing for the events, same refusals); the blobs are
    put idempotently in the same transaction, and may stay stored when the events are refused
    (an unreferenced blob is harmless). A store without it gets ``put_blobs`` then ``append``:
    one more commit, the same guarantee (never an event naming a missing blob).
    """

    async def append_with_blobs(
        self, envelopes: Sequence[Envelope], blobs: Mapping[str, bytes], *, namespace: str = ""
    ) -> None: ...
