"""TenantScopedEventStore over memory, SQLite and PostgreSQL: the whole conformance kit (with
neighbouring tenants' data of the same ids in the same physical store), isolation across
tenants, and refusals that name the caller's own execution."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from loom.errors import (
    ConfigurationError,
    DuplicateEnvelopeIdError,
    DuplicateSequenceError,
    ExecutionAlreadyExistsError,
    StaleFenceError,
    StartFencedOutError,
    StorageWriteError,
)
from loom.model import Envelope
from loom.storage import InMemoryStore, Snapshot, SQLiteStore, Store
from loom.storage.postgres import PostgresStore
from loom.storage.tenancy import TenantScopedEventStore
from loom.testing import STORE_CHECKS, run_store_check
from loom.testing._store_conformance import env
from tests.support.pg import require_pg, temp_schema

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
_counter = itertools.count()

#: Tenants whose keys sort just before, around and after "acme:" in the physical store.
NEIGHBOURS = ["acme-corp", "acme2", "acm", "acmf", "b"]
#: Every execution id the conformance kit uses, so that neighbours hold the same ids.
KIT_IDS = [
    "rt", "dense", "dup-a", "dup-b", "atomic", "f", "g", "zombie", "race", "silent", "nofence",
    "snap", "e-00-fence-only", "e-01", "e-02", "e-03", "e-04", "e-05", "waited", "many-00",
    "ok-0", "bad", "durable", "lm-plain", "lm-tail", "lm-nolog", "lm-fenced", "lm-unknown",
    "lm-0000",
]  # fmt: skip

Opener = Callable[[], Awaitable[Store]]


@pytest.fixture(params=BACKENDS)
async def physical(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """An opener of one physical store (each call: a new instance over the same data)."""
    backend = request.param
    if backend == "memory":
        shared = InMemoryStore()

        async def open_memory() -> Store:
            return shared

        yield open_memory
    elif backend == "sqlite":
        path = tmp_path / f"tenancy-{next(_counter)}.db"

        async def open_sqlite() -> Store:
            return SQLiteStore(path)

        yield open_sqlite
    else:
        dsn = require_pg()
        async with temp_schema(dsn) as schema:

            async def open_pg() -> Store:
                return await PostgresStore.open(dsn, schema=schema)

            yield open_pg


async def _populate_neighbours(store: Store) -> None:
    """Other tenants (and raw, unscoped keys) that a tenant must never see."""
    for tenant in NEIGHBOURS:
        view = TenantScopedEventStore(store, tenant)
        for execution_id in KIT_IDS:
            fence = await view.acquire_fence(execution_id)
            for _ in range(3):  # fences far ahead of the kit's own
                fence = await view.acquire_fence(execution_id)
            await view.append([env(execution_id, 0, fence), env(execution_id, 1, fence)])
            await view.save_snapshot(Snapshot(execution_id, 99, {"tenant": tenant}))
    for raw in ["acme", "acme;x", "acme9\U0010ffffz"]:
        fence = await store.acquire_fence(raw)
        await store.append([env(raw, 0, fence)])


@pytest.mark.parametrize("check", sorted(STORE_CHECKS))
async def test_conformance(check: str, physical: Opener) -> None:
    async def make() -> Store:
        store = await physical()
        await _populate_neighbours(store)
        return TenantScopedEventStore(store, "acme", close_store=True)

    async def reopen(old: Store) -> Store:
        assert isinstance(old, TenantScopedEventStore)
        return TenantScopedEventStore(await physical(), "acme", close_store=True)

    await run_store_check(check, make, reopen=reopen)


# ---------------------------------------------------------------- isolation


@pytest.fixture
async def two_tenants(
    physical: Opener,
) -> AsyncIterator[tuple[TenantScopedEventStore, TenantScopedEventStore, Store]]:
    store = await physical()
    try:
        yield TenantScopedEventStore(store, "a"), TenantScopedEventStore(store, "b"), store
    finally:
        await store.close()


Tenants = tuple[TenantScopedEventStore, TenantScopedEventStore, Store]


async def test_same_execution_id_in_two_tenants_is_two_executions(two_tenants: Tenants) -> None:
    a, b, _ = two_tenants
    fa = await a.acquire_fence("x")
    await a.append([env("x", 0, fa, payload={"flow_id": "fa", "flow_version": "1", "input": 1})])
    # B's start of the same id neither loses a race nor is fenced out by A's fence.
    assert await b.last_sequence("x") == -1
    assert await b.current_fence("x") == 0
    fb = await b.acquire_fence("x")
    await b.append([env("x", 0, fb, payload={"flow_id": "fb", "flow_version": "1", "input": 2})])
    await a.append([env("x", 1, fa)])
    read_a, read_b = await a.read("x"), await b.read("x")
    assert [e.sequence for e in read_a] == [0, 1] and read_a[0].payload["flow_id"] == "fa"
    assert [e.sequence for e in read_b] == [0] and read_b[0].payload["flow_id"] == "fb"
    assert await a.last_sequence("x") == 1 and await b.last_sequence("x") == 0


async def test_fences_are_per_tenant(two_tenants: Tenants) -> None:
    a, b, _ = two_tenants
    fb = await b.acquire_fence("x")
    await b.append([env("x", 0, fb)])
    for _ in range(5):
        await a.acquire_fence("x")  # A cannot fence B out of its own execution
    assert await b.current_fence("x") == fb
    await b.append([env("x", 1, fb)])
    assert await b.last_sequence("x") == 1


async def test_enumeration_lists_only_the_tenants_executions(two_tenants: Tenants) -> None:
    a, b, store = two_tenants
    for view, ids in [(a, ["x", "y", ""]), (b, ["x", "z"])]:
        for execution_id in ids:
            fence = await view.acquire_fence(execution_id)
            await view.append([env(execution_id, 0, fence)])
    fence = await store.acquire_fence("a")  # a raw key that looks like the tenant
    await store.append([env("a", 0, fence)])
    assert [i async for i in a.iterate_execution_ids(page_size=1)] == ["", "x", "y"]
    assert [i async for i in a.iterate_execution_ids(after="x")] == ["y"]
    assert [i async for i in b.iterate_execution_ids()] == ["x", "z"]


async def test_snapshots_are_per_tenant(two_tenants: Tenants) -> None:
    a, b, _ = two_tenants
    await a.save_snapshot(Snapshot("x", 4, {"who": "a"}))
    assert await b.load_snapshot("x") is None
    await b.save_snapshot(Snapshot("x", 2, {"who": "b"}))
    got_a, got_b = await a.load_snapshot("x"), await b.load_snapshot("x")
    assert got_a == Snapshot("x", 4, {"who": "a"})
    assert got_b == Snapshot("x", 2, {"who": "b"})


async def test_another_tenants_append_does_not_wake_a_waiter(two_tenants: Tenants) -> None:
    a, b, _ = two_tenants
    fa, fb = await a.acquire_fence("x"), await b.acquire_fence("x")
    await b.append([env("x", 0, fb)])
    await a.append([env("x", 0, fa), env("x", 1, fa), env("x", 2, fa)])
    assert await b.wait_for_append("x", 0, timeout=0.05) == 0
    waiting = asyncio.ensure_future(b.wait_for_append("x", 0, timeout=10))
    await a.append([env("x", 3, fa)])
    await b.append([env("x", 1, fb)])
    assert await asyncio.wait_for(waiting, 10) == 1


async def test_envelopes_round_trip_with_the_tenants_ids_and_bytes(two_tenants: Tenants) -> None:
    a, _, store = two_tenants
    fence = await a.acquire_fence("x")
    batch = [env("x", 0, fence), env("x", 1, fence, payload={"t": "héllo", "n": [1, 2.5]})]
    await a.append(batch)
    got = await a.read("x")
    assert [(e.execution_id, e.envelope_id) for e in got] == [("x", e.envelope_id) for e in batch]
    assert [e.payload_json for e in got] == [e.payload_json for e in batch]
    assert got == batch  # every compared field, including recorded_at and fence
    # The physical store holds scoped keys and verifies its checksums over them.
    raw = await store.read("a:x")
    assert [e.envelope_id for e in raw] == [f"a:{e.envelope_id}" for e in batch]


async def test_envelope_ids_are_scoped(two_tenants: Tenants) -> None:
    """The same envelope id in two tenants is two records; within a tenant it is a duplicate."""
    a, b, _ = two_tenants
    fa, fb = await a.acquire_fence("x"), await b.acquire_fence("y")
    await a.append([env("x", 0, fa, envelope_id="shared-id")])
    await b.append([env("y", 0, fb, envelope_id="shared-id")])
    fa2 = await a.acquire_fence("w")
    err = await _refused(a.append([env("w", 0, fa2, envelope_id="shared-id")]))
    assert isinstance(err, DuplicateEnvelopeIdError)
    assert err.execution_id == "w"
    assert await a.read("w") == []


# ---------------------------------------------------------------- unscoped refusals


async def _refused(aw: Awaitable[Any]) -> BaseException:
    try:
        await aw
    except Exception as exc:
        return exc
    raise AssertionError("expected a refusal, nothing was raised")


def _assert_unscoped(err: BaseException, cls: type[BaseException], execution_id: str) -> None:
    assert type(err) is cls, repr(err)
    assert getattr(err, "execution_id", None) == execution_id
    assert "acme:" not in str(err), str(err)
    cause = err.__cause__
    assert isinstance(cause, cls) and getattr(cause, "execution_id", None) == f"acme:{execution_id}"


@pytest.fixture
async def acme(physical: Opener) -> AsyncIterator[TenantScopedEventStore]:
    store = await physical()
    view = TenantScopedEventStore(store, "acme", close_store=True)
    try:
        yield view
    finally:
        await view.close()


async def test_stale_fence_names_the_unscoped_execution(acme: TenantScopedEventStore) -> None:
    old = await acme.acquire_fence("job")
    await acme.append([env("job", 0, old)])
    new = await acme.acquire_fence("job")
    err = await _refused(acme.append([env("job", 1, old)]))
    _assert_unscoped(err, StaleFenceError, "job")
    assert getattr(err, "details", {}) == {"fence": old, "current_fence": new}


async def test_duplicate_sequence_names_the_unscoped_execution(
    acme: TenantScopedEventStore,
) -> None:
    fence = await acme.acquire_fence("job")
    await acme.append([env("job", 0, fence)])
    err = await _refused(acme.append([env("job", 5, fence)]))
    _assert_unscoped(err, DuplicateSequenceError, "job")


async def test_duplicate_envelope_id_names_the_unscoped_execution(
    acme: TenantScopedEventStore,
) -> None:
    fence = await acme.acquire_fence("job")
    await acme.append([env("job", 0, fence, envelope_id="same")])
    err = await _refused(acme.append([env("job", 1, fence, envelope_id="same")]))
    _assert_unscoped(err, DuplicateEnvelopeIdError, "job")


async def test_lost_start_race_names_the_unscoped_execution(acme: TenantScopedEventStore) -> None:
    first = await acme.acquire_fence("job")
    await acme.append([env("job", 0, first)])
    late = await acme.acquire_fence("job")
    err = await _refused(acme.append([env("job", 0, late)]))
    _assert_unscoped(err, ExecutionAlreadyExistsError, "job")


async def test_start_fenced_out_keeps_its_shape_unscoped(acme: TenantScopedEventStore) -> None:
    first = await acme.acquire_fence("job")
    await acme.acquire_fence("job")  # a silent holder
    err = await _refused(acme.append([env("job", 0, first)]))
    assert type(err) is StorageWriteError and getattr(err, "execution_id", None) == "job"
    cause = err.__cause__
    assert isinstance(cause, StartFencedOutError) and cause.execution_id == "job"
    assert "acme:" not in str(err) and "acme:" not in str(cause)
    original = cause.__cause__
    assert isinstance(original, StorageWriteError) and original.execution_id == "acme:job"
    assert isinstance(original.__cause__, StartFencedOutError)


async def test_coalesced_refusal_names_its_own_tenant_execution(physical: Opener) -> None:
    store = await physical()
    try:
        a, b = TenantScopedEventStore(store, "a"), TenantScopedEventStore(store, "b")
        old = await a.acquire_fence("same")
        await a.append([env("same", 0, old)])
        await a.acquire_fence("same")
        fb = await b.acquire_fence("same")
        results = await asyncio.gather(
            a.append([env("same", 1, old)]), b.append([env("same", 0, fb)]), return_exceptions=True
        )
        assert isinstance(results[0], StaleFenceError) and results[0].execution_id == "same"
        assert results[1] is None
    finally:
        await store.close()


class _ForeignFailure(InMemoryStore):
    """A physical store whose coalesced batch failed on another tenant's write."""

    async def append(self, envelopes: Sequence[Envelope]) -> None:
        raise StaleFenceError(
            "fence 1 is stale for execution 'other:secret'", execution_id="other:secret"
        )


async def test_another_tenants_error_is_never_shown() -> None:
    view = TenantScopedEventStore(_ForeignFailure(), "acme")
    err = await _refused(view.append([env("job", 0, 1)]))
    assert type(err) is StorageWriteError
    assert err.__cause__ is None and err.__context__ is None
    assert "secret" not in str(err) and "other:" not in str(err)


# ---------------------------------------------------------------- tenant ids


@pytest.mark.parametrize(
    "tenant",
    ["", "a:b", ":", "a\x00", "a\nb", "\t", "x" * 65, "a\u200bb", "a\u2028", "\ud800", 7, None],
)
def test_tenant_ids_that_could_collide_are_refused(tenant: Any) -> None:
    with pytest.raises(ConfigurationError):
        TenantScopedEventStore(InMemoryStore(), tenant)


@pytest.mark.parametrize("tenant", ["acme", "x" * 64, "Ünïcode-é", "a b", "t_1.2"])
def test_ordinary_tenant_ids_are_accepted(tenant: str) -> None:
    assert TenantScopedEventStore(InMemoryStore(), tenant).tenant == tenant


async def test_close_leaves_the_shared_store_open() -> None:
    store = InMemoryStore()
    view = TenantScopedEventStore(store, "acme")
    await view.close()
    await view.close()
    with pytest.raises(StorageWriteError):
        await view.acquire_fence("x")
    assert await store.acquire_fence("still-open") == 1
