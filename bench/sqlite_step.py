"""A SQLite step's statements, raw: ``python -m bench.sqlite_step [--rounds 7] [--rows 500]``.

No runtime and no store around them: ``sqlite3`` on warm WAL connections, one file each, rows
interleaved round by round (a load change on a shared machine hits every row alike), medians:

* ``floor``: ``BEGIN IMMEDIATE; INSERT`` into an ``INTEGER PRIMARY KEY`` table``; COMMIT``.
* ``rung 9``: what a step ran before schema rung 10: ``BEGIN IMMEDIATE``, the append check as
  it was then (the head's fence and the log's tail: a LEFT JOIN onto a LIMIT subquery), the
  event ``INSERT`` with a random envelope id into rung 1's table (its column ``UNIQUE`` is a
  second B-tree), ``COMMIT``.
* ``rung 10``: this build: ``_sqlite_sql.APPEND_CHECK`` (three scalar subqueries) and the
  ``INSERT`` with the derived id stored empty, into the rebuilt table whose partial index holds
  explicit ids only.
* ``lone``: rung 10 as this build's lone append runs a step whose tail it wrote itself with no
  other connection's commit since: ``PRAGMA data_version`` instead of the check's three seeks.
* ``one stmt``: ``lone`` as one autocommit statement: ``INSERT .. SELECT .. WHERE`` the
  connection's ``data_version`` is still the one it last saw (read inside the statement's own
  write transaction), no ``BEGIN``, ``PRAGMA`` or ``COMMIT`` call of its own. Not built: it
  saved 0.6 µs of CPU at NORMAL and 1.7 at FULL (2026-12-07, wall unchanged), and a step's
  commit could then no longer be stopped between its INSERT and its COMMIT by a fault point.
* ``rowid``: a candidate rung 11, not built: the head row holds a number per execution and
  the events are the rowids ``number << 32 | sequence`` of a rowid table (no execution id in
  the row; the newest execution appends at the table's right edge, where SQLite splits a full
  leaf by starting a new one instead of redistributing three). The append check reads the
  head's fence and number and the tail by a rowid range.

The event tables hold 20,000 rows of 100 other executions first, so the indexes are not tiny;
execution ids are 32 hex characters, as ``runtime.start`` makes them. Each commit's row (the
envelope, its JSON and checksum) is built before the timed loop: only the statements are timed.
Rows take turns, in reverse order every other round. Columns: wall and CPU
(``time.process_time``) µs per commit; wall over the floor and CPU and wall over rung 10, each
the median of the rounds' own ratios (a round's rows ran within a second of each other); WAL
frames per commit (pages appended to the WAL, over 300 more commits with checkpoints off).
Last, per setting, the CPU of building one step's envelope and row right after a floor commit,
right after a sleep as long as the commit, and again at once: at ``FULL`` the first two run on
caches left cold while the thread was blocked.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loom.model import Envelope, EventType, StepCompleted, new_envelope_id
from loom.storage._sqlite_schema import MIGRATIONS
from loom.storage._sqlite_sql import APPEND_CHECK, INSERT_EVENT, event_row

# The append check a step ran before this build (a LEFT JOIN onto a LIMIT subquery).
APPEND_CHECK_RUNG_9 = (
    "SELECT (SELECT fence FROM loom_heads WHERE execution_id = ?1), t.sequence, t.type "
    "FROM (SELECT 1) LEFT JOIN (SELECT sequence, type FROM loom_events "
    "WHERE execution_id = ?1 ORDER BY sequence DESC LIMIT 1) AS t"
)
# What a lone step checks when the store wrote the execution's tail itself and no other
# connection has committed since (the tail and fence it remembers are then the file's).
DATA_VERSION = "PRAGMA data_version"
PAYLOAD = '{"position":1,"step_id":"noop","attempt":1,"output":null}'
HEADS, EVENTS_V1 = MIGRATIONS[1][0], MIGRATIONS[1][1]
EVENTS_V10 = EVENTS_V1.replace(" UNIQUE", "")
PARTIAL = next(s for s in MIGRATIONS[10] if isinstance(s, str))
# The candidate rung 11 (not built: see _rowid_case): events in a rowid table keyed
# (execution number << 32 | sequence), the number kept in the head row.
HEADS_ROWID = (
    "CREATE TABLE loom_heads (execution_id TEXT PRIMARY KEY, fence INTEGER NOT NULL,"
    " next_sequence INTEGER NOT NULL, number INTEGER NOT NULL UNIQUE) WITHOUT ROWID"
)
EVENTS_ROWID = (
    "CREATE TABLE loom_events (id INTEGER PRIMARY KEY, envelope_id TEXT NOT NULL,"
    " type TEXT NOT NULL, payload TEXT NOT NULL, recorded_at REAL NOT NULL,"
    " fence INTEGER NOT NULL, checksum BLOB NOT NULL)"
)
PARTIAL_ROWID = (
    "CREATE UNIQUE INDEX loom_events_envelope_id ON loom_events (envelope_id)"
    " WHERE envelope_id <> ''"
)
APPEND_CHECK_ROWID = (
    "SELECT h.fence, h.number, "
    "(SELECT id FROM loom_events WHERE id >= h.number << 32 AND id < (h.number + 1) << 32 "
    "ORDER BY id DESC LIMIT 1), "
    "(SELECT type FROM loom_events WHERE id >= h.number << 32 AND id < (h.number + 1) << 32 "
    "ORDER BY id DESC LIMIT 1) FROM loom_heads h WHERE h.execution_id = ?1"
)
INSERT_ROWID = (
    "INSERT INTO loom_events (id, envelope_id, type, payload, recorded_at, fence, checksum)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
assert "UNIQUE" in EVENTS_V1 and "WHERE envelope_id <> ''" in PARTIAL
# The lone append as one autocommit statement: the row inserted only if no other connection
# has committed since this one last looked (data_version, read inside the statement's own write
# transaction), no BEGIN, PRAGMA or COMMIT of its own.
INSERT_IF_UNCHANGED = (
    "INSERT INTO loom_events (execution_id, sequence, envelope_id, type, payload, recorded_at,"
    " fence, checksum) SELECT ?, ?, ?, ?, ?, ?, ?, ?"
    " WHERE (SELECT data_version FROM pragma_data_version) = ?"
)


def _connect(path: Path, synchronous: str, ddl: list[str]) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    for statement in ddl:
        conn.execute(statement)
    return conn


class Case:
    """One variant: ``build(i)`` makes commit ``i``'s row (untimed), ``commit(row)`` writes it."""

    def __init__(
        self,
        name: str,
        conn: sqlite3.Connection,
        build: Callable[[int], tuple[Any, ...]],
        commit: Callable[[tuple[Any, ...]], None],
    ) -> None:
        self.name, self.conn, self.build, self.commit = name, conn, build, commit
        self.next = 0
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def run(self, rows: int, keep: bool = True) -> None:
        batch = [self.build(i) for i in range(self.next, self.next + rows)]
        self.next += rows
        commit = self.commit
        start, cpu = time.perf_counter(), time.process_time()
        for row in batch:
            commit(row)
        if keep:
            self.wall.append((time.perf_counter() - start) / rows * 1e6)
            self.cpu.append((time.process_time() - cpu) / rows * 1e6)

    def frames(self, commits: int = 300) -> float:
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.conn.execute("PRAGMA wal_autocheckpoint=0")
        self.run(commits, keep=False)
        path = self.conn.execute("PRAGMA database_list").fetchone()[2]
        page = self.conn.execute("PRAGMA page_size").fetchone()[0]
        size = os.path.getsize(path + "-wal")
        self.conn.execute("PRAGMA wal_autocheckpoint=1000")
        return float((size - 32) / (page + 24) / commits)


def _ids() -> tuple[list[str], str]:
    """100 older executions' ids and the stepping one's, 32 hex characters as
    ``runtime.start`` makes them (the id is in every row of rungs 9 and 10)."""
    ids = [new_envelope_id() for _ in range(101)]
    return ids[:100], ids[100]


def _event_case(name: str, conn: sqlite3.Connection, *, derived: bool, check: str) -> Case:
    old, x = _ids()
    conn.execute("INSERT INTO loom_heads VALUES (?, 1, 0)", (x,))
    conn.execute("BEGIN")
    for j in range(20_000):
        other = Envelope.create(
            old[j // 200],
            j % 200,
            EventType.STEP_COMPLETED,
            {"position": 1, "step_id": "noop", "attempt": 1, "output": None},
            fence=1,
            recorded_at=time.time(),
            envelope_id=None if derived else new_envelope_id(),
        )
        conn.execute(INSERT_EVENT, event_row(other))
    conn.execute("COMMIT")

    def build(i: int) -> tuple[Any, ...]:
        env = Envelope.of(
            x,
            i,
            StepCompleted(1, "noop", 1, None),
            fence=1,
            recorded_at=time.time(),
            envelope_id=None if derived else new_envelope_id(),
        )
        return event_row(env)

    def commit(row: tuple[Any, ...]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(check, () if check == DATA_VERSION else (x,)).fetchone()
        conn.execute(INSERT_EVENT, row)
        conn.execute("COMMIT")

    if check == INSERT_IF_UNCHANGED:
        version = conn.execute(DATA_VERSION).fetchone()[0]

        def commit(row: tuple[Any, ...]) -> None:
            if conn.execute(INSERT_IF_UNCHANGED, (*row, version)).rowcount != 1:
                raise AssertionError("another connection committed")

    return Case(name, conn, build, commit)


def _rowid_case(name: str, conn: sqlite3.Connection) -> Case:
    """The candidate rung 11: the head row holds the execution's number, and its events are
    the rowids ``number << 32 | sequence`` of a rowid table, so the newest execution's
    appends land at the table's right edge (SQLite's quick balance: a new leaf, no
    redistribution) and a row no longer repeats the execution id."""
    old, x = _ids()
    conn.executemany(
        "INSERT INTO loom_heads VALUES (?, 1, 200, ?)", [(e, n + 1) for n, e in enumerate(old)]
    )
    conn.execute("INSERT INTO loom_heads VALUES (?, 1, 0, 101)", (x,))

    def row_of(number: int, env: Envelope) -> tuple[Any, ...]:
        r = event_row(env)
        return ((number << 32) | env.sequence, *r[2:])

    conn.execute("BEGIN")
    for j in range(20_000):
        other = Envelope.create(
            old[j // 200],
            j % 200,
            EventType.STEP_COMPLETED,
            {"position": 1, "step_id": "noop", "attempt": 1, "output": None},
            fence=1,
            recorded_at=time.time(),
        )
        conn.execute(INSERT_ROWID, row_of(j // 200 + 1, other))
    conn.execute("COMMIT")

    def build(i: int) -> tuple[Any, ...]:
        env = Envelope.of(x, i, StepCompleted(1, "noop", 1, None), fence=1, recorded_at=time.time())
        return row_of(101, env)

    def commit(row: tuple[Any, ...]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(APPEND_CHECK_ROWID, (x,)).fetchone()
        conn.execute(INSERT_ROWID, row)
        conn.execute("COMMIT")

    return Case(name, conn, build, commit)


def _python_after_commit(conn: sqlite3.Connection, rows: int) -> tuple[float, float, float]:
    """CPU µs of one fixed piece of Python (building a step's envelope and row, as the store's
    caller does each step) right after a commit of ``conn``, right after sleeping as long as a
    commit took instead, and again at once. At ``FULL`` the commit blocks in fsync, and the
    Python that follows runs on cold caches, so a step's Python costs more there than the same
    code at ``NORMAL``; the sleep shows whether blocking at all costs that, fsync or not."""

    def work(i: int) -> None:
        event = StepCompleted(i, "noop", 1, None, time.time())
        event_row(Envelope.of("x", i, event, fence=1, recorded_at=time.time()))

    clock = time.process_time_ns
    after: list[int] = []
    slept: list[int] = []
    alone: list[int] = []
    for i in range(rows):
        began = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO floor (p) VALUES (?)", (PAYLOAD,))
        conn.execute("COMMIT")
        took = time.perf_counter() - began
        start = clock()
        work(i)
        after.append(clock() - start)
        time.sleep(took)
        start = clock()
        work(i)
        slept.append(clock() - start)
        start = clock()
        work(i)  # again, caches warm now
        alone.append(clock() - start)
    return statistics.mean(after) / 1e3, statistics.mean(slept) / 1e3, statistics.mean(alone) / 1e3


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.0f}-{max(values):.0f})"


def _paired(values: list[float], base: list[float]) -> str:
    """The median over rounds of ``values / base`` measured in the same round."""
    return f"{statistics.median(v / b for v, b in zip(values, base, strict=True)):.3f}x"


def main(rounds: int, rows: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for synchronous in ("NORMAL", "FULL"):
            d = Path(tmp) / synchronous
            d.mkdir()
            floor_conn = _connect(
                d / "floor.db", synchronous, ["CREATE TABLE floor (id INTEGER PRIMARY KEY, p TEXT)"]
            )

            def floor_commit(row: tuple[Any, ...], conn: sqlite3.Connection = floor_conn) -> None:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO floor (p) VALUES (?)", row)
                conn.execute("COMMIT")

            r9 = _connect(d / "r9.db", synchronous, [HEADS, EVENTS_V1])
            r10 = _connect(d / "r10.db", synchronous, [HEADS, EVENTS_V10, PARTIAL])
            lone = _connect(d / "lone.db", synchronous, [HEADS, EVENTS_V10, PARTIAL])
            one = _connect(d / "one.db", synchronous, [HEADS, EVENTS_V10, PARTIAL])
            rowid_ddl = [HEADS_ROWID, EVENTS_ROWID, PARTIAL_ROWID]
            rowid = _connect(d / "rowid.db", synchronous, rowid_ddl)
            cases = [
                Case("floor", floor_conn, lambda i: (PAYLOAD,), floor_commit),
                _event_case("rung 9", r9, derived=False, check=APPEND_CHECK_RUNG_9),
                _event_case("rung 10", r10, derived=True, check=APPEND_CHECK),
                _event_case("lone", lone, derived=True, check=DATA_VERSION),
                _event_case("one stmt", one, derived=True, check=INSERT_IF_UNCHANGED),
                _rowid_case("rowid", rowid),
            ]
            for case in cases:
                case.run(1000, keep=False)  # warm: the WAL reaches its steady size
            for k in range(rounds):
                for case in cases if k % 2 == 0 else cases[::-1]:  # no row always first
                    case.run(rows)
            frames = {case.name: case.frames() for case in cases}
            load = os.getloadavg()[0]
            print(
                f"\nsynchronous={synchronous}: {rounds} rounds of {rows} commits, medians "
                f"(min-max); ratios are medians of each round's own; load average {load:.1f}"
            )
            print(
                f"{'':<8} {'wall µs':>20} {'CPU µs':>18} {'wall ÷ floor':>13} "
                f"{'CPU ÷ rung 10':>14} {'wall ÷ rung 10':>15} {'WAL frames':>11}"
            )
            floor, r10 = cases[0], cases[2]
            for case in cases:
                print(
                    f"{case.name:<8} {_spread(case.wall):>20} {_spread(case.cpu):>18} "
                    f"{_paired(case.wall, floor.wall):>13} {_paired(case.cpu, r10.cpu):>14} "
                    f"{_paired(case.wall, r10.wall):>15} {frames[case.name]:>11.2f}"
                )
            after, slept, warm = _python_after_commit(floor_conn, rows)
            print(
                f"a step's envelope and row, built right after a floor commit: {after:.1f} µs "
                f"CPU; after sleeping as long instead: {slept:.1f} µs; built again at once, "
                f"caches warm: {warm:.1f} µs"
            )
            for case in cases:
                case.conn.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", type=int, default=500)
    args = parser.parse_args()
    main(args.rounds, args.rows)
