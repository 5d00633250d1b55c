"""The tests' schema teardown names and ends a session that still holds locks, instead of
hanging until the test's timeout."""

from __future__ import annotations

import psycopg
import pytest

from tests.support import pg
from tests.support.pg import drop_test_schema, new_schema_name, require_pg, tagged_dsn


async def test_a_schema_left_locked_is_dropped_and_its_holder_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dsn = require_pg()
    schema = new_schema_name()
    monkeypatch.setattr(pg, "DROP_LOCK_TIMEOUT", "200ms")
    with psycopg.connect(tagged_dsn(dsn, "left-open-by-a-test")) as holder:
        holder.execute(f'CREATE SCHEMA "{schema}"')
        holder.execute(f'CREATE TABLE "{schema}".t (x int)')
        holder.commit()
        holder.execute(f'SELECT * FROM "{schema}".t')  # idle in transaction, holding a lock
        with pytest.raises(pytest.fail.Exception) as failed:
            await drop_test_schema(dsn, schema)
        assert "left-open-by-a-test" in str(failed.value)
        assert "idle in transaction" in str(failed.value)
        with pytest.raises(psycopg.OperationalError):
            holder.execute("SELECT 1")  # it was terminated
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    assert row is None


async def test_an_unlocked_schema_is_just_dropped() -> None:
    dsn = require_pg()
    schema = new_schema_name()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    await drop_test_schema(dsn, schema)
    await drop_test_schema(dsn, schema)  # idempotent
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    assert row is None
