"""PostgreSQL for the tests: a reachable server, or a skip (or a failure) that says why.

Every PostgreSQL test SKIPS with the reason when the server at ``PG_DSN`` (conftest.py, env
``LOOM_TEST_PG_DSN``) cannot be reached, and FAILS instead when ``LOOM_REQUIRE_POSTGRES=1`` (CI
sets it, so a broken server never passes as "all skipped"). Each test gets a fresh schema,
dropped afterwards.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from loom.storage._postgres_sql import SCHEMA_NAME
from tests.conftest import PG_DSN

__all__ = [
    "PG_DSN",
    "drop_test_schema",
    "pg_reason",
    "require_pg",
    "tagged_dsn",
    "temp_schema",
    "terminate",
]

#: Seconds a test's DROP SCHEMA waits for locks before it names and ends whoever holds them.
DROP_WAIT = 15.0

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
        await drop_test_schema(dsn, name)


async def drop_test_schema(dsn: str, schema: str) -> None:
    """Drop ``schema``; if a session still holds a lock the drop waits for, end it and fail.

    A test whose store or service left a transaction open used to hang here until the test's
    timeout, with nothing saying who held the lock. The drop runs on one connection while
    another watches it: after ``DROP_WAIT`` seconds the sessions blocking it (whatever they
    lock: a table, the schema itself, a table they are still creating) are listed with their
    application, state and last query, terminated so that the schema goes, and the test fails
    with that list. Every wait is bounded.
    """
    if not SCHEMA_NAME.fullmatch(schema):
        raise ValueError(f"not a Loom schema name: {schema!r}")
    drop = f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as dropper,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watcher,
    ):
        dropping = asyncio.ensure_future(dropper.execute(drop))
        done, _ = await asyncio.wait({dropping}, timeout=DROP_WAIT)
        if done:
            dropping.result()  # its error, if it failed
            return
        cur = await watcher.execute(
            "SELECT pid, application_name, state, left(query, 200) FROM pg_stat_activity "
            "WHERE pid = ANY(pg_blocking_pids(%s))",
            (dropper.info.backend_pid,),
        )
        blockers = await cur.fetchall()
        for pid, *_ in blockers:
            await watcher.execute("SELECT pg_terminate_backend(%s)", (pid,))
        done, _ = await asyncio.wait({dropping}, timeout=DROP_WAIT)
        if not done:
            await watcher.execute("SELECT pg_cancel_backend(%s)", (dropper.info.backend_pid,))
            await asyncio.wait({dropping}, timeout=DROP_WAIT)
    holders = [f"pid {pid} ({app or '?'}, {state}): {query}" for pid, app, state, query in blockers]
    pytest.fail(
        f"dropping schema {schema} still waited {DROP_WAIT} s after the test: something it "
        "started left a transaction open. Terminated: "
        + "; ".join(holders or ["(none found)"])
        + ("" if done else "; the drop still waited after that and was cancelled"),
        pytrace=False,
    )


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


def on_lean_poll(monkeypatch: pytest.MonkeyPatch, before_each: Callable[[], None]) -> None:
    """Make every ``poll()`` wait of the store's lean writes (``loom.storage._postgres_lean``)
    call ``before_each`` first: what a test counts or checks of the writes that wait there."""
    import select

    from loom.storage import _postgres_lean

    class Poll:
        def __init__(self) -> None:
            self._poll = select.poll()

        def register(self, fd: int, mask: int) -> None:
            self._poll.register(fd, mask)

        def poll(self, timeout: int) -> list[tuple[int, int]]:
            before_each()
            return self._poll.poll(timeout)

    class Select:
        POLLIN = select.POLLIN
        poll = Poll

    monkeypatch.setattr(_postgres_lean, "select", Select)
