"""Loading many executions in one query (:class:`loom.storage.LoadsMany`): the rows every store
reads for it, and how they become :class:`StoredExecution` values.

One statement returns, for a set of execution ids, the whole snapshot row (kind 0), the
snapshot segments (kind 1) and the events from the whole snapshot's sequence on (kind 2), so
one consistent read serves a whole claimed batch of timers instead of three reads per timer.
Events are read from the *whole* row's sequence, not from the top of its segments: a segment
that does not link ends the merged chain below it, and the events from there on must be there.
The event at the merged snapshot's own sequence is read only to prove the log reaches it; it
and any event below it are not decoded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any

from loom.model import Envelope, PayloadLimits
from loom.storage._common import decode_envelope, decode_snapshot, merge_segments
from loom.storage._spi import Snapshot, StoredExecution

__all__ = ["assemble", "chunks", "postgres_load_many", "sqlite_load_many"]

KIND_WHOLE = 0
KIND_SEGMENT = 1
KIND_EVENT = 2

#: How many execution ids one statement asks for (SQLite binds each as a parameter).
CHUNK = 256


def chunks(execution_ids: Iterable[str], size: int = CHUNK) -> list[list[str]]:
    """The distinct ids, first occurrence first, in lists of at most ``size``."""
    ids = list(dict.fromkeys(execution_ids))
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def assemble(
    rows: Sequence[Sequence[Any]], limits: PayloadLimits
) -> tuple[dict[str, StoredExecution], dict[str, Snapshot]]:
    """Build what ``rows`` say of each execution.

    Each row is ``(kind, execution_id, sequence, base_or_fence, state_or_payload, checksum,
    envelope_id, type, recorded_at)``, any order. Returns the executions whose events were
    read, and the snapshots of those with a snapshot but no event at or after it (a snapshot
    beyond the log, or no log): the store reads their last sequence on its own.
    Raises ``CorruptEventError`` for any record that fails its checksum or decoding.
    """
    by_id: dict[str, list[Sequence[Any]]] = {}
    for row in rows:
        found = by_id.get(row[1])
        if found is None:
            by_id[row[1]] = [row]
        else:
            found.append(row)
    loaded: dict[str, StoredExecution] = {}
    beyond: dict[str, Snapshot] = {}
    for eid, mine in by_id.items():
        if len(mine) > 1:
            mine.sort(key=lambda r: (r[0], r[2]))
        snapshot: Snapshot | None = None
        first = 0
        if mine[0][0] == KIND_WHOLE:
            whole = mine[0]
            snapshot = decode_snapshot(eid, whole[2], whole[4], whole[5])
            segments = [(r[2], r[3], r[4], r[5]) for r in mine if r[0] == KIND_SEGMENT]
            snapshot = merge_segments(snapshot, segments)
            first = snapshot.sequence + 1
        events: list[Envelope] = []
        last = -1
        for r in mine:
            if r[0] != KIND_EVENT:
                continue
            last = r[2]
            if r[2] >= first:
                envelope = decode_envelope(eid, r[6], r[2], r[7], r[4], r[8], r[3], r[5], limits)
                events.append(envelope)
        if snapshot is not None and last < snapshot.sequence:
            beyond[eid] = snapshot
        elif last >= 0:
            loaded[eid] = StoredExecution(eid, snapshot, events, last)
    return loaded, beyond


async def add_beyond(
    loaded: dict[str, StoredExecution],
    beyond: dict[str, Snapshot],
    last_sequence: Callable[[str], Awaitable[int]],
) -> None:
    """Add the executions whose snapshot covers their whole log (no tail rows came back): their
    end is the log's last sequence, read one at a time (rare: a snapshot is seldom the end)."""
    for eid, snapshot in beyond.items():
        last = await last_sequence(eid)
        if last >= 0:
            loaded[eid] = StoredExecution(eid, snapshot, [], last)


@lru_cache(maxsize=8)
def sqlite_load_many(count: int) -> str:
    """SQLite's statement for ``count`` ids (one consistent read: a single SELECT)."""
    ids = ",".join("(?)" for _ in range(count))
    return (
        f"WITH w(eid) AS (VALUES {ids}) "
        "SELECT 0, s.execution_id, s.sequence, -1, s.state, s.checksum, NULL, NULL, NULL "
        "FROM w JOIN loom_snapshots s ON s.execution_id = w.eid UNION ALL "
        "SELECT 1, g.execution_id, g.sequence, g.base, g.state, g.checksum, NULL, NULL, NULL "
        "FROM w JOIN loom_snapshot_segments g ON g.execution_id = w.eid UNION ALL "
        "SELECT 2, e.execution_id, e.sequence, e.fence, e.payload, e.checksum, e.envelope_id, "
        "e.type, e.recorded_at FROM w JOIN loom_events e ON e.execution_id = w.eid "
        "AND e.sequence >= coalesce((SELECT sequence FROM loom_snapshots "
        "WHERE execution_id = w.eid), 0)"
    )


def postgres_load_many(schema: str) -> str:
    """PostgreSQL's statement for an array of ids ``%(ids)s`` (one consistent read)."""
    return (
        "SELECT 0, s.execution_id, s.sequence, -1::bigint, s.state, s.checksum, NULL::text, "
        f"NULL::text, NULL::double precision FROM {schema}.snapshots s "
        "WHERE s.execution_id = ANY(%(ids)s::text[]) UNION ALL "
        "SELECT 1, g.execution_id, g.sequence, g.base, g.state, g.checksum, NULL, NULL, NULL "
        f"FROM {schema}.snapshot_segments g WHERE g.execution_id = ANY(%(ids)s::text[]) "
        "UNION ALL SELECT 2, e.execution_id, e.sequence, e.fence, e.payload, e.checksum, "
        f"e.envelope_id, e.type, e.recorded_at FROM {schema}.events e "
        f"LEFT JOIN {schema}.snapshots s ON s.execution_id = e.execution_id "
        "WHERE e.execution_id = ANY(%(ids)s::text[]) AND e.sequence >= coalesce(s.sequence, 0)"
    )
