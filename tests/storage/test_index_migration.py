"""The execution index on existing databases: the migration ladder back-fills it from the logs
(SQLite and PostgreSQL), read-only openings never write, and open_store() picks the store."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

import loom
from loom.errors import (
    ConfigurationError,
    NotALoomDatabaseError,
    SchemaVersionError,
    StorageWriteError,
)
from loom.model import ExecutionStatus, replay
from loom.storage import ExecutionQuery, SQLiteStore, open_store
from loom.storage._schema import SCHEMA_VERSION
from tests.support.old_schema import pg_events_before_rung_10, sqlite_events_before_rung_10
from tests.support.pg import require_pg, temp_schema


@loom.step(id="double")
async def double(x: int) -> int:
    return x * 2


@loom.step(id="boom")
async def boom() -> None:
    raise ValueError("no")


@loom.flow(id="gated")
async def gated(ctx: loom.WorkflowContext, x: int) -> int:
    y: int = await ctx.run(double, x)
    if x == 3:
        await ctx.run(boom, retry=loom.RetryPolicy(max_attempts=1))
    if x % 2 == 0:
        await ctx.suspend("approve")
    return y


async def _populate(store: Any) -> dict[str, ExecutionStatus]:
    """Executions in every state the index shows: completed, suspended, failed."""
    rt = loom.WorkflowRuntime(store)
    rt.register(gated)
    try:
        for x in range(6):
            handle = await rt.start(gated, x, execution_id=f"old-{x}")
            await _settle(rt, handle.execution_id)
        states = {}
        async for eid in store.iterate_execution_ids():
            state = replay(await store.read(eid))
            states[eid] = state.status
        return states
    finally:
        await rt.close()


async def _settle(rt: loom.WorkflowRuntime, execution_id: str) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    while asyncio.get_running_loop().time() < deadline:
        state = await rt.load_state(execution_id)
        if state is not None and state.status is not ExecutionStatus.RUNNING:
            return
        await rt.store.wait_for_append(
            execution_id, state.last_sequence if state else -1, timeout=1
        )
    raise AssertionError(f"{execution_id} did not settle")


def _downgrade_sqlite(path: Path) -> None:
    """Make the file exactly what the code before the index wrote: schema version 1."""
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE loom_executions")
    conn.execute("DROP TABLE loom_blobs")  # and what later versions added
    conn.execute("DROP TABLE loom_leases")
    conn.execute("DROP TABLE loom_mailbox")  # and what version 7 added
    conn.execute("DROP TABLE loom_refs")  # and what version 8 added
    conn.execute("DROP TABLE loom_snapshot_segments")  # and what version 9 added
    sqlite_events_before_rung_10(conn)
    conn.execute("UPDATE loom_meta SET value = '1' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()


async def test_sqlite_migrates_in_place_and_back_fills_the_index(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = SQLiteStore(path)
    statuses = await _populate(store)
    await store.close()
    assert set(statuses.values()) == {
        ExecutionStatus.COMPLETED,
        ExecutionStatus.SUSPENDED,
        ExecutionStatus.FAILED,
    }
    _downgrade_sqlite(path)
    with pytest.raises(SchemaVersionError, match="never migrates"):
        SQLiteStore(path, read_only=True)  # an old file is not migrated by a reader

    store = SQLiteStore(path)
    try:
        page = await store.list_executions(ExecutionQuery(limit=100))
        assert {s.execution_id: s.status for s in page.items} == statuses
        suspended = [s for s in page.items if s.status is ExecutionStatus.SUSPENDED]
        assert suspended and all(s.waiting_for == "approve" for s in suspended)
        assert all(s.flow_id == "gated" for s in page.items)
        cursors = [c.cursor for c in await store.changes(0)]
        assert sorted(cursors) == list(range(1, len(statuses) + 1))
        # New writes continue the feed after the back-filled cursors.
        rt = loom.WorkflowRuntime(store)
        rt.register(gated)
        await rt.start(gated, 1, execution_id="new")
        await _settle(rt, "new")
        await rt.close()  # closes the store too
        store = SQLiteStore(path)
        new = await store.get_summary("new")
        assert new is not None and new.cursor > max(cursors)
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM loom_meta").fetchone() == (str(SCHEMA_VERSION),)
    conn.close()


async def test_a_corrupt_old_log_stops_the_migration_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = SQLiteStore(path)
    await _populate(store)
    await store.close()
    _downgrade_sqlite(path)
    conn = sqlite3.connect(path)
    conn.execute(
        "UPDATE loom_events SET payload = '{}' WHERE execution_id = 'old-1' AND sequence = 0"
    )
    conn.commit()
    conn.close()
    with pytest.raises(loom.errors.StorageError, match="old-1") as info:
        SQLiteStore(path)
    assert info.value.execution_id == "old-1"
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM loom_meta").fetchone() == ("1",)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "loom_executions" not in tables
    conn.close()


def _not_loom(path: Path) -> bytes:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize("read_only", [True, False])
def test_a_file_that_is_not_a_loom_database_is_refused_untouched(
    tmp_path: Path, read_only: bool
) -> None:
    other = tmp_path / "app.db"
    before = _not_loom(other)
    with pytest.raises(NotALoomDatabaseError, match="not a Loom one"):
        SQLiteStore(other, read_only=read_only)
    assert other.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # no -wal, no -shm
    garbage = tmp_path / "notes.txt"
    garbage.write_bytes(b"these are not the pages you are looking for" * 200)
    with pytest.raises(NotALoomDatabaseError):
        SQLiteStore(garbage, read_only=read_only)
    assert garbage.read_bytes() == b"these are not the pages you are looking for" * 200


async def test_read_only_sqlite_reads_and_never_writes(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(NotALoomDatabaseError, match="does not exist"):
        SQLiteStore(missing, read_only=True)
    with pytest.raises(NotALoomDatabaseError):
        SQLiteStore(missing, create=False)
    assert not missing.exists()

    path = tmp_path / "loom.db"
    writer = SQLiteStore(path)
    statuses = await _populate(writer)
    await writer.close()
    reader = await open_store(f"sqlite:///{path}", read_only=True)
    try:
        assert isinstance(reader, SQLiteStore) and reader.read_only
        count = await reader.count_executions(ExecutionQuery(statuses=["suspended"]))
        assert count == sum(s is ExecutionStatus.SUSPENDED for s in statuses.values())
        assert len(await reader.read("old-0")) > 2
        with pytest.raises(StorageWriteError, match="read-only"):
            await reader.acquire_fence("old-0")
        assert await reader.current_fence("old-0") == 1
    finally:
        await reader.close()


async def test_open_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rel = await open_store("sqlite:///rel.db")
    bare = await open_store(tmp_path / "bare.db")
    absolute = await open_store(f"sqlite:///{tmp_path}/abs.db")
    for store in (rel, bare, absolute):
        await store.close()
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["abs.db", "bare.db", "rel.db"]
    with pytest.raises(ConfigurationError, match="scheme"):
        await open_store("mysql://x/y")
    with pytest.raises(ConfigurationError):
        await open_store("")


def test_a_postgres_url_without_the_extra_never_becomes_a_file(tmp_path: Path) -> None:
    # A child process where psycopg cannot be imported: the URL must fail as configuration,
    # not create a SQLite file named after it.
    code = (
        "import sys, asyncio\n"
        "sys.modules['psycopg'] = None\n"
        "from loom.storage import open_store\n"
        "from loom.errors import ConfigurationError\n"
        "try:\n"
        "    asyncio.run(open_store('postgresql://u@127.0.0.1:1/db'))\n"
        "except ConfigurationError as e:\n"
        "    print('refused:', e.hint)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert "refused: pip install 'loom-runtime[postgres]'" in out.stdout, out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.postgres
async def test_postgres_migrates_in_place_and_back_fills_the_index(tmp_path: Path) -> None:
    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        store = await open_store(f"{dsn}?schema={schema}")
        statuses = await _populate(store)
        await store.close()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f'DROP TABLE "{schema}".executions')
            await conn.execute(f'DROP SEQUENCE "{schema}".executions_cursor')
            await conn.execute(f'DROP TABLE "{schema}".blobs')  # and what later versions added
            await conn.execute(f'DROP TABLE "{schema}".leases')
            await conn.execute(f'DROP TABLE "{schema}".mailbox')  # and what version 7 added
            await conn.execute(f'DROP TABLE "{schema}".refs')  # and what version 8 added
            await conn.execute(f'DROP TABLE "{schema}".snapshot_segments')  # version 9
            await pg_events_before_rung_10(conn, f'"{schema}"')  # version 10
            await conn.execute(f"UPDATE \"{schema}\".meta SET value = '2'")
        with pytest.raises(SchemaVersionError, match="never migrates"):
            await open_store(f"{dsn}?schema={schema}", read_only=True)
        store = await open_store(f"{dsn}?schema={schema}")
        try:
            page = await store.list_executions(ExecutionQuery(limit=100))
            assert {s.execution_id: s.status for s in page.items} == statuses
            cursors = sorted(c.cursor for c in await store.changes(0))
            assert cursors == list(range(1, len(statuses) + 1))
            rt = loom.WorkflowRuntime(store)
            rt.register(gated)
            await rt.start(gated, 1, execution_id="new")
            await _settle(rt, "new")
            await rt.close()  # closes the store too
            store = await open_store(f"{dsn}?schema={schema}")
            new = await store.get_summary("new")
            assert new is not None and new.cursor > max(cursors)
        finally:
            await store.close()
        reader = await open_store(f"{dsn}?schema={schema}", read_only=True)
        try:
            assert await reader.count_executions(ExecutionQuery()) == len(statuses) + 1
            with pytest.raises(StorageWriteError, match="read-only"):
                await reader.acquire_fence("x")
        finally:
            await reader.close()
    with pytest.raises(NotALoomDatabaseError, match="does not exist"):
        await open_store(f"{dsn}?schema=loom_no_such_schema_here", read_only=True)
    assert not os.listdir(tmp_path)
