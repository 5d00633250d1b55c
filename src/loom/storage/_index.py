"""What every store's execution index shares: page cursors, filters as SQL, the back-fill.

Listing order is newest first: ``(created_at DESC, execution_id DESC)``, paged by keyset (the
page cursor names the last row shown; the next page starts strictly after it), never OFFSET.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from loom.errors import ConfigurationError, CorruptEventError, StorageError
from loom.model import Envelope, ExecutionStatus, ExecutionSummary, SummaryChange
from loom.model._summary import summary_change
from loom.storage._common import decode_envelope
from loom.storage._spi import ExecutionQuery

__all__ = [
    "FEED_KEY",
    "SUMMARY_COLUMNS",
    "backfill_rows",
    "decode_page_cursor",
    "encode_page_cursor",
    "matches",
    "summary_from_row",
    "summary_values",
    "where_clause",
]

#: The ``Waiters`` key (and PostgreSQL notification payload) that wakes change-feed readers:
#: execution ids are printable, so no id is this.
FEED_KEY = "\x1floom.feed"

SUMMARY_COLUMNS = (
    "execution_id, flow_id, flow_version, status, waiting_for, parent_id, forked_from, "
    "created_at, updated_at, cursor"
)


def summary_from_row(row: Iterable[Any]) -> ExecutionSummary:
    eid, flow_id, version, status, waiting, parent, forked, created, updated, cursor = row
    return ExecutionSummary(
        str(eid),
        str(flow_id),
        str(version),
        ExecutionStatus(status),
        waiting,
        parent,
        forked,
        float(created),
        float(updated),
        int(cursor),
    )


def encode_page_cursor(summary: ExecutionSummary) -> str:
    return f"{summary.created_at!r}|{summary.execution_id}"


def decode_page_cursor(cursor: str) -> tuple[float, str]:
    """(created_at, execution_id) of the last row of the previous page."""
    head, sep, execution_id = cursor.partition("|")
    try:
        if not sep:
            raise ValueError(cursor)
        return float(head), execution_id
    except ValueError:
        raise ConfigurationError(
            f"{cursor!r} is not a page cursor of this index",
            hint="Pass the next_cursor of the previous ExecutionPage unchanged",
        ) from None


def where_clause(
    query: ExecutionQuery, mark: str, *, paged: bool, instr: str = "instr"
) -> tuple[str, list[Any]]:
    """The WHERE clause of ``query``'s filters (``mark``: the driver's placeholder; ``instr``:
    its substring-position function)."""
    parts: list[str] = []
    params: list[Any] = []
    if query.statuses:
        parts.append(f"status IN ({', '.join(mark for _ in query.statuses)})")
        params.extend(ExecutionStatus(s).value for s in sorted(query.statuses))
    for column, value in (
        ("flow_id", query.flow_id),
        ("parent_id", query.parent_id),
        ("forked_from", query.forked_from),
    ):
        if value is not None:
            parts.append(f"{column} = {mark}")
            params.append(value)
    if query.created_after is not None:
        parts.append(f"created_at > {mark}")
        params.append(query.created_after)
    if query.created_before is not None:
        parts.append(f"created_at < {mark}")
        params.append(query.created_before)
    if query.id_prefix:
        parts.append(f"substr(execution_id, 1, {mark}) = {mark}")
        params.extend((len(query.id_prefix), query.id_prefix))
    if query.id_contains:
        parts.append(f"{instr}(execution_id, {mark}) > 0")
        params.append(query.id_contains)
    if paged and query.cursor is not None:
        created, execution_id = decode_page_cursor(query.cursor)
        parts.append(f"(created_at, execution_id) < ({mark}, {mark})")
        params.extend((created, execution_id))
    return (" WHERE " + " AND ".join(parts)) if parts else "", params


def matches(query: ExecutionQuery, s: ExecutionSummary, *, paged: bool) -> bool:
    """Whether ``s`` passes ``query``'s filters (the in-memory twin of :func:`where_clause`)."""
    if query.statuses and s.status not in {ExecutionStatus(x) for x in query.statuses}:
        return False
    if query.flow_id is not None and s.flow_id != query.flow_id:
        return False
    if query.parent_id is not None and s.parent_id != query.parent_id:
        return False
    if query.forked_from is not None and s.forked_from != query.forked_from:
        return False
    if query.created_after is not None and not s.created_at > query.created_after:
        return False
    if query.created_before is not None and not s.created_at < query.created_before:
        return False
    if query.id_prefix and not s.execution_id.startswith(query.id_prefix):
        return False
    if query.id_contains and query.id_contains not in s.execution_id:
        return False
    return not (
        paged
        and query.cursor is not None
        and (s.created_at, s.execution_id) >= decode_page_cursor(query.cursor)
    )


def backfill_rows(events: Iterable[tuple[Any, ...]], where: str) -> list[tuple[Any, ...]]:
    """Index rows for existing logs, from their summary-changing events.

    ``events``: (execution_id, envelope_id, sequence, type, payload, recorded_at, fence,
    checksum) ordered by execution id and sequence. Returns one row per execution in
    :data:`SUMMARY_COLUMNS` order, cursors numbered 1.. in the order of their last change.
    A record that fails its checksum stops the migration (nothing is changed): the index must
    not silently disagree with the log.
    """
    summaries: list[ExecutionSummary] = []
    current: str | None = None
    batch: list[Envelope] = []

    def flush() -> None:
        change: SummaryChange | None = summary_change(batch)
        if change is not None:
            summaries.append(change.apply(None))

    for eid, envelope_id, sequence, type_name, payload, at, fence, checksum in events:
        if eid != current:
            flush()
            current, batch = eid, []
        try:
            batch.append(
                decode_envelope(eid, envelope_id, sequence, type_name, payload, at, fence, checksum)
            )
        except CorruptEventError as exc:
            raise StorageError(
                f"cannot build the execution index of {where}: {exc.message}; nothing was changed",
                execution_id=eid,
                hint="Restore the execution from a backup (or delete it), then open the "
                "store again",
            ) from exc
    flush()
    summaries.sort(key=lambda s: (s.updated_at, s.execution_id))
    return [(*summary_values(s), cursor) for cursor, s in enumerate(summaries, start=1)]


def summary_values(s: ExecutionSummary) -> tuple[Any, ...]:
    """A summary's index columns in SUMMARY_COLUMNS order, without the cursor."""
    return (
        s.execution_id,
        s.flow_id,
        s.flow_version,
        s.status.value,
        s.waiting_for,
        s.parent_id,
        s.forked_from,
        s.created_at,
        s.updated_at,
    )
