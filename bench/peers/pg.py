"""PostgreSQL housekeeping: a database per system, created before the run and dropped after."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["create_databases", "drop_databases", "dsn_for", "server_info"]


def dsn_for(base: str, dbname: str) -> str:
    """``base`` (a ``postgresql://`` URL) pointing at database ``dbname`` instead."""
    parts = urlsplit(base)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"the PostgreSQL DSN must be a postgresql:// URL, not {base!r}")
    return urlunsplit((parts.scheme, parts.netloc, f"/{dbname}", parts.query, parts.fragment))


def _admin(base: str) -> Any:
    import psycopg

    return psycopg.connect(base, autocommit=True, connect_timeout=5)


def server_info(base: str) -> dict[str, Any]:
    """Version and durability settings of the server; raises if it cannot be reached."""
    with _admin(base) as conn:
        return {
            "server_version": conn.execute("SHOW server_version").fetchone()[0],
            "synchronous_commit": conn.execute("SHOW synchronous_commit").fetchone()[0],
            "fsync": conn.execute("SHOW fsync").fetchone()[0],
            "wal_sync_method": conn.execute("SHOW wal_sync_method").fetchone()[0],
        }


def _drop(conn: Any, name: str) -> None:
    from psycopg import sql

    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def create_databases(base: str, names: list[str]) -> None:
    from psycopg import sql

    with _admin(base) as conn:
        for name in names:
            _drop(conn, name)
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_databases(base: str, names: list[str]) -> None:
    with _admin(base) as conn:
        for name in names:
            _drop(conn, name)
