"""SQLiteStore's schema: the migration ladder (shared version numbers, see ``_schema``).

:func:`migrate` creates a fresh file or climbs an existing one rung by rung inside ONE
``BEGIN IMMEDIATE`` transaction, so another process opening the same file waits and then finds
the schema complete. A rung is a tuple of steps: SQL text, or a function of the connection
(the index back-fill reads the existing logs).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

from loom.errors import NotALoomDatabaseError, SchemaVersionError
from loom.model._summary import SUMMARY_EVENT_TYPES
from loom.storage._common import RESERVED_KEY, reserved_ids
from loom.storage._index import SUMMARY_COLUMNS, backfill_rows
from loom.storage._schema import SCHEMA_VERSION

__all__ = ["MIGRATIONS", "check_readable", "load_reserved", "migrate"]

Step = str | Callable[[sqlite3.Connection, str], None]

_V1 = (
    "CREATE TABLE loom_heads (execution_id TEXT PRIMARY KEY, fence INTEGER NOT NULL,"
    " next_sequence INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE loom_events (execution_id TEXT NOT NULL, sequence INTEGER NOT NULL,"
    " envelope_id TEXT NOT NULL UNIQUE, type TEXT NOT NULL, payload TEXT NOT NULL,"
    " recorded_at REAL NOT NULL, fence INTEGER NOT NULL, checksum TEXT NOT NULL,"
    " PRIMARY KEY (execution_id, sequence)) WITHOUT ROWID",
    "CREATE TABLE loom_timers (execution_id TEXT NOT NULL, position INTEGER NOT NULL,"
    " fire_at REAL NOT NULL, kind TEXT NOT NULL, flow_id TEXT NOT NULL DEFAULT '',"
    " claimed_by TEXT, claimed_until REAL NOT NULL DEFAULT 0,"
    " PRIMARY KEY (execution_id, position)) WITHOUT ROWID",
    "CREATE INDEX loom_timers_due ON loom_timers (fire_at)",
    "CREATE TABLE loom_snapshots (execution_id TEXT PRIMARY KEY, sequence INTEGER NOT NULL,"
    " state TEXT NOT NULL, checksum TEXT NOT NULL) WITHOUT ROWID",
)


def _backfill(conn: sqlite3.Connection, where: str) -> None:
    marks = ", ".join("?" for _ in SUMMARY_EVENT_TYPES)
    events = conn.execute(
        "SELECT execution_id, envelope_id, sequence, type, payload, recorded_at, fence, checksum"
        f" FROM loom_events WHERE type IN ({marks}) ORDER BY execution_id, sequence",
        sorted(SUMMARY_EVENT_TYPES),
    )
    rows = backfill_rows(events, where)
    conn.executemany(
        f"INSERT INTO loom_executions ({SUMMARY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )


# The listing indexes end in (created_at, execution_id): the keyset order, so a page is one
# index range read. The cursor index serves the change feed and the next cursor (max + 1).
_V3: tuple[Step, ...] = (
    "CREATE TABLE loom_executions (execution_id TEXT PRIMARY KEY, flow_id TEXT NOT NULL,"
    " flow_version TEXT NOT NULL, status TEXT NOT NULL, waiting_for TEXT, parent_id TEXT,"
    " forked_from TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL,"
    " cursor INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE UNIQUE INDEX loom_executions_cursor ON loom_executions (cursor)",
    "CREATE INDEX loom_executions_created ON loom_executions (created_at, execution_id)",
    "CREATE INDEX loom_executions_status ON loom_executions (status, created_at, execution_id)",
    "CREATE INDEX loom_executions_flow ON loom_executions (flow_id, created_at, execution_id)",
    "CREATE INDEX loom_executions_flow_status ON loom_executions"
    " (flow_id, status, created_at, execution_id)",
    "CREATE INDEX loom_executions_parent ON loom_executions (parent_id)"
    " WHERE parent_id IS NOT NULL",
    "CREATE INDEX loom_executions_forked ON loom_executions (forked_from)"
    " WHERE forked_from IS NOT NULL",
    _backfill,
)

# Content-addressed blobs (agents' messages): the BlobStore side.
_V4: tuple[Step, ...] = (
    "CREATE TABLE loom_blobs (namespace TEXT NOT NULL, hash TEXT NOT NULL, data BLOB NOT NULL,"
    " PRIMARY KEY (namespace, hash)) WITHOUT ROWID",
)

# Liveness leases (see loom.storage.LeaseStore): one row per execution being driven.
_V6: tuple[Step, ...] = (
    "CREATE TABLE loom_leases (execution_id TEXT PRIMARY KEY, holder TEXT NOT NULL,"
    " fence INTEGER NOT NULL, expires_at REAL NOT NULL) WITHOUT ROWID",
)

# The mailbox: messages wait here until a gate consumes them (the log records which one did).
_V7: tuple[Step, ...] = (
    "CREATE TABLE loom_mailbox (execution_id TEXT NOT NULL, message_id TEXT NOT NULL,"
    " seq INTEGER NOT NULL, event_type TEXT NOT NULL, payload TEXT NOT NULL,"
    " sent_at REAL NOT NULL, consumed INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (execution_id, message_id)) WITHOUT ROWID",
    "CREATE INDEX loom_mailbox_pending ON loom_mailbox (execution_id, event_type, consumed, seq)",
)

# Branch refs (see loom.storage.BranchRegistry): one row per name; a move is a conditional
# UPDATE inside the write transaction.
_V8: tuple[Step, ...] = (
    "CREATE TABLE loom_refs (name TEXT PRIMARY KEY, execution_id TEXT NOT NULL,"
    " tip INTEGER NOT NULL, forked_from TEXT, fork_sequence INTEGER,"
    " version INTEGER NOT NULL, updated_at REAL NOT NULL, updated_by TEXT,"
    " promoted_from TEXT, reason TEXT) WITHOUT ROWID",
)

# Snapshot segments (see loom.storage.SnapshotSegments): the rows on top of loom_snapshots' whole
# state, each holding what changed since ``base``; a whole snapshot deletes those it covers.
_V9: tuple[Step, ...] = (
    "CREATE TABLE loom_snapshot_segments (execution_id TEXT NOT NULL,"
    " sequence INTEGER NOT NULL, base INTEGER NOT NULL, state TEXT NOT NULL,"
    " checksum TEXT NOT NULL, PRIMARY KEY (execution_id, sequence)) WITHOUT ROWID",
)

_EVENTS_V10 = (
    "CREATE TABLE loom_events (execution_id TEXT NOT NULL, sequence INTEGER NOT NULL,"
    " envelope_id TEXT NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL,"
    " recorded_at REAL NOT NULL, fence INTEGER NOT NULL, checksum TEXT NOT NULL,"
    " PRIMARY KEY (execution_id, sequence)) WITHOUT ROWID"
)


def _lean_events(conn: sqlite3.Connection, where: str) -> None:
    """Rung 10: derived envelope ids are stored empty and only explicit ids are indexed.

    The column-level UNIQUE of rung 1 is an automatic index that no DDL drops, so the table is
    rebuilt: rows are copied in key order with a record's own derived id emptied (every other
    id verbatim; the checksums cover the rebuilt id, so they still verify), then the partial
    index takes over the explicit ids' uniqueness. Explicit ids of the derived form of another
    record (refused since this rung) are kept in loom_meta: see ``_common.reserved_ids``."""
    reserved = reserved_ids(
        conn.execute(
            "SELECT envelope_id, execution_id, sequence, fence FROM loom_events "
            "WHERE envelope_id GLOB '*#[0-9]*.[0-9]*'"
        )
    )
    conn.execute("ALTER TABLE loom_events RENAME TO loom_events_v9")
    conn.execute(_EVENTS_V10)
    conn.execute(
        "INSERT INTO loom_events (execution_id, sequence, envelope_id, type, payload,"
        " recorded_at, fence, checksum) SELECT execution_id, sequence, CASE WHEN envelope_id ="
        " execution_id || '#' || sequence || '.' || fence THEN '' ELSE envelope_id END, type,"
        " payload, recorded_at, fence, checksum FROM loom_events_v9 ORDER BY execution_id,"
        " sequence"
    )
    conn.execute("DROP TABLE loom_events_v9")
    if reserved:
        conn.execute(
            "INSERT INTO loom_meta (key, value) VALUES (?, ?)", (RESERVED_KEY, json.dumps(reserved))
        )


# A plain step's row carries an empty id, so it never touches this index.
_V10: tuple[Step, ...] = (
    _lean_events,
    "CREATE UNIQUE INDEX loom_events_envelope_id ON loom_events (envelope_id)"
    " WHERE envelope_id <> ''",
)

#: Steps that take a database from version N-1 to N.
MIGRATIONS: dict[int, tuple[Step, ...]] = {
    1: _V1,
    2: (),
    3: _V3,
    4: _V4,
    5: (),
    6: _V6,
    7: _V7,
    8: _V8,
    9: _V9,
    10: _V10,
    11: (),  # watched heads: PostgreSQL's LISTEN/NOTIFY only
}


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _version(conn: sqlite3.Connection, where: str) -> int:
    """The file's schema version: 0 for an empty file; refuses a file that is not Loom's."""
    tables = _tables(conn)
    if "loom_meta" not in tables:
        if tables:
            raise NotALoomDatabaseError(
                f"{where} is an SQLite database but not a Loom one (it has tables "
                f"{', '.join(sorted(tables)[:5])} and no loom_meta); nothing was changed",
                hint="Point --db/--store at a Loom database, or at a new file",
            )
        return 0
    row = conn.execute("SELECT value FROM loom_meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        raise NotALoomDatabaseError(f"{where} has a loom_meta table without a schema version")
    version = int(row[0])
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} has Loom schema version {version}; this Loom reads up to {SCHEMA_VERSION}"
        )
    return version


def migrate(conn: sqlite3.Connection, where: str) -> int:
    """Create or upgrade the schema to :data:`SCHEMA_VERSION` atomically; return the version
    the file had (0: new)."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.DatabaseError as exc:
        raise NotALoomDatabaseError(f"{where} is not an SQLite database ({exc})") from exc
    try:
        try:
            version = _version(conn, where)
        except sqlite3.DatabaseError as exc:
            raise NotALoomDatabaseError(f"{where} is not an SQLite database ({exc})") from exc
        if version < SCHEMA_VERSION:
            if version == 0:
                conn.execute("CREATE TABLE loom_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for step in MIGRATIONS[target]:
                    if isinstance(step, str):
                        conn.execute(step)
                    else:
                        step(conn, where)
            conn.execute(
                "INSERT INTO loom_meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )
        conn.execute("COMMIT")
        return version
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def load_reserved(conn: sqlite3.Connection) -> frozenset[str]:
    """The reserved envelope ids rung 10 found (almost always none)."""
    row = conn.execute("SELECT value FROM loom_meta WHERE key = ?", (RESERVED_KEY,)).fetchone()
    return frozenset() if row is None else frozenset(json.loads(row[0]))


def check_readable(conn: sqlite3.Connection, where: str) -> None:
    """For a read-only opening: the file must be a Loom database at this version."""
    try:
        version = _version(conn, where)
    except sqlite3.DatabaseError as exc:
        raise NotALoomDatabaseError(f"{where} is not an SQLite database ({exc})") from exc
    if version == 0:
        raise NotALoomDatabaseError(f"{where} is empty: no Loom database was created there")
    if version < SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} has Loom schema version {version}; reading it needs version "
            f"{SCHEMA_VERSION}, and a read-only opening never migrates",
            hint="Open it once for writing (any Loom command that writes, or "
            "open_store(url)) to migrate it in place, then read it again",
        )
