"""The tests' schema teardown names and ends a session that still holds locks, instead of
hanging until the test's timeout."""

from __future__ import annotations

import psycopg
import pytest

from tests.support import pg
from tests.support.pg import drop_test_schema, new_schema_name, require_pg, tagged_dsn


@pytest.mark.parametrize(
    "left_open",
    [
        'SELECT * FROM "{schema}".t',  # a lock on a table in it
        'CREATE TABLE "{schema}".u (x int)',  # a table not committed yet: no visible relation
        "COMMENT ON SCHEMA \"{schema}\" IS 'busy'",  # a lock on the schema itself
    ],
    ids=["table", "uncommitted-table", "schema"],
)
async def test_a_schema_left_locked_is_dropped_and_its_holder_named(
    monkeypatch: pytest.MonkeyPatch, left_open: str
) -> None:
    dsn = require_pg()
    schema = new_schema_name()
    monkeypatch.setattr(pg, "DROP_WAIT", 0.3)
    with psycopg.connect(tagged_dsn(dsn, "left-open-by-a-test")) as holder:
        holder.execute(f'CREATE SCHEMA "{schema}"')
        holder.execute(f'CREATE TABLE "{schema}".t (x int)')
        holder.commit()
        holder.execute(left_open.format(schema=schema))  # idle in transaction, holding a lock
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
