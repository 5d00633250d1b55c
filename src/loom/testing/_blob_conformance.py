"""The BlobStore conformance kit: ``await run_blob_store_conformance(make_store)``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from loom.errors import PayloadError
from loom.storage import BlobStore, blob_hash

__all__ = ["BLOB_CHECKS", "run_blob_store_conformance"]

MakeBlobStore = Callable[[], Awaitable[BlobStore]]
BlobCheck = Callable[[BlobStore], Awaitable[None]]
BLOB_CHECKS: dict[str, BlobCheck] = {}


def _check(fn: BlobCheck) -> BlobCheck:
    BLOB_CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def _blob(text: str) -> tuple[str, bytes]:
    data = text.encode()
    return blob_hash(data), data


@_check
async def check_put_then_get(store: BlobStore) -> None:
    a, b = _blob("alpha"), _blob("beta \u2603" * 100)
    binary = bytes(range(256)) * 4
    await store.put_blobs({a[0]: a[1], b[0]: b[1], blob_hash(binary): binary})
    got = await store.get_blobs([a[0], b[0], blob_hash(binary)])
    assert got == {a[0]: a[1], b[0]: b[1], blob_hash(binary): binary}, got


@_check
async def check_put_is_idempotent(store: BlobStore) -> None:
    key, data = _blob("same")
    await store.put_blobs({key: data})
    await store.put_blobs({key: data})
    await asyncio.gather(*(store.put_blobs({key: data}) for _ in range(8)))
    assert await store.get_blobs([key]) == {key: data}


@_check
async def check_missing_blobs_are_absent(store: BlobStore) -> None:
    key, data = _blob("present")
    await store.put_blobs({key: data})
    ghost = blob_hash(b"never stored")
    assert await store.get_blobs([ghost, key]) == {key: data}
    assert await store.get_blobs([]) == {}


@_check
async def check_a_key_that_is_not_the_hash_is_refused(store: BlobStore) -> None:
    good_key, good = _blob("good")
    wrong = blob_hash(b"something else")
    try:
        await store.put_blobs({good_key: good, wrong: b"not what the key says"})
    except PayloadError:
        pass
    else:  # pragma: no cover - a failure report
        raise AssertionError("a blob whose key is not its sha256 was accepted")
    assert await store.get_blobs([good_key, wrong]) == {}, "a refused put stored something"
    try:
        await store.get_blobs(["../../etc/passwd"])
    except PayloadError:
        pass
    else:  # pragma: no cover - a failure report
        raise AssertionError("a malformed address was looked up")


@_check
async def check_namespaces_are_isolated(store: BlobStore) -> None:
    key, data = _blob("tenant secret")
    await store.put_blobs({key: data}, namespace="acme:")
    assert await store.get_blobs([key], namespace="acme:") == {key: data}
    assert await store.get_blobs([key], namespace="globex:") == {}
    assert await store.get_blobs([key]) == {}


@_check
async def check_many_blobs_in_one_call(store: BlobStore) -> None:
    blobs = dict(_blob(f"message {i}") for i in range(1200))
    await store.put_blobs(blobs)
    got = await store.get_blobs(list(blobs))
    assert got == blobs, len(got)


async def run_blob_store_conformance(make_store: MakeBlobStore) -> None:
    """Run every check, each on a fresh store from ``make_store``; the first failure raises."""
    for name, check in BLOB_CHECKS.items():
        store = await make_store()
        try:
            await check(store)
        except AssertionError as exc:
            raise AssertionError(f"blob store check {name!r} failed: {exc}") from exc
        finally:
            close = getattr(store, "close", None)
            if close is not None:
                await close()
