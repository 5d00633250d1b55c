from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from loom.storage import InMemoryStore, SQLiteStore, Store
from loom.testing import STORE_CHECKS, run_store_check

_counter = itertools.count()


@pytest.mark.parametrize("check", sorted(STORE_CHECKS))
async def test_memory_store(check: str) -> None:
    async def make() -> Store:
        return InMemoryStore()

    await run_store_check(check, make)


@pytest.mark.parametrize("check", sorted(STORE_CHECKS))
@pytest.mark.parametrize("group_commit", [True, False])
async def test_sqlite_store(check: str, group_commit: bool, tmp_path: Path) -> None:
    async def make() -> Store:
        return SQLiteStore(tmp_path / f"s{next(_counter)}.db", group_commit=group_commit)

    async def reopen(store: Store) -> Store:
        assert isinstance(store, SQLiteStore)
        return SQLiteStore(store.path)

    await run_store_check(check, make, reopen=reopen)
