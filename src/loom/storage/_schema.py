"""The one schema version number shared by every durable store, and what each rung adds.

SQLite and PostgreSQL climb the same ladder: a database at version N is brought to
:data:`SCHEMA_VERSION` by applying rungs N+1.. in ONE transaction (SQLite: ``BEGIN IMMEDIATE``;
PostgreSQL: under an advisory lock), so nobody ever sees a half-migrated schema. A database
written by a newer Loom is refused with ``SchemaVersionError``. A new schema change is a new
rung in both dialects (``_sqlite_schema.MIGRATIONS`` and ``_postgres_sql.MIGRATIONS``) and a
bump here; a rung that does not apply to one dialect is an empty tuple there.

1. heads, events, snapshots (SQLite's first version also created its timers table).
2. timers (PostgreSQL; SQLite already had them).
3. the execution index (``executions``: one summary row per execution, a global change cursor),
   back-filled from the existing logs.
4. content-addressed blobs (``blobs``: the BlobStore side, where agents keep messages).
5. one B-tree write per step (no DDL): an append reads the fence and the log's tail inside its
   write transaction and no longer moves ``heads.next_sequence`` (it moves only on a start, a
   take-over or a fence change; SQLite). The bump keeps an older Loom, which trusts
   ``next_sequence`` as the tail, away from a file written this way.
6. liveness leases (``leases``: who drives an execution, under which fence, until when).
7. the mailbox (``mailbox``: messages sent to an execution before its gate takes them).
8. branch refs (``refs``: named (execution, sequence) points, moved by compare-and-swap).
9. snapshot segments (``snapshot_segments``: what changed since the snapshot below, chained by
   ``base``; ``snapshots`` keeps the whole one they lay on, so old rows still load as they are).
10. lean envelope ids: an envelope carrying its derived id (``execution#sequence.fence``, the
    default) is stored with an empty id and rebuilt on reading, and uniqueness is a partial
    index over the explicit ids only, so a plain step writes no index (SQLite rebuilds its
    events table to drop rung 1's automatic index). Explicit ids of the derived form are
    refused from now on; any written before are kept as ``reserved_envelope_ids`` in the meta
    table.
11. watched and ended heads (PostgreSQL; SQLite needs nothing). ``heads.watched`` is set by
    the first ``wait_for_append`` of an execution in any process, and an append sends its
    ``pg_notify`` only for a watched head (or a start, which any waiter of a not-yet-existing
    execution needs). The flag is written under the head row's lock, which every append takes,
    so no wake-up is lost; an execution nobody waits for in another process pays no notify
    (~20 µs of server CPU a step, and a cluster-wide lock held through each notifying commit).
    ``heads.ended`` says the log's last event is terminal (set by the write that appends it,
    back-filled from the logs), so an append checks it on the row it updates anyway instead of
    looking the tail up in the events (~18 µs of server CPU a step).
"""

from __future__ import annotations

__all__ = ["SCHEMA_VERSION"]

SCHEMA_VERSION = 11
