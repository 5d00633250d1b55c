"""SQLiteStore's SQL for the event log and the execution index: the statements and the
row helpers its writer runs inside one ``BEGIN IMMEDIATE`` transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from loom.errors import DuplicateEnvelopeIdError, ExecutionEndedError
from loom.model import Envelope, SummaryChange
from loom.storage._common import TERMINAL_SQL, ended
from loom.storage._index import SUMMARY_COLUMNS, summary_values

__all__ = [
    "INSERT_EVENT",
    "LAST_SEQUENCE",
    "append_check",
    "ended_refusal",
    "event_row",
    "insert_or_undo",
    "next_sequence_of",
    "write_index",
    "write_indexes",
]

# One writer at a time (BEGIN IMMEDIATE, across processes) makes max + 1 a commit-ordered
# change cursor: no reader of the feed can ever find a later commit below a cursor it has seen.
_NEXT_CURSOR = "(SELECT coalesce(max(cursor), 0) + 1 FROM loom_executions)"

# A start sets every field (forked_from survives a fork record written before it); any later
# change sets status, waiting-for and the time. Both are upserts, so the row exists whatever
# the order (that is SummaryChange.apply with the previous row read by SQLite).
_INDEX_START = (
    f"INSERT INTO loom_executions ({SUMMARY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
    f"{_NEXT_CURSOR}) ON CONFLICT (execution_id) DO UPDATE SET flow_id = excluded.flow_id, "
    "flow_version = excluded.flow_version, status = excluded.status, "
    "waiting_for = excluded.waiting_for, parent_id = excluded.parent_id, "
    "forked_from = coalesce(excluded.forked_from, loom_executions.forked_from), "
    "created_at = excluded.created_at, updated_at = excluded.updated_at, "
    "cursor = excluded.cursor"
)
_INDEX_CHANGE = (
    f"INSERT INTO loom_executions ({SUMMARY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
    f"{_NEXT_CURSOR}) ON CONFLICT (execution_id) DO UPDATE SET status = excluded.status, "
    "waiting_for = excluded.waiting_for, "
    "forked_from = coalesce(excluded.forked_from, loom_executions.forked_from), "
    "updated_at = excluded.updated_at, cursor = excluded.cursor"
)
# A change that does not move the status (only a fork record).
_INDEX_MARK = (
    f"INSERT INTO loom_executions ({SUMMARY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
    f"{_NEXT_CURSOR}) ON CONFLICT (execution_id) DO UPDATE SET "
    "forked_from = coalesce(excluded.forked_from, loom_executions.forked_from), "
    "updated_at = excluded.updated_at, cursor = excluded.cursor"
)


def write_index(conn: sqlite3.Connection, change: SummaryChange) -> None:
    conn.execute(
        _INDEX_START if change.started else _INDEX_MARK if change.status is None else _INDEX_CHANGE,
        summary_values(change.apply(None)),
    )


def write_indexes(conn: sqlite3.Connection, changes: list[SummaryChange]) -> None:
    """:func:`write_index` for many executions (one ``executemany`` per kind of change)."""
    by_kind: dict[str, list[tuple[Any, ...]]] = {}
    for change in changes:
        sql = (
            _INDEX_START
            if change.started
            else _INDEX_MARK
            if change.status is None
            else (_INDEX_CHANGE)
        )
        by_kind.setdefault(sql, []).append(summary_values(change.apply(None)))
    for sql, rows in by_kind.items():
        conn.executemany(sql, rows)


INSERT_EVENT = (
    "INSERT INTO loom_events (execution_id, sequence, envelope_id, type, payload, recorded_at,"
    " fence, checksum) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


# The events' primary key ends in the sequence: max() is one seek to the end of the range.
LAST_SEQUENCE = "SELECT max(sequence) FROM loom_events WHERE execution_id = ?"


def next_sequence_of(conn: sqlite3.Connection, execution_id: str) -> int:
    row = conn.execute(LAST_SEQUENCE, (execution_id,)).fetchone()
    return 0 if row is None or row[0] is None else int(row[0]) + 1


# What an append must check, in ONE statement: the head's fence (NULL: no head) and the tail
# event (its sequence gives the next one; its type says whether the log already ended). Each
# scalar subquery is one seek (the heads' primary key; the end of the events' primary-key
# range, twice on the same page); three of them cost ~30% less CPU than one LEFT JOIN onto a
# LIMIT subquery, which SQLite runs as a co-routine (bench.sqlite_step has both).
APPEND_CHECK = (
    "SELECT (SELECT fence FROM loom_heads WHERE execution_id = ?1), "
    "(SELECT sequence FROM loom_events WHERE execution_id = ?1 ORDER BY sequence DESC LIMIT 1), "
    "(SELECT type FROM loom_events WHERE execution_id = ?1 ORDER BY sequence DESC LIMIT 1)"
)


def append_check(conn: sqlite3.Connection, execution_id: str) -> tuple[int, int, str | None]:
    """(current fence or 0, next sequence, the last event's type or None when empty)."""
    fence, last, last_type = conn.execute(APPEND_CHECK, (execution_id,)).fetchone()
    return (
        0 if fence is None else int(fence),
        0 if last is None else int(last) + 1,
        None if last_type is None else str(last_type),
    )


def ended_refusal(
    conn: sqlite3.Connection, execution_id: str, first: int
) -> ExecutionEndedError | None:
    row = conn.execute(
        f"SELECT type FROM loom_events WHERE execution_id = ? AND sequence = ? "
        f"AND type IN ({TERMINAL_SQL})",
        (execution_id, first - 1),
    ).fetchone()
    return None if row is None else ended(execution_id, str(row[0]))


def event_row(e: Envelope) -> tuple[Any, ...]:
    """The stored row; a derived envelope id is stored empty (see ``derived_envelope_id``),
    so a plain step writes the events table's B-tree and no index (schema rung 10)."""
    eid = e.envelope_id
    return (
        e.execution_id,
        e.sequence,
        "" if eid == f"{e.execution_id}#{e.sequence}.{e.fence}" else eid,
        str(e.type),
        e.payload_json,
        e.recorded_at,
        e.fence,
        e.checksum(),
    )


def insert_or_undo(
    conn: sqlite3.Connection,
    execution_id: str,
    rows: list[tuple[Any, ...]],
    first: int,
    undo_head: Callable[[], object],
) -> None:
    """Insert a request's events; on a duplicate envelope id undo exactly this request's
    writes (the sequences were free: the events table said so, and the transaction still holds
    the write lock), so that the refusal leaves nothing behind for the rest of the batch."""
    try:
        if len(rows) == 1:
            conn.execute(INSERT_EVENT, rows[0])
        else:
            conn.executemany(INSERT_EVENT, rows)
    except sqlite3.IntegrityError as exc:
        conn.execute(
            "DELETE FROM loom_events WHERE execution_id = ? AND sequence >= ? AND sequence < ?",
            (execution_id, first, first + len(rows)),
        )
        undo_head()
        raise DuplicateEnvelopeIdError(
            f"an envelope id of this batch is already stored ({exc})", execution_id=execution_id
        ) from exc
