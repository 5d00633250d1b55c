"""The BlobStore conformance kit on memory, SQLite, PostgreSQL and the tenant view."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from loom.storage import BlobStore, InMemoryStore, SQLiteStore, blob_hash
from loom.storage.tenancy import TenantScopedEventStore
from loom.testing import run_blob_store_conformance
from tests.support.pg import require_pg, temp_schema

_n = itertools.count()


async def test_memory_store_passes_the_blob_kit() -> None:
    async def make() -> BlobStore:
        return InMemoryStore()

    await run_blob_store_conformance(make)


async def test_sqlite_store_passes_the_blob_kit(tmp_path: Path) -> None:
    async def make() -> BlobStore:
        return SQLiteStore(tmp_path / f"b{next(_n)}.db")

    await run_blob_store_conformance(make)


async def test_sqlite_blobs_survive_reopening(tmp_path: Path) -> None:
    data = b"durable"
    store = SQLiteStore(tmp_path / "r.db")
    await store.put_blobs({blob_hash(data): data})
    await store.close()
    again = SQLiteStore(tmp_path / "r.db")
    assert await again.get_blobs([blob_hash(data)]) == {blob_hash(data): data}
    await again.close()


@pytest.mark.postgres
async def test_postgres_store_passes_the_blob_kit() -> None:
    dsn = require_pg()
    from loom.storage.postgres import PostgresStore

    async with temp_schema(dsn) as schema:

        async def make() -> BlobStore:
            return await PostgresStore.open(dsn, schema=schema)

        await run_blob_store_conformance(make)


async def test_tenant_view_passes_the_kit_and_tenants_never_see_each_other(physical: Any) -> None:
    async def make() -> BlobStore:
        return TenantScopedEventStore(physical, f"t{next(_n)}")

    await run_blob_store_conformance(make)
    acme = TenantScopedEventStore(physical, "acme")
    globex = TenantScopedEventStore(physical, "globex")
    secret = b"acme's plan"
    key = blob_hash(secret)
    await acme.put_blobs({key: secret})
    assert await acme.get_blobs([key]) == {key: secret}
    assert await globex.get_blobs([key]) == {}
    assert await physical.get_blobs([key]) == {}  # nor the raw, unscoped store
    # The same bytes put by the other tenant are its own copy, not a shared one.
    await globex.put_blobs({key: secret})
    assert await globex.get_blobs([key]) == {key: secret}


async def test_append_with_blobs_writes_both_and_a_refused_append_writes_no_event(
    physical: Any,
) -> None:
    from loom.errors import StaleFenceError
    from loom.storage import AppendsWithBlobs
    from tests.storage.test_sqlite_store import env

    for store in (physical, TenantScopedEventStore(physical, "acme")):
        if not isinstance(store, AppendsWithBlobs):
            continue  # PostgreSQL: put, then append (the driver's fallback)
        data = b"a tool result"
        key = blob_hash(data)
        fence = await store.acquire_fence("ab")
        await store.append_with_blobs([env("ab", 0, fence)], {key: data})
        assert await store.get_blobs([key]) == {key: data}
        assert [e.sequence for e in await store.read("ab")] == [0]
        newer = await store.acquire_fence("ab")
        assert newer > fence
        other = b"a zombie's result"
        with pytest.raises(StaleFenceError):
            await store.append_with_blobs([env("ab", 1, fence)], {blob_hash(other): other})
        assert [e.sequence for e in await store.read("ab")] == [0]  # no event was written
