"""Opening the store a command names, without ever writing where the command only reads.

The one place the CLI turns ``--store`` / ``--db`` / ``--app``'s runtime into a store. Three
modes: ``read`` (must exist, must be a Loom store, opened read-only: nothing on disk changes),
``write`` (must exist and be a Loom store: changing executions never creates a database), and
``create`` (commands that start executions may create one).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from loom.errors import ConfigurationError, LoomError, SchemaVersionError, StorageError
from loom.storage import SQLiteStore, Store

__all__ = ["Mode", "StoreNotFoundError", "describe", "open_store_url", "resolve_url"]

Mode = Literal["read", "write", "create"]

DEFAULT_DB = "loom.db"


class StoreNotFoundError(StorageError):
    """The named store does not exist (and the command does not create one)."""

    code = "store_not_found"


def resolve_url(store: str | None, db: str | None) -> str | None:
    """``--store`` wins over ``--db``; ``--db`` takes SQLite paths only."""
    if store and db:
        raise ConfigurationError("give --store or --db, not both")
    if db is not None:
        if "://" in db and not db.startswith("sqlite://"):
            raise ConfigurationError(
                f"--db takes a SQLite file path, not {_redact(db)!r}",
                hint="Pass a server URL with --store (or LOOM_STORE)",
            )
        return db
    return store


def describe(url: str) -> str:
    return _redact(url)


def _redact(url: str) -> str:
    # Never print a password from a connection URL.
    if "://" in url and "@" in url:
        scheme, _, rest = url.partition("://")
        creds, _, host = rest.rpartition("@")
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in creds else url
    return url


def _pg_schema(url: str) -> tuple[str, str]:
    """``?schema=NAME`` picks the Loom schema (default ``loom``); the rest goes to psycopg."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), "loom")
    rest = urlencode([(k, v) for k, v in query if k != "schema"])
    return urlunsplit(parts._replace(query=rest)), schema


def _sqlite_path(url: str) -> str:
    if url.startswith("sqlite:///"):
        return (
            url[len("sqlite:///") :] if url.startswith("sqlite:////") else url[len("sqlite://") :]
        )
    if url.startswith("sqlite://"):
        raise ConfigurationError(f"a SQLite URL looks like sqlite:///path/to/loom.db, not {url!r}")
    return url


async def open_store_url(url: str, mode: Mode) -> Store:
    """Open the store at ``url`` for ``mode`` (see the module docstring)."""
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from loom.storage.postgres import PostgresStore
        except ImportError as exc:
            raise ConfigurationError(
                f"a postgresql:// store needs the 'postgres' extra ({exc.name} is not installed)",
                hint="pip install 'loom-runtime[postgres]'",
            ) from exc
        dsn, schema = _pg_schema(url)
        return await PostgresStore.open(dsn, schema=schema)
    if "://" in url and not url.startswith("sqlite:"):
        raise ConfigurationError(
            f"unknown store URL {_redact(url)!r}",
            hint="Use sqlite:///path/to/loom.db, a bare path, or postgresql://...",
        )
    path = _sqlite_path(url)
    _check_sqlite(path, mode)
    try:
        if mode == "read":
            return _ReadOnlySQLiteStore(path)
        return SQLiteStore(path)
    except LoomError:
        raise
    except sqlite3.Error as exc:
        raise StorageError(f"cannot open {path}: {exc}") from exc


def _check_sqlite(path: str, mode: Mode) -> None:
    """Refuse, before anything touches the file, what is not (or not yet) a Loom database."""
    p = Path(path)
    if p.is_dir():
        raise ConfigurationError(f"{path} is a directory, not a Loom database")
    if not p.exists():
        if mode == "create":
            return
        raise StoreNotFoundError(
            f"no Loom database at {path}",
            hint="Nothing was created. Pass --db/--store (or set LOOM_DB/LOOM_STORE) to the "
            "store your flows use; `loom start` creates one",
        )
    if p.stat().st_size == 0 and mode == "create":
        return
    try:
        conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StorageError(f"cannot open {path}: {exc}") from exc
    try:
        try:
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        except sqlite3.DatabaseError as exc:
            raise StorageError(
                f"{path} is not a SQLite database ({exc})", hint="Nothing was changed"
            ) from exc
        if "loom_meta" not in tables or "loom_events" not in tables:
            raise StorageError(
                f"{path} is not a Loom database (no loom_meta/loom_events tables)",
                hint="Nothing was changed; point --db at the file your runtime writes",
            )
        row = conn.execute("SELECT value FROM loom_meta WHERE key = 'schema_version'").fetchone()
        if row is not None and int(row[0]) > _SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{path} has Loom schema version {row[0]}; this Loom reads up to {_SCHEMA_VERSION}",
                hint="Upgrade Loom to read it",
            )
    finally:
        conn.close()


def _schema_version() -> int:
    from loom.storage import sqlite as _sqlite

    return int(_sqlite.SCHEMA_VERSION)


_SCHEMA_VERSION = _schema_version()


class _ReadOnlySQLiteStore(SQLiteStore):
    """A SQLite store opened with ``mode=ro``: no schema creation, no journal switch, no
    write. (Swap for ``loom.storage.open_store(url, read_only=True)`` once it exists.)"""

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            f"{Path(self.path).resolve().as_uri()}?mode=ro",
            uri=True,
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        conn.execute("PRAGMA query_only = ON")
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        pass  # checked by _check_sqlite; a reader never creates or upgrades a schema


def env_default() -> str:
    return os.environ.get("LOOM_DB") or DEFAULT_DB
