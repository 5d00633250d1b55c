"""PostgresStore.take_over across separate pools (as across processes): the conformance kit
races take-overs inside one store, where they share a group-commit transaction; here each racer
has its own connection, so a loser waits on the winner's row lock and must learn, after the
winner commits, that it lost (and change nothing)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from loom.errors import (
    DuplicateSequenceError,
    ExecutionAlreadyExistsError,
    StaleFenceError,
)
from loom.storage.postgres import PostgresStore
from loom.testing._store_conformance import env
from tests.support.pg import require_pg, temp_schema

pytestmark = pytest.mark.postgres


@pytest.fixture
async def stores() -> AsyncIterator[list[PostgresStore]]:
    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        opened = await asyncio.gather(
            *(PostgresStore.open(dsn, schema=schema, group_commit=k % 2 == 0) for k in range(8))
        )
        try:
            yield list(opened)
        finally:
            await asyncio.gather(*(s.close() for s in opened))


async def test_one_of_eight_pools_takes_over_a_waiting_execution(
    stores: list[PostgresStore],
) -> None:
    fence = await stores[0].acquire_fence("held")
    await stores[0].append([env("held", 0, fence)])
    results = await asyncio.gather(
        *(s.take_over([env("held", 1, fence + 1)], from_fence=fence) for s in stores),
        return_exceptions=True,
    )
    assert results.count(None) == 1, results
    losers = [r for r in results if r is not None]
    assert all(isinstance(r, StaleFenceError | DuplicateSequenceError) for r in losers), losers
    assert await stores[1].current_fence("held") == fence + 1
    assert [e.sequence for e in await stores[2].read("held")] == [0, 1]


async def test_one_of_eight_pools_creates_an_untouched_execution(
    stores: list[PostgresStore],
) -> None:
    results = await asyncio.gather(
        *(s.take_over([env("fresh", 0, 1)], from_fence=0) for s in stores),
        return_exceptions=True,
    )
    assert results.count(None) == 1, results
    losers = [r for r in results if r is not None]
    assert all(isinstance(r, StaleFenceError | ExecutionAlreadyExistsError) for r in losers), losers
    assert await stores[3].current_fence("fresh") == 1
    assert [e.sequence for e in await stores[4].read("fresh")] == [0]
