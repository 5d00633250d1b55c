"""``open_store(url)``: one spelling of "which store" for the CLI, the console and programs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from loom.errors import ConfigurationError

if TYPE_CHECKING:
    from loom.storage.postgres import PostgresStore
    from loom.storage.sqlite import SQLiteStore

__all__ = ["open_store"]

_POSTGRES = ("postgresql://", "postgres://")


async def open_store(
    url: str | os.PathLike[str], *, read_only: bool = False, create: bool = True, **options: Any
) -> SQLiteStore | PostgresStore:
    """Open the store ``url`` names: ``sqlite:///path`` (or a bare path) or
    ``postgresql://user@host:port/db`` (``?schema=name`` picks the Loom schema, default
    ``loom``). As in SQLAlchemy, ``sqlite:///loom.db`` is relative to the working directory
    and ``sqlite:////var/lib/loom.db`` is absolute.

    ``read_only=True`` never writes: SQLite opens the file with ``mode=ro`` (no schema
    creation, no journal switch) and refuses anything that is not a Loom database with
    ``NotALoomDatabaseError``; a read-only PostgreSQL store refuses writes. ``create=False``
    refuses to make a new SQLite file. ``options`` go to the store's constructor. A
    ``postgresql://`` URL never becomes a file name: without the ``postgres`` extra it is a
    ``ConfigurationError`` saying what to install.
    """
    text = os.fspath(url)
    if not text:
        raise ConfigurationError(
            "an empty store URL", hint="Pass sqlite:///path or postgresql://..."
        )
    if text.startswith(_POSTGRES):
        try:
            from loom.storage.postgres import PostgresStore
        except ImportError as exc:
            raise ConfigurationError(
                f"{text.split('@')[-1]!r} is a PostgreSQL URL, but the 'postgres' extra is not "
                f"installed ({exc.name} is missing)",
                hint="pip install 'loom-runtime[postgres]'",
            ) from exc
        parts = urlsplit(text)
        query = dict(kv.split("=", 1) for kv in parts.query.split("&") if "=" in kv)
        schema = unquote(query.pop("schema", options.pop("schema", "loom")))
        rest = "&".join(f"{k}={v}" for k, v in query.items())
        dsn = parts._replace(query=rest).geturl()
        return await PostgresStore.open(dsn, schema=schema, read_only=read_only, **options)
    if "://" in text and not text.startswith("sqlite://"):
        scheme = text.split("://", 1)[0]
        raise ConfigurationError(
            f"unknown store URL scheme {scheme!r}",
            hint="Use sqlite:///path/to/loom.db, a plain path, or postgresql://user@host/db",
        )
    from loom.storage.sqlite import SQLiteStore

    path = text
    if text.startswith("sqlite://"):
        # sqlite:///relative.db and sqlite:////abs/path.db, as SQLAlchemy spells them.
        path = unquote(urlsplit(text).path)
        path = path[1:] if path.startswith("/") else path
        if not path:
            raise ConfigurationError(f"{text!r} names no file", hint="sqlite:///path/to/loom.db")
    return SQLiteStore(path, read_only=read_only, create=create, **options)
