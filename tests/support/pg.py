"""PostgreSQL for the tests: a reachable server, or a skip (or a failure) that says why.

Every PostgreSQL test SKIPS with the reason when the server at ``PG_DSN`` (conftest.py, env
``LOOM_TEST_PG_DSN``) cannot be reached, and FAILS instead when ``LOOM_REQUIRE_POSTGRES=1`` (CI
sets it, so a broken server never passes as "all skipped"). Each test gets a fresh schema,
dropped afterwards.
"""

from __future__ import annotations

import functools
import itertools
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from loom.storage.postgres import PostgresStore
from tests.conftest import PG_DSN

__all__ = ["PG_DSN", "pg_reason", "require_pg", "tagged_dsn", "temp_schema", "terminate"]

_counter = itertools.count()


@functools.lru_cache(maxsize=1)
def pg_reason() -> str | None:
    """None if PostgreSQL answers at PG_DSN, else why not."""
    try:
        with psycopg.connect(PG_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL is not reachable at {PG_DSN} ({type(exc).__name__}: {exc})".strip()
    return None


def require_pg() -> str:
    """The DSN, or skip the test (fail it when LOOM_REQUIRE_POSTGRES=1)."""
    reason = pg_reason()
    if reason is not None:
        if os.environ.get("LOOM_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{reason}; LOOM_REQUIRE_POSTGRES=1 makes this a failure", pytrace=False)
        pytest.skip(f"{reason}; set LOOM_TEST_PG_DSN or start PostgreSQL")
    return PG_DSN


def new_schema_name() -> str:
    return f"loom_t_{os.getpid()}_{next(_counter)}_{secrets.token_hex(3)}"


@asynccontextmanager
async def temp_schema(dsn: str) -> AsyncIterator[str]:
    """A fresh schema name, dropped (with everything in it) on exit."""
    name = new_schema_name()
    try:
        yield name
    finally:
        await PostgresStore.drop_schema(dsn, name)


def tagged_dsn(dsn: str, tag: str) -> str:
    """``dsn`` with an application_name, so a test can find (and terminate) its sessions."""
    return make_conninfo(dsn, application_name=tag)


def terminate(dsn: str, tag: str) -> int:
    """Terminate every session whose application_name is ``tag``; return how many."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            (tag,),
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)
