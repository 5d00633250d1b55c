"""Events tables as schema rungs 1-9 wrote them, for migration tests that set a database back.

Before rung 10 every envelope id was stored whole and ``envelope_id`` carried a column-level
UNIQUE (an automatic index on SQLite, the ``events_envelope_id_key`` constraint on
PostgreSQL). These rebuild that shape, filling in the ids rung 10 stored empty.
"""

from __future__ import annotations

import sqlite3

import psycopg

__all__ = ["PG_EVENTS_BEFORE_RUNG_10", "sqlite_events_before_rung_10"]

# A stored empty id is its record's derived id (execution#sequence.fence).
_WHOLE_ID = (
    "CASE WHEN envelope_id = '' THEN execution_id || '#' || sequence || '.' || fence "
    "ELSE envelope_id END"
)


def sqlite_events_before_rung_10(conn: sqlite3.Connection) -> None:
    conn.execute("DROP INDEX loom_events_envelope_id")
    conn.execute("ALTER TABLE loom_events RENAME TO loom_events_lean")
    conn.execute(
        "CREATE TABLE loom_events (execution_id TEXT NOT NULL, sequence INTEGER NOT NULL,"
        " envelope_id TEXT NOT NULL UNIQUE, type TEXT NOT NULL, payload TEXT NOT NULL,"
        " recorded_at REAL NOT NULL, fence INTEGER NOT NULL, checksum TEXT NOT NULL,"
        " PRIMARY KEY (execution_id, sequence)) WITHOUT ROWID"
    )
    conn.execute(
        f"INSERT INTO loom_events SELECT execution_id, sequence, {_WHOLE_ID}, type, payload,"
        " recorded_at, fence, checksum FROM loom_events_lean"
    )
    conn.execute("DROP TABLE loom_events_lean")


#: Statements (``{s}``: the quoted schema) that set PostgreSQL's events table back (and undo
#: rung 11's columns on the heads, which every database set back to before rung 10 must lack).
PG_EVENTS_BEFORE_RUNG_10 = (
    "ALTER TABLE {s}.heads DROP COLUMN watched",
    "ALTER TABLE {s}.heads DROP COLUMN ended",
    "DROP INDEX {s}.events_envelope_id",
    f"UPDATE {{s}}.events SET envelope_id = {_WHOLE_ID} WHERE envelope_id = ''",
    "ALTER TABLE {s}.events ADD CONSTRAINT events_envelope_id_key UNIQUE (envelope_id)",
)


async def pg_events_before_rung_10(
    conn: psycopg.AsyncConnection[tuple[object, ...]], s: str
) -> None:
    for statement in PG_EVENTS_BEFORE_RUNG_10:
        await conn.execute(statement.format(s=s))
