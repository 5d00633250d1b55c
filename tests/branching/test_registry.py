"""The BranchRegistry conformance kit on memory, SQLite, PostgreSQL and the tenant view, and a
promotion race between two real processes on PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from loom.errors import RefNotFoundError
from loom.storage import InMemoryStore, SQLiteStore
from loom.storage.tenancy import TenantScopedEventStore
from loom.testing import run_branch_registry_conformance
from tests.support.pg import drop_test_schema, require_pg, temp_schema
from tests.support.proc import Child

_n = itertools.count()


async def test_memory_store_passes_the_branch_kit() -> None:
    async def make() -> Any:
        return InMemoryStore()

    await run_branch_registry_conformance(make)


async def test_sqlite_store_passes_the_branch_kit(tmp_path: Path) -> None:
    async def make() -> Any:
        return SQLiteStore(tmp_path / f"b{next(_n)}.db")

    await run_branch_registry_conformance(make)


async def test_sqlite_refs_survive_reopening(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db")
    ref = await store.put_ref("main", "p", 4)
    await store.close()
    again = SQLiteStore(tmp_path / "r.db")
    assert await again.get_ref("main") == ref
    await again.close()


@pytest.mark.postgres
async def test_postgres_store_passes_the_branch_kit() -> None:
    dsn = require_pg()
    from loom.storage.postgres import PostgresStore

    async with temp_schema(dsn) as schema:

        async def make() -> Any:
            store = await PostgresStore.open(dsn, schema=f"{schema}_{next(_n)}")
            return store

        try:
            await run_branch_registry_conformance(make)
        finally:
            for i in range(next(_n) + 1):
                await drop_test_schema(dsn, f"{schema}_{i}")


async def test_tenant_view_passes_the_kit_and_tenants_never_see_each_other(physical: Any) -> None:
    async def make() -> Any:
        return TenantScopedEventStore(physical, f"t{next(_n)}")

    await run_branch_registry_conformance(make)
    acme = TenantScopedEventStore(physical, "acme")
    globex = TenantScopedEventStore(physical, "globex")
    ref = await acme.put_ref("main", "p", 3)
    assert (ref.name, ref.execution_id) == ("main", "p")
    assert await globex.get_ref("main") is None
    assert await globex.list_refs() == []
    with pytest.raises(RefNotFoundError) as info:
        await globex.move_tip("main", 9, expected=3)
    assert "acme" not in str(info.value)
    # Globex's own "main" is another ref: acme's is untouched by it.
    await globex.put_ref("main", "q", 1)
    assert await acme.get_ref("main") == ref
    raw = [r.name for r in await physical.list_refs()]
    assert "acme:main" in raw and "globex:main" in raw


@pytest.mark.postgres
async def test_two_processes_race_to_promote_exactly_one_wins() -> None:
    dsn = require_pg()
    from loom.storage.postgres import PostgresStore

    async with temp_schema(dsn) as schema:
        store = await PostgresStore.open(dsn, schema=schema)
        try:
            await store.put_ref("main", "parent", 5)
            for name in ("sim/a", "sim/b"):
                await store.put_ref(
                    name, name.replace("/", "-"), 8, forked_from="parent", fork_sequence=5
                )
            procs = [
                Child("promoter", "store", dsn, schema, branch, stdin=True)
                for branch in ("sim/a", "sim/b")
            ]
            try:
                for p in procs:
                    await asyncio.to_thread(p.ready, "ready", timeout=30)
                for p in procs:
                    p.send("go")
                ends = [await asyncio.to_thread(p.finish, timeout=30) for p in procs]
            finally:
                for p in procs:
                    p.kill()
            outs = [(out, err) for _, out, err in ends]
            assert [code for code, _, _ in ends] == [0, 0], outs
            results = [json.loads(out.splitlines()[-1]) for out, _ in outs]
            won = [r["won"] for r in results if "won" in r]
            lost = [r for r in results if "lost" in r]
            assert len(won) == 1 and len(lost) == 1, results
            assert lost[0] == {"lost": "PromotionConflictError", "ref": "main"}
            main = await store.get_ref("main")
            assert main is not None and main.execution_id == won[0]
        finally:
            await store.close()
