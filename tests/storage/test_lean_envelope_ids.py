"""Derived envelope ids (schema rung 10): a record carrying its own derived id
(``execution#sequence.fence``) is stored with an empty id and read back whole, explicit ids keep
their uniqueness through a partial index, an explicit id of the derived form is refused on every
store, and a rung-9 database migrates with its ids and refusals intact."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

import loom
from loom.errors import CorruptEventError, DuplicateEnvelopeIdError
from loom.model import (
    Envelope,
    EventType,
    derived_envelope_id,
    has_derived_form,
    new_envelope_id,
)
from loom.storage import SQLiteStore, Store
from loom.storage.postgres import PostgresStore
from loom.testing._store_conformance import env
from tests.conftest import WITH_TENANT, Backend
from tests.support.old_schema import pg_events_before_rung_10, sqlite_events_before_rung_10
from tests.support.pg import require_pg, temp_schema


def test_the_derived_form() -> None:
    assert derived_envelope_id("a#1.2", 3, 4) == "a#1.2#3.4"
    assert has_derived_form("a#1.2#3.4") and has_derived_form("#0.1")
    for explicit in ("0123abcd", "x#05.1", "x#5.01", "x#5", "x#5.", "x#-1.2", "x#٣.1", "x#1.2\n"):
        assert not has_derived_form(explicit), explicit
    e = env("x", 3, 2)
    assert e.envelope_id == "x#3.2" and env("x", 3, 2, envelope_id="mine").envelope_id == "mine"


@pytest.fixture(params=WITH_TENANT)
async def any_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "postgres":
        dsn = require_pg()
        async with temp_schema(dsn) as schema:
            b = Backend("postgres", dsn, schema)
            try:
                yield b
            finally:
                await b.close()
        return
    b = Backend(request.param, str(tmp_path / "loom.db"))
    try:
        yield b
    finally:
        await b.close()


async def test_an_explicit_id_of_the_derived_form_is_refused(any_backend: Backend) -> None:
    store = any_backend.store()
    fence = await store.acquire_fence("x")
    await store.append([env("x", 0, fence)])
    # Another record's derived id, written or not yet: refused before anything is written,
    # whatever else is wrong with the append.
    for forged in (f"x#0.{fence}", f"x#2.{fence}", "y#0.1", f"x#1.{fence + 1}"):
        err = await _refused(store.append([env("x", 1, fence, envelope_id=forged)]))
        assert err.execution_id == "x" and forged in err.message, err
        if forged != f"x#1.{fence + 1}":  # (that one is the take-over's own id)
            err = await _refused(
                store.take_over([env("x", 1, fence + 1, envelope_id=forged)], from_fence=fence)
            )
            assert err.execution_id == "x", err
    await _refused(store.append([env("x", 5, fence, envelope_id="y#0.1")]))  # not a gap
    assert [e.sequence for e in await store.read("x")] == [0]
    assert await store.current_fence("x") == fence
    with pytest.raises(ValueError, match="non-empty"):
        await store.append([_with_id(env("x", 1, fence), "")])
    # Its own derived id, given explicitly, is just the default; a plain explicit id is kept.
    await store.append([env("x", 1, fence, envelope_id=f"x#1.{fence}")])
    await store.append([env("x", 2, fence, envelope_id="explicit-2")])
    got = await store.read("x")
    assert [e.envelope_id for e in got] == [f"x#0.{fence}", f"x#1.{fence}", "explicit-2"]
    await _refused(store.append([env("x", 3, fence, envelope_id="explicit-2")]))
    # A later reader (another process) rebuilds the same ids.
    again = any_backend.store()
    assert [e.envelope_id for e in await again.read("x")] == [e.envelope_id for e in got]


async def _refused(aw: Any) -> DuplicateEnvelopeIdError:
    with pytest.raises(DuplicateEnvelopeIdError) as info:
        await aw
    return info.value


def _with_id(e: Envelope, envelope_id: str) -> Envelope:
    return dataclasses.replace(e, envelope_id=envelope_id)


async def test_sqlite_stores_a_derived_id_empty_and_indexes_only_explicit_ids(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lean.db"
    store = SQLiteStore(path)
    fence = await store.acquire_fence("x")
    await store.append([env("x", 0, fence), env("x", 1, fence, envelope_id="given")])
    await store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT sequence, envelope_id FROM loom_events").fetchall() == [
            (0, ""),
            (1, "given"),
        ]
        indexes = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'loom_events'"
        ).fetchall()
        assert indexes == [
            (
                "loom_events_envelope_id",
                "CREATE UNIQUE INDEX loom_events_envelope_id ON loom_events (envelope_id)"
                " WHERE envelope_id <> ''",
            )
        ]
        # The checksum covers the rebuilt id: a record moved to another fence (or sequence)
        # no longer verifies.
        with conn:
            conn.execute("UPDATE loom_events SET fence = fence + 1 WHERE sequence = 0")
    finally:
        conn.close()
    store = SQLiteStore(path)
    try:
        with pytest.raises(CorruptEventError, match="checksum"):
            await store.read("x")
    finally:
        await store.close()


async def test_postgres_stores_a_derived_id_empty() -> None:
    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        store = await PostgresStore.open(dsn, schema=schema)
        try:
            fence = await store.acquire_fence("x")
            await store.append([env("x", 0, fence)])
            await store.append([env("x", 1, fence), env("x", 2, fence, envelope_id="given")])
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                cur = await conn.execute(
                    f'SELECT sequence, envelope_id FROM "{schema}".events ORDER BY sequence'
                )
                assert await cur.fetchall() == [(0, ""), (1, ""), (2, "given")]
                cur = await conn.execute(
                    "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass",
                    (f'"{schema}".events',),
                )
                assert [r[0] for r in await cur.fetchall()] == ["events_pkey"]
            got = await store.read("x")
            assert [e.envelope_id for e in got] == [f"x#0.{fence}", f"x#1.{fence}", "given"]
        finally:
            await store.close()


def _old_rows() -> list[Envelope]:
    """What rung 9 stored: random ids, an explicit one, one equal to its own derived id, and
    one of the derived form of a record that does not exist yet ("late", 0, fence 1)."""
    return [
        env("old", 0, 1, envelope_id=new_envelope_id()),
        env("old", 1, 1, envelope_id="explicit-old"),
        env("old", 2, 1, envelope_id="old#2.1"),
        _with_id(env("old", 3, 1), "late#0.1"),
    ]


def _row(e: Envelope) -> tuple[Any, ...]:
    return (
        e.execution_id,
        e.sequence,
        e.envelope_id,
        str(e.type),
        e.payload_json,
        e.recorded_at,
        e.fence,
        e.checksum(),
    )


async def _check_migrated(store: Store, old: list[Envelope]) -> None:
    got = await store.read("old")
    assert [(e.envelope_id, e.checksum()) for e in got] == [
        (e.envelope_id, e.checksum()) for e in old
    ]
    fence = await store.acquire_fence("new")
    for taken in (old[0].envelope_id, "explicit-old"):  # explicit ids stay unique
        await _refused(store.append([env("new", 0, fence, envelope_id=taken)]))
    # The derived id an old record already carries is a duplicate too, written or taken over.
    late = await store.acquire_fence("late")
    assert late == 1
    await _refused(store.append([env("late", 0, late)]))
    await _refused(store.take_over([env("late", 0, 1)], from_fence=0))
    await store.append([env("new", 0, fence), env("new", 1, fence)])
    assert [e.envelope_id for e in await store.read("new")] == [f"new#0.{fence}", f"new#1.{fence}"]


async def test_a_rung_9_sqlite_file_migrates_with_its_ids_and_refusals(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    await SQLiteStore(path).close()
    old = _old_rows()
    conn = sqlite3.connect(path)
    with conn:
        sqlite_events_before_rung_10(conn)
        conn.execute("UPDATE loom_meta SET value = '9' WHERE key = 'schema_version'")
        conn.execute("INSERT INTO loom_heads VALUES ('old', 1, 4)")
        conn.executemany("INSERT INTO loom_events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", map(_row, old))
    conn.close()
    store = SQLiteStore(path)
    try:
        await _check_migrated(store, old)
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute(
            "SELECT sequence, envelope_id FROM loom_events WHERE execution_id = 'old'"
        ).fetchall() == [(0, old[0].envelope_id), (1, "explicit-old"), (2, ""), (3, "late#0.1")]
        assert conn.execute(
            "SELECT value FROM loom_meta WHERE key = 'reserved_envelope_ids'"
        ).fetchone() == (json.dumps(["late#0.1"]),)
        assert not conn.execute(
            "SELECT name FROM sqlite_master WHERE name LIKE 'sqlite_autoindex_loom_events%'"
        ).fetchall()
    finally:
        conn.close()
    again = SQLiteStore(path)  # the reserved id outlives the opening that migrated
    try:
        await _refused(again.append([env("late", 0, 1)]))
    finally:
        await again.close()


async def test_a_rung_9_postgres_schema_migrates_with_its_ids_and_refusals() -> None:
    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        await (await PostgresStore.open(dsn, schema=schema)).close()
        old = _old_rows()
        s = f'"{schema}"'
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await pg_events_before_rung_10(conn, s)
            await conn.execute(f"UPDATE {s}.meta SET value = '9' WHERE key = 'schema_version'")
            await conn.execute(f"INSERT INTO {s}.heads VALUES ('old', 1, 4)")
            async with conn.cursor() as cur:
                await cur.executemany(
                    f"INSERT INTO {s}.events (execution_id, sequence, envelope_id, type, payload,"
                    " recorded_at, fence, checksum) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    [_row(e) for e in old],
                )
        store = await PostgresStore.open(dsn, schema=schema)
        try:
            await _check_migrated(store, old)
        finally:
            await store.close()
        again = await PostgresStore.open(dsn, schema=schema)
        try:
            await _refused(again.append([env("late", 0, 1)]))
        finally:
            await again.close()


@loom.step(id="lean-add")
async def _add(x: int) -> int:
    return x + 1


@loom.flow(id="lean-gated")
async def _gated(ctx: loom.WorkflowContext, x: int) -> int:
    y: int = await ctx.run(_add, x)
    decision = await ctx.suspend("Go")
    return y + int(decision["n"]) + await ctx.run(_add, 0)


async def test_a_take_over_writes_random_ids_and_steps_derived_ones(tmp_path: Path) -> None:
    """Racers taking over build the same sequence at the same fence: their records get random
    ids (a lost COMMIT's probe must tell them apart); a step's id is derived."""
    runtime = loom.WorkflowRuntime(SQLiteStore(tmp_path / "loom.db"))
    runtime.register(_gated)
    try:
        handle = await runtime.start(_gated, 1, execution_id="g")
        await handle.wait_for_suspend()
        resumed = await runtime.resume("g", "Go", {"n": 10})
        assert await resumed.result() == 13
        log = await runtime.store.read("g")
    finally:
        await runtime.close()
    # The start and the resume are both take-overs (from fence 0 and from the start's fence).
    taken = [e for e in log if e.type in (EventType.EXECUTION_STARTED, EventType.EXECUTION_RESUMED)]
    assert [e.fence for e in taken] == [1, 2]
    assert not any(has_derived_form(e.envelope_id) for e in taken)
    rest = [e for e in log if e not in taken]
    assert len(rest) == 4
    assert all(e.envelope_id == derived_envelope_id("g", e.sequence, e.fence) for e in rest)
