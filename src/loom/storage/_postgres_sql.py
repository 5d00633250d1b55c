"""PostgresStore's SQL: the versioned schema, its migrations and every statement's text.

The schema lives in its own PostgreSQL schema, versioned in a ``meta`` table. :func:`migrate`
creates it or brings it up to :data:`SCHEMA_VERSION` in ONE transaction under an advisory lock,
so several processes may open it at once and nobody ever sees a half-migrated schema (DDL is
transactional in PostgreSQL). A schema written by a newer Loom is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import psycopg

from loom.errors import NotALoomDatabaseError, SchemaVersionError, StorageError
from loom.model._summary import SUMMARY_EVENT_TYPES
from loom.storage._common import RESERVED_KEY, TERMINAL_SQL, reserved_ids
from loom.storage._index import SUMMARY_COLUMNS, backfill_rows
from loom.storage._schema import SCHEMA_VERSION

__all__ = [
    "MAX_NOTE_BYTES",
    "MIGRATIONS",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "Conn",
    "EventWriteKind",
    "IndexWrite",
    "Statements",
    "check_schema",
    "cursor_lock_key",
    "load_reserved",
    "migrate",
    "migration_lock_key",
    "notify_channel",
    "statements",
]


SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

#: A migration step: SQL text (``{s}`` is the quoted schema) or a function of the connection,
#: the quoted schema and the store's description (the index back-fill reads the logs).
Step = str | Callable[[Conn, str, str], Awaitable[None]]


async def _backfill(conn: Conn, s: str, where: str) -> None:
    cur = await conn.execute(
        "SELECT execution_id, envelope_id, sequence, type, payload, recorded_at, fence, checksum"
        f" FROM {s}.events WHERE type = ANY(%s) ORDER BY execution_id, sequence",
        (sorted(SUMMARY_EVENT_TYPES),),
    )
    rows = backfill_rows(await cur.fetchall(), where)
    if rows:
        async with conn.cursor() as ins:
            await ins.executemany(
                f"INSERT INTO {s}.executions ({SUMMARY_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                rows,
            )
        await conn.execute(f"SELECT setval('{s}.executions_cursor', %s)", (len(rows),))


async def _reserve(conn: Conn, s: str, where: str) -> None:
    """Rung 10: keep the explicit ids of the derived form of another record (see
    ``_common.reserved_ids``) before such ids stop being indexed as derived ones are."""
    cur = await conn.execute(
        f"SELECT envelope_id, execution_id, sequence, fence FROM {s}.events "
        "WHERE envelope_id LIKE '%#%.%'"
    )
    reserved = reserved_ids(await cur.fetchall())
    if reserved:
        await conn.execute(
            f"INSERT INTO {s}.meta (key, value) VALUES (%s, %s)",
            (RESERVED_KEY, json.dumps(reserved)),
        )


async def load_reserved(conn: Conn, schema: str) -> frozenset[str]:
    """The reserved envelope ids rung 10 found (almost always none)."""
    cur = await conn.execute(f'SELECT value FROM "{schema}".meta WHERE key = %s', (RESERVED_KEY,))
    row = await cur.fetchone()
    return frozenset() if row is None else frozenset(json.loads(row[0]))


# Statements that take a database from version N-1 to N. Version 1 creates everything it had. Ids
# are COLLATE "C" so that enumeration order is code-point order, as in every other store.
MIGRATIONS: dict[int, tuple[Step, ...]] = {
    1: (
        'CREATE TABLE {s}.heads (execution_id text COLLATE "C" PRIMARY KEY,'
        " fence bigint NOT NULL, next_sequence bigint NOT NULL)",
        'CREATE TABLE {s}.events (execution_id text COLLATE "C" NOT NULL,'
        ' sequence bigint NOT NULL, envelope_id text COLLATE "C" NOT NULL,'
        " type text NOT NULL, payload text NOT NULL, recorded_at double precision NOT NULL,"
        " fence bigint NOT NULL, checksum text NOT NULL,"
        " CONSTRAINT events_pkey PRIMARY KEY (execution_id, sequence),"
        " CONSTRAINT events_envelope_id_key UNIQUE (envelope_id))",
        'CREATE TABLE {s}.snapshots (execution_id text COLLATE "C" PRIMARY KEY,'
        " sequence bigint NOT NULL, state text NOT NULL, checksum text NOT NULL)",
    ),
    # A claim sets claimed_by/claimed_until (not indexed, so the update can stay HOT); the due
    # index matches the claim's ORDER BY, so a claim reads the first due rows in order.
    2: (
        'CREATE TABLE {s}.timers (execution_id text COLLATE "C" NOT NULL,'
        " position bigint NOT NULL, fire_at double precision NOT NULL, kind text NOT NULL,"
        " flow_id text NOT NULL DEFAULT '', claimed_by text,"
        " claimed_until double precision NOT NULL DEFAULT 0,"
        " CONSTRAINT timers_pkey PRIMARY KEY (execution_id, position))",
        "CREATE INDEX timers_due ON {s}.timers (fire_at, execution_id, position)",
    ),
    # The execution index (see loom.storage._schema). Listing indexes end in the keyset order
    # (created_at, execution_id); the cursor index serves the change feed.
    3: (
        'CREATE TABLE {s}.executions (execution_id text COLLATE "C" PRIMARY KEY,'
        " flow_id text NOT NULL, flow_version text NOT NULL, status text NOT NULL,"
        ' waiting_for text, parent_id text COLLATE "C", forked_from text COLLATE "C",'
        " created_at double precision NOT NULL, updated_at double precision NOT NULL,"
        " cursor bigint NOT NULL)",
        "CREATE SEQUENCE {s}.executions_cursor",
        "CREATE UNIQUE INDEX executions_cursor_idx ON {s}.executions (cursor)",
        "CREATE INDEX executions_created ON {s}.executions (created_at, execution_id)",
        "CREATE INDEX executions_status ON {s}.executions (status, created_at, execution_id)",
        "CREATE INDEX executions_flow ON {s}.executions (flow_id, created_at, execution_id)",
        "CREATE INDEX executions_flow_status ON {s}.executions"
        " (flow_id, status, created_at, execution_id)",
        "CREATE INDEX executions_parent ON {s}.executions (parent_id) WHERE parent_id IS NOT NULL",
        "CREATE INDEX executions_forked ON {s}.executions (forked_from)"
        " WHERE forked_from IS NOT NULL",
        _backfill,
    ),
    # Content-addressed blobs (agents' messages): the BlobStore side.
    4: (
        'CREATE TABLE {s}.blobs (namespace text COLLATE "C" NOT NULL,'
        ' hash text COLLATE "C" NOT NULL, data bytea NOT NULL,'
        " CONSTRAINT blobs_pkey PRIMARY KEY (namespace, hash))",
    ),
    # One B-tree write per step is SQLite's (see loom.storage._schema); PostgreSQL's appends
    # still move the head row, whose lock is what orders them against a fence change.
    5: (),
    # Liveness leases (see loom.storage.LeaseStore): one row per execution being driven.
    6: (
        'CREATE TABLE {s}.leases (execution_id text COLLATE "C" PRIMARY KEY,'
        " holder text NOT NULL, fence bigint NOT NULL, expires_at double precision NOT NULL)",
    ),
    # Messages wait here until a gate consumes them (the log records which one did).
    7: (
        'CREATE TABLE {s}.mailbox (execution_id text COLLATE "C" NOT NULL,'
        ' message_id text COLLATE "C" NOT NULL, seq bigserial, event_type text NOT NULL,'
        " payload text NOT NULL, sent_at double precision NOT NULL,"
        " consumed boolean NOT NULL DEFAULT false,"
        " CONSTRAINT mailbox_pkey PRIMARY KEY (execution_id, message_id))",
        "CREATE INDEX mailbox_pending ON {s}.mailbox (execution_id, event_type, seq)"
        " WHERE NOT consumed",
    ),
    # Branch refs (see loom.storage.BranchRegistry): a move locks the row (FOR UPDATE).
    8: (
        'CREATE TABLE {s}.refs (name text COLLATE "C" PRIMARY KEY,'
        ' execution_id text COLLATE "C" NOT NULL, tip bigint NOT NULL,'
        ' forked_from text COLLATE "C", fork_sequence bigint, version bigint NOT NULL,'
        " updated_at double precision NOT NULL, updated_by text, promoted_from text,"
        " reason text)",
    ),
    # Snapshot segments (see loom.storage.SnapshotSegments), on top of snapshots' whole state.
    9: (
        'CREATE TABLE {s}.snapshot_segments (execution_id text COLLATE "C" NOT NULL,'
        " sequence bigint NOT NULL, base bigint NOT NULL, state text NOT NULL,"
        " checksum text NOT NULL, PRIMARY KEY (execution_id, sequence))",
    ),
    # Lean envelope ids (see loom.storage._schema): a derived id is stored empty and only
    # explicit ids are indexed, so a plain step's insert maintains the primary key alone.
    # Stored ids stay as they are (an explicit id equal to its own record's derived id reads
    # back the same either way).
    10: (
        _reserve,
        "ALTER TABLE {s}.events DROP CONSTRAINT events_envelope_id_key",
        'CREATE UNIQUE INDEX events_envelope_id ON {s}.events (envelope_id COLLATE "C")'
        " WHERE envelope_id <> ''",
    ),
    # Watched and ended heads (see loom.storage._schema): an append notifies only for a watched
    # head, and checks the head's own ended flag instead of looking its tail up in the events.
    # A constant default adds a column without rewriting the table.
    11: (
        "ALTER TABLE {s}.heads ADD COLUMN watched boolean NOT NULL DEFAULT false",
        "ALTER TABLE {s}.heads ADD COLUMN ended boolean NOT NULL DEFAULT false",
        "UPDATE {s}.heads h SET ended = true FROM {s}.events e WHERE e.execution_id = "
        f"h.execution_id AND e.sequence = h.next_sequence - 1 AND e.type IN ({TERMINAL_SQL})",
    ),
}

# One statement per append or take-over. The INSERT reads from the head write's RETURNING, so a
# refused one (0 rows moved) writes nothing and needs no rollback. It returns whether the head
# moved (1 or 0): if it did, every event was inserted (the INSERT runs to completion or the
# statement fails), so the events need no RETURNING of their own. A refused one (rare) reads the
# head afterwards to name its refusal, rather than every append reading it back.
_APPEND = """
WITH {lock}moved AS (
    {moved}
){blobs}, ins AS (
    INSERT INTO {{s}}.events
        (execution_id, sequence, envelope_id, type, payload, recorded_at, fence, checksum)
    {rows}
){index}
SELECT count(*), {notify} FROM moved
"""

# Sent only for a head some process's wait_for_append has marked watched (rung 11), or for a
# start: a waiter of an execution that does not exist yet has no head to mark. The head write
# returns the flag from the row it locked, which is the newest version (READ COMMITTED
# re-reads a row updated since the statement's snapshot), so a mark committed before this
# append locked the head is seen here; one committed after it waited for this commit and read
# its tail (see PostgresStore._watch_last). It is an aggregate over the same scan of ``moved``
# that counts it: as a subquery of its own (a second scan) it cost ~15 µs more server CPU a
# step, sent or not (interleaved rounds, sent as a lone write).
_NOTIFY = (
    "count(CASE WHEN moved.watched OR %(first)s::bigint = 0 "
    "THEN pg_notify(%(channel)s, %(note)s) END)"
)
_NOTIFY_FEED = "(SELECT count(pg_notify(%(channel)s, %(feed)s)) FROM idx)"

# The blobs an append names first (an agent's messages), in the same statement, so the same
# transaction, as the events: never an event naming a blob the store lacks, and no commit of
# their own. Written only if the head moved (a refused append leaves nothing).
_BLOBS = """, blob AS (
    INSERT INTO {s}.blobs (namespace, hash, data)
    SELECT %(b_ns)s, r.h, r.d
    FROM moved, unnest(%(b_hashes)s::text[], %(b_data)s::bytea[]) AS r(h, d)
    ON CONFLICT (namespace, hash) DO NOTHING
)"""

# The index row of a write that changes an execution's summary, in the same statement (so the
# same transaction) as its events; written only if the head moved.
#
# Change cursors must grow in COMMIT order, or a feed reader that saw cursor 7 could later find
# a transaction that took 6 from the sequence and committed after it. So the cursor is taken
# under a transaction-scoped advisory lock, held until COMMIT: summary-changing transactions
# commit one at a time in cursor order (a step append takes no lock and writes no row). Under
# group commit a whole batch takes the lock once, before anything else (see _postgres_commit).
#
# The lock comes BEFORE any head row, in every transaction that takes it: one that held a head
# while waiting for the lock could deadlock with one holding the lock and waiting for that head
# (a batch writing several executions, a lone take-over or start of one of them). Heads are
# always locked after it, never before, so the cycle cannot form; a head that does not exist
# yet (a start inserts it) cannot be locked ahead, so "heads first" could not be made whole.
# ``_LOCK_FIRST`` takes it; ``_AFTER_LOCK`` is a condition of the head write that reads it, so
# the lock is held before the head write looks at its row (an uncorrelated condition is
# evaluated once, before the scan). The index row is inserted only if the head moved.
_LOCK_FIRST = "lk AS (SELECT pg_advisory_xact_lock(%(lock)s)), "
_AFTER_LOCK = "AND EXISTS (SELECT FROM lk)"
_INDEX = """, idx AS (
    INSERT INTO {{s}}.executions AS x ({columns})
    SELECT %(x_eid)s, %(x_flow)s, %(x_version)s, %(x_status)s, %(x_waiting)s, %(x_parent)s,
           %(x_forked)s, %(x_created)s::float8, %(x_updated)s::float8,
           nextval('{{s}}.executions_cursor')
    FROM moved
    ON CONFLICT (execution_id) DO UPDATE SET {update}
    RETURNING 1
)"""
# A start sets every field; a later change sets status, waiting-for and times (the upsert is
# SummaryChange.apply with the previous row read by PostgreSQL).
_INDEX_START_SET = (
    "flow_id = excluded.flow_id, flow_version = excluded.flow_version, "
    "status = excluded.status, waiting_for = excluded.waiting_for, "
    "parent_id = excluded.parent_id, forked_from = coalesce(excluded.forked_from, "
    "x.forked_from), created_at = excluded.created_at, updated_at = excluded.updated_at, "
    "cursor = excluded.cursor"
)
_INDEX_CHANGE_SET = (
    "status = excluded.status, waiting_for = excluded.waiting_for, "
    "forked_from = coalesce(excluded.forked_from, x.forked_from), "
    "updated_at = excluded.updated_at, cursor = excluded.cursor"
)
_INDEX_MARK_SET = (
    "forked_from = coalesce(excluded.forked_from, x.forked_from), "
    "updated_at = excluded.updated_at, cursor = excluded.cursor"
)

# How each kind of write moves the head: an append keeps the fence; a take-over advances it by
# one from the fence it saw, and from fence 0 creates the head (a row of fence 0 never exists,
# so a concurrent creator makes the INSERT do nothing, never overwrite). They are filled into
# _APPEND as values, so their schema placeholder is a single-braced {s}; {gate} is _AFTER_LOCK
# for a write that takes the cursor lock (see _INDEX), else nothing.
# Neither moves a head whose last event is terminal (nothing is appended after one): the head's
# ``ended`` (rung 11) says so, set by the write that appended that event (``%(ends)s``: whether
# the write's last event is terminal), so the check reads the row being updated anyway.
_MOVE_APPEND = """UPDATE {s}.heads SET next_sequence = %(end)s, ended = %(ends)s
    WHERE execution_id = %(eid)s AND fence = %(fence)s AND next_sequence = %(first)s
    AND NOT ended {gate}
    RETURNING execution_id, watched"""
_MOVE_TAKE_OVER = """UPDATE {s}.heads SET fence = %(fence)s, next_sequence = %(end)s,
    ended = %(ends)s
    WHERE execution_id = %(eid)s AND fence = %(from)s AND next_sequence = %(first)s
    AND NOT ended {gate}
    RETURNING execution_id, watched"""
_MOVE_CREATE = """INSERT INTO {s}.heads (execution_id, fence, next_sequence, ended)
    SELECT %(eid)s, %(fence)s, %(end)s, %(ends)s WHERE %(from)s = 0 AND %(first)s = 0 {gate}
    ON CONFLICT (execution_id) DO NOTHING
    RETURNING execution_id, watched"""

# Most appends carry one envelope: scalar parameters cost far less to send than arrays.
_ONE_ROW = (
    "SELECT moved.execution_id, %(first)s, %(id)s, %(type)s, %(payload)s, %(at)s::float8, "
    "%(fence)s, %(sum)s FROM moved"
)
_MANY_ROWS = """SELECT moved.execution_id, r.seq, r.eid, r.typ, r.payload, r.at, %(fence)s, r.sum
    FROM moved, unnest(%(seqs)s::bigint[], %(ids)s::text[], %(types)s::text[],
                       %(payloads)s::text[], %(ats)s::float8[], %(sums)s::text[])
         AS r(seq, eid, typ, payload, at, sum)"""

# Many take-overs of distinct executions in one statement (a timer service firing a claimed
# batch): the cursor lock is taken first if any index row may change (see _INDEX), then the
# heads are locked in id order (as a group commit orders its requests, so batches never
# deadlock), each moves as _MOVE_TAKE_OVER moves one, the events of the heads that moved are
# inserted, and their index rows (a change of status, or none) upserted under the cursor lock.
# Returns the ids whose head moved; a request whose head did not wrote nothing.
# Its rows come as three JSON arrays of arrays (heads, events, index rows): one text parameter
# each is encoded by the C encoder in a few milliseconds for a thousand take-overs, where
# adapting a dozen arrays of as many values took ten times as long (as much client CPU as the
# rest of a timer's take-over). A float's JSON text is its shortest round-trip form, so
# ``::float8`` reads back the same value (the checksum covers it).
_TAKE_OVER_MANY = """
WITH lk AS (
    SELECT pg_advisory_xact_lock(%(lock)s) WHERE %(indexed)s::boolean
), r AS (
    SELECT h->>0 AS eid, (h->>1)::bigint AS from_fence, (h->>2)::bigint AS first,
           (h->>3)::bigint AS stop, (h->>4)::boolean AS ends
    FROM jsonb_array_elements(%(heads)s::jsonb) AS h
), locked AS (
    SELECT h.execution_id FROM {{s}}.heads h JOIN r ON h.execution_id = r.eid
    WHERE (SELECT count(*) FROM lk) >= 0
    ORDER BY h.execution_id FOR UPDATE OF h
), moved AS (
    UPDATE {{s}}.heads h SET fence = r.from_fence + 1, next_sequence = r.stop, ended = r.ends
    FROM r JOIN locked ON locked.execution_id = r.eid
    WHERE h.execution_id = r.eid AND h.fence = r.from_fence AND h.next_sequence = r.first
    AND NOT h.ended
    RETURNING h.execution_id, h.watched, r.first
), ins AS (
    INSERT INTO {{s}}.events
        (execution_id, sequence, envelope_id, type, payload, recorded_at, fence, checksum)
    SELECT v->>0, (v->>1)::bigint, v->>2, v->>3, v->>4, (v->>5)::float8, (v->>6)::bigint, v->>7
    FROM jsonb_array_elements(%(events)s::jsonb) AS v
    JOIN moved ON moved.execution_id = v->>0
), xs AS (
    SELECT c->>0 AS eid, c->>1 AS status, c->>2 AS waiting, c->>3 AS forked,
           (c->>4)::float8 AS updated
    FROM jsonb_array_elements(%(index)s::jsonb) AS c
    JOIN moved ON moved.execution_id = c->>0
), idx AS (
    INSERT INTO {{s}}.executions AS x ({columns})
    SELECT xs.eid, '', '', xs.status, xs.waiting, NULL, xs.forked, xs.updated, xs.updated,
           nextval('{{s}}.executions_cursor')
    FROM xs
    ON CONFLICT (execution_id) DO UPDATE SET {update}
    RETURNING 1
)
SELECT (SELECT coalesce(array_agg(execution_id), '{{{{}}}}') FROM moved), {notify}
"""
# As _NOTIFY: for a watched head, or one written from sequence 0 (a head acquire_fence made).
_NOTIFY_MANY = (
    "(SELECT count(pg_notify(%(channel)s, CASE WHEN octet_length(m.execution_id) <= "
    "%(note_max)s THEN m.execution_id ELSE '' END)) FROM moved m "
    "WHERE m.watched OR m.first = 0) + "
    "(SELECT count(pg_notify(%(channel)s, %(feed)s)) FROM (SELECT 1 FROM idx LIMIT 1) f)"
)

_FENCE = (
    "INSERT INTO {s}.heads AS h (execution_id, fence, next_sequence) VALUES (%s, 1, 0) "
    "ON CONFLICT (execution_id) DO UPDATE SET fence = h.fence + 1 RETURNING h.fence"
)

# A whole snapshot replaces the chain: the segments it covers go in the same statement.
_SNAPSHOT = (
    "WITH up AS (INSERT INTO {s}.snapshots AS t (execution_id, sequence, state, checksum) "
    "VALUES (%(eid)s, %(seq)s, %(state)s, %(sum)s) ON CONFLICT (execution_id) DO UPDATE SET "
    "sequence = excluded.sequence, state = excluded.state, checksum = excluded.checksum "
    "WHERE excluded.sequence > t.sequence AND NOT EXISTS (SELECT 1 FROM "
    "{s}.snapshot_segments g WHERE g.execution_id = excluded.execution_id "
    "AND g.sequence >= excluded.sequence) RETURNING 1), "
    "gone AS (DELETE FROM {s}.snapshot_segments WHERE execution_id = %(eid)s "
    "AND sequence <= %(seq)s AND EXISTS (SELECT 1 FROM up)) "
    "SELECT 1 FROM up"
)

# A segment is kept only on top of the newest stored snapshot (whole or segment) at its base.
_SNAPSHOT_SEGMENT = (
    "INSERT INTO {s}.snapshot_segments (execution_id, sequence, base, state, checksum) "
    "SELECT %(eid)s, %(seq)s, %(base)s, %(state)s, %(sum)s WHERE %(base)s < %(seq)s AND "
    "%(base)s = GREATEST((SELECT sequence FROM {s}.snapshots WHERE execution_id = %(eid)s), "
    "(SELECT max(sequence) FROM {s}.snapshot_segments WHERE execution_id = %(eid)s)) "
    "AND EXISTS (SELECT 1 FROM {s}.snapshots WHERE execution_id = %(eid)s) "
    "ON CONFLICT DO NOTHING RETURNING 1"
)

_HEAD = "SELECT fence, next_sequence FROM {s}.heads WHERE execution_id = %s"

_READ = (
    "SELECT envelope_id, sequence, type, payload, recorded_at, fence, checksum "
    "FROM {s}.events WHERE execution_id = %s AND sequence >= %s ORDER BY sequence"
)

# A batch landed if its whole range holds exactly its records (ids as stored, checksums).
_PROBE = (
    "SELECT 1 FROM {s}.events WHERE execution_id = %s AND sequence >= %s AND sequence < %s "
    "HAVING array_agg(envelope_id ORDER BY sequence) = %s::text[] "
    "AND array_agg(checksum ORDER BY sequence) = %s::text[]"
)

# Which of a take_over_many's requests landed, each checked as _PROBE checks one batch: a JSON
# array of {"eid", "first", "ids", "sums"}; returns the ids whose range holds exactly those.
_PROBE_MANY = """
SELECT p.eid
FROM jsonb_to_recordset(%s::jsonb) AS p(eid text, first bigint, ids text[], sums text[])
WHERE (SELECT array_agg(e.envelope_id ORDER BY e.sequence) FROM {s}.events e
       WHERE e.execution_id = p.eid AND e.sequence >= p.first
       AND e.sequence < p.first + cardinality(p.ids)) = p.ids
  AND (SELECT array_agg(e.checksum ORDER BY e.sequence) FROM {s}.events e
       WHERE e.execution_id = p.eid AND e.sequence >= p.first
       AND e.sequence < p.first + cardinality(p.ids)) = p.sums
"""

# Rescheduling a position replaces the timer and drops any claim on it (the later call wins).
# Every timer write returns one row: the group commit reads one row per request.
_TIMER_SCHEDULE = (
    "INSERT INTO {s}.timers (execution_id, position, fire_at, kind, flow_id) "
    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (execution_id, position) DO UPDATE SET "
    "fire_at = excluded.fire_at, kind = excluded.kind, flow_id = excluded.flow_id, "
    "claimed_by = NULL, claimed_until = 0 RETURNING 1"
)

# The claim is one statement: the subquery locks the first due, unclaimed rows and skips those
# another claimer holds right now (SKIP LOCKED, so claimers never wait for each other); the
# UPDATE marks them. A row claimed and committed meanwhile is re-checked against the WHERE
# under READ COMMITTED and dropped, so two claimers never get the same timer.
_TIMER_CLAIM = """
UPDATE {s}.timers SET claimed_by = %(owner)s, claimed_until = %(until)s
WHERE (execution_id, position) IN (
    SELECT execution_id, position FROM {s}.timers
    WHERE fire_at <= %(now)s AND claimed_until <= %(now)s
      AND starts_with(execution_id, %(prefix)s)
      AND (%(any_flow)s OR flow_id = ANY(%(flow_ids)s::text[]))
    ORDER BY fire_at, execution_id, position
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING execution_id, position, fire_at, kind, flow_id
"""

_TIMER_COMPLETE = (
    "WITH gone AS (DELETE FROM {s}.timers WHERE execution_id = %s AND position = %s "
    "RETURNING 1) SELECT count(*) FROM gone"
)

# Many fired timers in one statement (a timer service settles a batch of wakes at once).
_TIMER_COMPLETE_MANY = (
    "WITH gone AS (DELETE FROM {s}.timers t USING unnest(%s::text[], %s::bigint[]) "
    "AS d(execution_id, position) WHERE t.execution_id = d.execution_id "
    "AND t.position = d.position RETURNING 1) SELECT count(*) FROM gone"
)

_TIMER_CANCEL = (
    "WITH gone AS (DELETE FROM {s}.timers WHERE execution_id = %s RETURNING 1) "
    "SELECT count(*) FROM gone"
)

#: pg_notify payloads must stay under 8000 bytes; a longer id wakes every waiter instead.
MAX_NOTE_BYTES = 4000


EventWriteKind = Literal["append", "take_over", "create"]
#: Which index row an event write also writes: none, a start's, a later change's, or a mark.
IndexWrite = Literal["", "start", "change", "mark"]


@dataclass(frozen=True, slots=True)
class Statements:
    """Every statement of one store, with its schema name filled in."""

    #: The one statement of each event write, by (kind, one envelope?, index row, blobs?).
    event_writes: Mapping[tuple[EventWriteKind, bool, IndexWrite, bool], str]
    fence: str
    snapshot: str
    snapshot_segment: str
    blob_put: str
    blob_get: str
    head: str
    ended: str
    read: str
    probe: str
    probe_lock: str
    lock_heads: str
    probe_many: str
    probe_many_lock: str
    last: str
    watch: str
    current_fence: str
    snapshot_load: str
    ids_first: str
    ids_after: str
    take_over_many: str
    timer_schedule: str
    timer_claim: str
    timer_complete: str
    timer_complete_many: str
    timer_cancel: str
    timer_next: str
    summary: str
    changes: str
    last_cursor: str
    lease_renew: str
    lease_release: str
    lease_expiry: str
    mailbox_put: str
    mailbox_get: str
    mailbox_pending: str
    mailbox_consume: str

    def events(
        self, kind: EventWriteKind, *, one: bool, index: IndexWrite = "", blobs: bool = False
    ) -> str:
        """The one statement that writes an append, a take-over or a creation (and, with
        ``blobs``, the blobs its events name first)."""
        return self.event_writes[(kind, one, index, blobs)]


def statements(schema: str, *, notify: bool) -> Statements:
    """Every statement of a store, with its schema name filled in."""
    s = f'"{schema}"'
    note = _NOTIFY if notify else "0"

    def write(moved: str, rows: str, index: str = "", blobs: bool = False) -> str:
        notes = note
        lock = ""
        if index:
            index = _INDEX.format(columns=SUMMARY_COLUMNS, update=index)
            lock = _LOCK_FIRST
            if notify:
                notes = f"{note} + {_NOTIFY_FEED}"
        moved = moved.format(s="{s}", gate=_AFTER_LOCK if index else "")
        return _APPEND.format(
            lock=lock,
            moved=moved,
            rows=rows,
            notify=notes,
            index=index,
            blobs=_BLOBS if blobs else "",
        ).format(s=s)

    moves: tuple[tuple[EventWriteKind, str], ...] = (
        ("append", _MOVE_APPEND),
        ("take_over", _MOVE_TAKE_OVER),
        ("create", _MOVE_CREATE),
    )
    indexes: tuple[tuple[IndexWrite, str], ...] = (
        ("", ""),
        ("start", _INDEX_START_SET),
        ("change", _INDEX_CHANGE_SET),
        ("mark", _INDEX_MARK_SET),
    )
    writes = {
        (kind, one, index, blobs): write(moved, _ONE_ROW if one else _MANY_ROWS, update, blobs)
        for kind, moved in moves
        for one in (True, False)
        for index, update in indexes
        for blobs in (False, True)
    }
    return Statements(
        event_writes=MappingProxyType(writes),
        fence=_FENCE.format(s=s),
        snapshot=_SNAPSHOT.format(s=s),
        snapshot_segment=_SNAPSHOT_SEGMENT.format(s=s),
        blob_put=(
            f"INSERT INTO {s}.blobs (namespace, hash, data) SELECT %s, r.h, r.d "
            "FROM unnest(%s::text[], %s::bytea[]) AS r(h, d) "
            "ON CONFLICT (namespace, hash) DO NOTHING RETURNING 1"
        ),
        blob_get=(
            f"SELECT hash, data FROM {s}.blobs WHERE namespace = %s AND hash = ANY(%s::text[])"
        ),
        head=_HEAD.format(s=s),
        ended=(
            f"SELECT type FROM {s}.events WHERE execution_id = %s AND sequence = %s "
            f"AND type IN ({TERMINAL_SQL})"
        ),
        read=_READ.format(s=s),
        probe=_PROBE.format(s=s),
        probe_lock=f"SELECT 1 FROM {s}.heads WHERE execution_id = %s FOR SHARE",
        lock_heads=(
            f"SELECT 1 FROM {s}.heads WHERE execution_id = ANY(%s::text[]) "
            "ORDER BY execution_id FOR UPDATE"
        ),
        probe_many=_PROBE_MANY.format(s=s),
        # In id order, as the take-over locked them (see _TAKE_OVER_MANY).
        probe_many_lock=(
            f"SELECT 1 FROM {s}.heads WHERE execution_id = ANY(%s::text[]) "
            "ORDER BY execution_id FOR SHARE"
        ),
        last=f"SELECT next_sequence FROM {s}.heads WHERE execution_id = %s",
        # Always a write (never "AND NOT watched"): it must take the head's lock, so that it
        # waits for an append in flight and returns the tail that append left.
        watch=(
            f"UPDATE {s}.heads SET watched = true WHERE execution_id = %s RETURNING next_sequence"
        ),
        current_fence=f"SELECT fence FROM {s}.heads WHERE execution_id = %s",
        # The whole row first (kind 0), then its segments in order: one query.
        snapshot_load=(
            f"SELECT 0 AS k, sequence, -1, state, checksum FROM {s}.snapshots "
            "WHERE execution_id = %(eid)s UNION ALL "
            f"SELECT 1, sequence, base, state, checksum FROM {s}.snapshot_segments "
            "WHERE execution_id = %(eid)s ORDER BY 1, 2"
        ),
        ids_first=(
            f"SELECT execution_id FROM {s}.heads WHERE next_sequence > 0 "
            "ORDER BY execution_id LIMIT %s"
        ),
        ids_after=(
            f"SELECT execution_id FROM {s}.heads WHERE next_sequence > 0 "
            "AND execution_id > %s ORDER BY execution_id LIMIT %s"
        ),
        take_over_many=_TAKE_OVER_MANY.format(
            columns=SUMMARY_COLUMNS,
            update=_INDEX_CHANGE_SET,
            notify=_NOTIFY_MANY if notify else "0",
        ).format(s=s),
        timer_schedule=_TIMER_SCHEDULE.format(s=s),
        timer_claim=_TIMER_CLAIM.format(s=s),
        timer_complete=_TIMER_COMPLETE.format(s=s),
        timer_complete_many=_TIMER_COMPLETE_MANY.format(s=s),
        timer_cancel=_TIMER_CANCEL.format(s=s),
        timer_next=f"SELECT min(fire_at) FROM {s}.timers WHERE starts_with(execution_id, %s)",
        summary=f"SELECT {SUMMARY_COLUMNS} FROM {s}.executions WHERE execution_id = %s",
        changes=(
            f"SELECT {SUMMARY_COLUMNS} FROM {s}.executions WHERE cursor > %s "
            "AND starts_with(execution_id, %s) ORDER BY cursor LIMIT %s"
        ),
        last_cursor=f"SELECT coalesce(max(cursor), 0) FROM {s}.executions",
        lease_renew=(
            f"WITH renewed AS (INSERT INTO {s}.leases (execution_id, holder, fence, expires_at) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (execution_id) DO UPDATE SET "
            "holder = excluded.holder, fence = excluded.fence, expires_at = excluded.expires_at "
            f"WHERE excluded.fence >= {s}.leases.fence RETURNING 1) SELECT count(*) FROM renewed"
        ),
        lease_release=(
            f"WITH gone AS (DELETE FROM {s}.leases WHERE execution_id = %s AND holder = %s "
            "RETURNING 1) SELECT count(*) FROM gone"
        ),
        lease_expiry=f"SELECT expires_at FROM {s}.leases WHERE execution_id = %s",
        mailbox_put=(
            f"WITH ins AS (INSERT INTO {s}.mailbox (execution_id, message_id, event_type,"
            " payload, sent_at) VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (execution_id, message_id) DO NOTHING RETURNING 1)"
            " SELECT count(*) FROM ins"
        ),
        mailbox_get=(
            f"SELECT event_type, payload, sent_at FROM {s}.mailbox"
            " WHERE execution_id = %s AND message_id = %s"
        ),
        mailbox_pending=(
            f"SELECT message_id, payload, sent_at FROM {s}.mailbox WHERE execution_id = %s"
            " AND event_type = %s AND NOT consumed ORDER BY seq LIMIT %s"
        ),
        mailbox_consume=(
            f"WITH u AS (UPDATE {s}.mailbox SET consumed = true WHERE execution_id = %s"
            " AND message_id = %s AND NOT consumed RETURNING 1) SELECT count(*) FROM u"
        ),
    )


def cursor_lock_key(schema: str) -> int:
    """The advisory lock key that orders a schema's change cursors (see ``_INDEX``)."""
    return int.from_bytes(
        hashlib.blake2b(f"loom-cursor:{schema}".encode(), digest_size=8).digest(),
        "big",
        signed=True,
    )


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of a schema's appends (a valid identifier for any name)."""
    return f"loom_{hashlib.blake2b(schema.encode(), digest_size=12).hexdigest()}"


def migration_lock_key(schema: str) -> int:
    """The advisory lock key for migrations: a signed 64-bit number derived from the schema."""
    return int.from_bytes(
        hashlib.blake2b(f"loom-migrate:{schema}".encode(), digest_size=8).digest(),
        "big",
        signed=True,
    )


async def check_schema(conn: Conn, schema: str, where: str) -> None:
    """For a read-only opening: the schema must exist at :data:`SCHEMA_VERSION` (nothing is
    created or migrated)."""
    cur = await conn.execute(
        "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = 'meta'",
        (schema,),
    )
    if await cur.fetchone() is None:
        raise NotALoomDatabaseError(
            f"no Loom store at {where}: the schema does not exist",
            hint="Check the URL and its ?schema=; a read-only opening never creates one",
        )
    cur = await conn.execute(f"SELECT value FROM \"{schema}\".meta WHERE key = 'schema_version'")
    row = await cur.fetchone()
    version = int(row[0]) if row is not None else 0
    if version != SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the PostgreSQL store at {where} has Loom schema version {version}; this Loom "
            f"reads version {SCHEMA_VERSION}, and a read-only opening never migrates",
            hint="Upgrade Loom (newer schema) or open it once for writing (older schema)",
        )


async def migrate(conn: Conn, schema: str, where: str) -> None:
    """Create the schema or bring it up to :data:`SCHEMA_VERSION`, all in one transaction.

    ``conn`` must be in autocommit mode. Raises ``SchemaVersionError`` for a newer schema and
    ``StorageError`` if a migration statement fails (then nothing of it was applied).
    """
    s = f'"{schema}"'
    async with conn.transaction():
        # Every opener takes the same lock, so concurrent first opens create the schema once
        # and a migration is never observed half-done.
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (migration_lock_key(schema),))
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value text NOT NULL)"
        )
        cur = await conn.execute(f"SELECT value FROM {s}.meta WHERE key = 'schema_version'")
        row = await cur.fetchone()
        version = int(row[0]) if row is not None else 0
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"the PostgreSQL store at {where} has Loom schema version "
                f"{version}; this Loom reads up to {SCHEMA_VERSION}"
            )
        if version == SCHEMA_VERSION:
            return
        try:
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for step in MIGRATIONS[target]:
                    if isinstance(step, str):
                        await conn.execute(step.format(s=s))
                    else:
                        await step(conn, s, where)
            await conn.execute(
                f"INSERT INTO {s}.meta (key, value) VALUES ('schema_version', %s) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )
        except psycopg.Error as exc:
            if conn.closed or conn.broken:
                raise  # the connection died: the caller reports an unreachable server
            raise StorageError(
                f"cannot migrate the PostgreSQL store at {where} from schema version {version} "
                f"to {SCHEMA_VERSION}: {exc}; nothing was changed",
                hint="Fix the conflicting object in the schema (or use a fresh schema) and "
                "open the store again",
            ) from exc
