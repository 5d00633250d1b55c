from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from loom import faults
from loom.storage import InMemoryStore, SQLiteStore, Store


@pytest.fixture(autouse=True)
def _no_armed_faults() -> Iterator[None]:
    faults.disarm_all()
    yield
    faults.disarm_all()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "loom.db"


PG_DSN = os.environ.get("LOOM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


class Backend:
    """The store a test runs over: ``memory``, ``sqlite`` (a file in the test's tmp_path),
    ``postgres`` (a fresh schema, dropped afterwards) or ``tenant`` (tenant "acme"'s view of a
    SQLite file, for tests of what the tenant view must pass through).

    ``store()`` opens one more store over the same data (what a restarted process or a second
    process sees; on ``memory`` it is the one shared instance). Every store opened is closed at
    teardown (closing is idempotent, so a runtime may close its own first).
    """

    def __init__(self, kind: str, location: str, schema: str | None = None) -> None:
        self.kind = kind
        self.location = location
        self.schema = schema
        self.opened: list[Store] = []
        self._memory: InMemoryStore | None = None

    def store(self) -> Store:
        if self.kind == "memory":
            if self._memory is None:
                self._memory = InMemoryStore()
                self.opened.append(self._memory)
            return self._memory
        store: Store
        if self.kind == "sqlite":
            store = SQLiteStore(self.location)
        elif self.kind == "tenant":
            from loom.storage.tenancy import TenantScopedEventStore

            store = TenantScopedEventStore(SQLiteStore(self.location), "acme", close_store=True)
        else:
            from loom.storage.postgres import PostgresStore

            store = PostgresStore(self.location, schema=self.schema)
        self.opened.append(store)
        return store

    async def close(self) -> None:
        for store in self.opened:
            await store.close()

    def __repr__(self) -> str:
        return f"Backend({self.kind})"


# PostgreSQL params skip with the reason when no server answers (fail under
# LOOM_REQUIRE_POSTGRES=1: tests/support/pg.py), like every other PostgreSQL test.
BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
# The backends whose every store() is a handle of its own over the same data (what a second
# process sees): for tests about one runtime closing while another carries on.
DURABLE = BACKENDS[1:]
# And the tenant view over SQLite, for the runtime features the view must pass through.
WITH_TENANT = [*BACKENDS, "tenant"]


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """The runtime suite's store, parametrized over memory / SQLite / PostgreSQL."""
    if request.param != "postgres":
        b = Backend(request.param, str(tmp_path / "loom.db"))
        try:
            yield b
        finally:
            await b.close()
        return
    from tests.support.pg import require_pg, temp_schema

    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        b = Backend("postgres", dsn, schema)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
async def physical(backend: Backend) -> Store:
    """A physical store over ``backend`` (memory / SQLite / PostgreSQL), for tests of what is
    layered on one, such as the tenant view."""
    return backend.store()


@pytest.fixture
def pg_dsn() -> str:
    """The test server's DSN (the test skips, or fails under LOOM_REQUIRE_POSTGRES, without)."""
    from tests.support.pg import require_pg

    return require_pg()


@pytest.fixture
async def schema(pg_dsn: str) -> AsyncIterator[str]:
    """A fresh PostgreSQL schema name, dropped after the test."""
    from tests.support.pg import temp_schema

    async with temp_schema(pg_dsn) as name:
        yield name


@pytest.fixture
async def pg_store(pg_dsn: str, schema: str) -> AsyncIterator[Store]:
    """A PostgresStore over ``schema``, closed after the test."""
    from loom.storage.postgres import PostgresStore

    store = await PostgresStore.open(pg_dsn, schema=schema)
    try:
        yield store
    finally:
        await store.close()
