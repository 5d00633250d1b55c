"""The floor: one raw driver INSERT + COMMIT per row, on the same kind of database.

SQLite: ``sqlite3`` with ``journal_mode=WAL`` and ``synchronous=FULL`` (Loom's setting), one
``INSERT`` then ``commit()`` per row. PostgreSQL: a psycopg connection in autocommit mode, one
``INSERT`` per row. The row is about the size of a step record in the others' logs.
"""

from __future__ import annotations

import json
import sqlite3
import time
from importlib import metadata
from typing import Any

from bench.peers.systems.base import SkipError, System, Target, sqlite_pragmas

__all__ = ["SYSTEM", "FloorSystem"]

PAYLOAD = json.dumps({"position": 123, "step_id": "inc", "attempt": 1, "output": 124, "t": 0.0})
CREATE = "CREATE TABLE IF NOT EXISTS floor_rows (id BIGINT PRIMARY KEY, payload TEXT NOT NULL)"


class FloorSystem(System):
    name = "floor"
    workloads = frozenset({"per_step"})

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self._conn: Any = None
        self._next = 0

    def open(self) -> None:
        if self.target.backend == "sqlite":
            conn = sqlite3.connect(self.target.location)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(CREATE)
            conn.commit()
        else:
            import psycopg

            try:
                conn = psycopg.connect(self.target.location, autocommit=True, connect_timeout=10)
            except psycopg.OperationalError as exc:
                raise SkipError(f"PostgreSQL server unreachable ({exc})") from exc
            conn.execute(CREATE)
        self._conn = conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def describe(self) -> dict[str, Any]:
        if self.target.backend == "sqlite":
            return {
                "version": f"sqlite3 (SQLite {sqlite3.sqlite_version})",
                "api": "sqlite3: INSERT; commit() per row",
                "durability": sqlite_pragmas(self._conn),
            }
        row = self._conn.execute("SHOW synchronous_commit").fetchone()
        return {
            "version": f"psycopg {metadata.version('psycopg')}",
            "api": "psycopg autocommit: one INSERT per row",
            "durability": {"synchronous_commit": row[0]},
        }

    def per_step(self, steps: int, run_id: str) -> float:
        """Seconds for ``steps`` single-row durable commits (one per 'step')."""
        conn = self._conn
        start = self._next
        self._next += steps
        if self.target.backend == "sqlite":
            sql = "INSERT INTO floor_rows (id, payload) VALUES (?, ?)"
            t0 = time.perf_counter()
            for i in range(start, start + steps):
                conn.execute(sql, (i, PAYLOAD))
                conn.commit()
        else:
            sql = "INSERT INTO floor_rows (id, payload) VALUES (%s, %s)"
            t0 = time.perf_counter()
            for i in range(start, start + steps):
                conn.execute(sql, (i, PAYLOAD))
        return time.perf_counter() - t0


SYSTEM = FloorSystem
