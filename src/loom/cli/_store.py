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
from urllib.parse import unquote, urlsplit

from loom.errors import ConfigurationError, LoomError, SchemaVersionError, StorageError
from loom.storage import Store, open_store

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


def _sqlite_path(url: str) -> str:
    if url.startswith("sqlite://"):
        # As open_store (and SQLAlchemy) read it: sqlite:///rel.db, sqlite:////abs/path.db.
        path = unquote(urlsplit(url).path)
        return path[1:] if path.startswith("/") else path
    return url


async def open_store_url(url: str, mode: Mode) -> Store:
    """Open the store at ``url`` for ``mode`` (see the module docstring)."""
    if "://" not in url or url.startswith("sqlite:"):
        # Refused here, with one line naming the problem, before SQLite touches the file.
        _check_sqlite(_sqlite_path(url), mode)
    try:
        return await open_store(url, read_only=mode == "read", create=mode == "create")
    except LoomError:
        raise
    except sqlite3.Error as exc:
        raise StorageError(f"cannot open {describe(url)}: {exc}") from exc


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


def env_default() -> str:
    return os.environ.get("LOOM_DB") or DEFAULT_DB
