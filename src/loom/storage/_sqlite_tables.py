"""SQLiteStore's side tables: timers, leases, the mailbox and blobs.

Each write is one small function run in the store's group-commit transaction (``_submit``),
so SQLite's write lock makes a timer claim or a lease renewal exclusive across every process
using the file; each read runs on the calling thread's reader connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from loom.model import PayloadLimits, decode_json, encode_json
from loom.storage._blobs import check_blobs, check_hashes
from loom.storage._common import check_timer
from loom.storage._spi import Message, Timer

__all__ = ["SQLiteSideTables"]


class SQLiteSideTables:
    """Mixed into :class:`~loom.storage.SQLiteStore` (see the module docstring)."""

    if TYPE_CHECKING:
        limits: PayloadLimits

        def _reader(self) -> sqlite3.Connection: ...

        async def _submit(
            self,
            apply: Callable[[sqlite3.Connection], Any],
            notify: str | None,
            *,
            feed: bool = False,
        ) -> Any: ...

    # ---------------------------------------------------------------- TimerStore

    async def schedule_timer(self, timer: Timer) -> None:
        check_timer(timer)
        row = (timer.execution_id, timer.position, timer.fire_at, timer.kind, timer.flow_id)

        def apply(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO loom_timers (execution_id, position, fire_at, kind, flow_id) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (execution_id, position) DO UPDATE SET "
                "fire_at = excluded.fire_at, kind = excluded.kind, flow_id = excluded.flow_id, "
                "claimed_by = NULL, claimed_until = 0",
                row,
            )

        await self._submit(apply, None)

    async def claim_due_timers(
        self,
        now: float,
        *,
        owner: str,
        lease: float,
        limit: int = 100,
        prefix: str = "",
        flow_ids: Collection[str] | None = None,
    ) -> list[Timer]:
        # The claim runs inside BEGIN IMMEDIATE: SQLite's write lock makes it exclusive across
        # every process using the file.
        flows = None if flow_ids is None else sorted(set(flow_ids))
        if flows == []:
            return []
        by_flow = "" if flows is None else f"AND flow_id IN ({', '.join('?' * len(flows))}) "

        def apply(conn: sqlite3.Connection) -> list[Timer]:
            rows = conn.execute(
                "SELECT execution_id, position, fire_at, kind, flow_id FROM loom_timers "
                "WHERE fire_at <= ? AND claimed_until <= ? "
                f"AND substr(execution_id, 1, ?) = ? {by_flow}"
                "ORDER BY fire_at, execution_id, position LIMIT ?",
                (now, now, len(prefix), prefix, *(flows or ()), limit),
            ).fetchall()
            conn.executemany(
                "UPDATE loom_timers SET claimed_by = ?, claimed_until = ? "
                "WHERE execution_id = ? AND position = ?",
                [(owner, now + lease, r[0], r[1]) for r in rows],
            )
            return [Timer(r[0], r[1], r[2], r[3], r[4]) for r in rows]

        result: list[Timer] = await self._submit(apply, None)
        return result

    # ---------------------------------------------------------------- LeaseStore

    async def renew_lease(
        self, execution_id: str, *, holder: str, fence: int, expires_at: float
    ) -> bool:
        def apply(conn: sqlite3.Connection) -> bool:
            changed = conn.execute(
                "INSERT INTO loom_leases (execution_id, holder, fence, expires_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (execution_id) DO UPDATE SET "
                "holder = excluded.holder, fence = excluded.fence, "
                "expires_at = excluded.expires_at WHERE excluded.fence >= loom_leases.fence",
                (execution_id, holder, fence, expires_at),
            ).rowcount
            return bool(changed)

        result: bool = await self._submit(apply, None)
        return result

    async def release_lease(self, execution_id: str, *, holder: str) -> None:
        def apply(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM loom_leases WHERE execution_id = ? AND holder = ?",
                (execution_id, holder),
            )

        await self._submit(apply, None)

    async def lease_expiry(self, execution_id: str) -> float | None:
        row = (
            self._reader()
            .execute("SELECT expires_at FROM loom_leases WHERE execution_id = ?", (execution_id,))
            .fetchone()
        )
        return None if row is None else float(row[0])

    async def complete_timer(self, timer: Timer) -> None:
        def apply(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM loom_timers WHERE execution_id = ? AND position = ?",
                (timer.execution_id, timer.position),
            )

        await self._submit(apply, None)

    async def complete_timers(self, timers: Sequence[Timer]) -> None:
        rows = [(t.execution_id, t.position) for t in timers]
        if not rows:
            return

        def apply(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "DELETE FROM loom_timers WHERE execution_id = ? AND position = ?", rows
            )

        await self._submit(apply, None)

    async def cancel_timers(self, execution_id: str) -> int:
        def apply(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "DELETE FROM loom_timers WHERE execution_id = ?", (execution_id,)
            ).rowcount

        result: int = await self._submit(apply, None)
        return result

    async def next_timer_due(self, prefix: str = "") -> float | None:
        row = (
            self._reader()
            .execute(
                "SELECT min(fire_at) FROM loom_timers WHERE substr(execution_id, 1, ?) = ?",
                (len(prefix), prefix),
            )
            .fetchone()
        )
        return None if row is None or row[0] is None else float(row[0])

    # ---------------------------------------------------------------- MailboxStore

    async def put_message(self, message: Message) -> Message:
        text = encode_json(message.payload, limits=self.limits, what="message payload")
        eid, mid = message.execution_id, message.message_id

        def apply(conn: sqlite3.Connection) -> Message:
            row = conn.execute(
                "SELECT event_type, payload, sent_at FROM loom_mailbox "
                "WHERE execution_id = ? AND message_id = ?",
                (eid, mid),
            ).fetchone()
            if row is not None:
                return Message(eid, mid, row[0], decode_json(row[1]), row[2])
            conn.execute(
                "INSERT INTO loom_mailbox (execution_id, message_id, seq, event_type, payload,"
                " sent_at) VALUES (?, ?, (SELECT coalesce(max(seq), 0) + 1 FROM loom_mailbox"
                " WHERE execution_id = ?), ?, ?, ?)",
                (eid, mid, eid, message.event_type, text, message.sent_at),
            )
            return Message(eid, mid, message.event_type, decode_json(text), message.sent_at)

        stored: Message = await self._submit(apply, None)
        return stored

    async def pending_messages(
        self, execution_id: str, event_type: str, *, limit: int = 100
    ) -> list[Message]:
        rows = (
            self._reader()
            .execute(
                "SELECT message_id, payload, sent_at FROM loom_mailbox WHERE execution_id = ? "
                "AND event_type = ? AND consumed = 0 ORDER BY seq LIMIT ?",
                (execution_id, event_type, limit),
            )
            .fetchall()
        )
        return [Message(execution_id, r[0], event_type, decode_json(r[1]), r[2]) for r in rows]

    async def consume_message(self, execution_id: str, message_id: str) -> None:
        def apply(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE loom_mailbox SET consumed = 1 WHERE execution_id = ? AND message_id = ?",
                (execution_id, message_id),
            )

        await self._submit(apply, None)

    # ---------------------------------------------------------------- blobs

    async def put_blobs(self, blobs: Mapping[str, bytes], *, namespace: str = "") -> None:
        """Store content-addressed blobs (idempotent; group-committed like appends)."""
        check_blobs(blobs)
        rows = [(namespace, key, bytes(data)) for key, data in blobs.items()]
        if not rows:
            return

        def apply(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT OR IGNORE INTO loom_blobs (namespace, hash, data) VALUES (?, ?, ?)", rows
            )

        await self._submit(apply, None)

    async def get_blobs(self, hashes: Iterable[str], *, namespace: str = "") -> dict[str, bytes]:
        wanted = check_hashes(hashes)
        found: dict[str, bytes] = {}
        conn = self._reader()
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for key, data in conn.execute(
                f"SELECT hash, data FROM loom_blobs WHERE namespace = ? AND hash IN ({marks})",
                (namespace, *chunk),
            ):
                found[key] = bytes(data)
        return found
