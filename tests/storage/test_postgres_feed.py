"""The PostgreSQL change feed never skips a change: cursors are taken in commit order, so a
reader racing many concurrent writers (separate pools, so separate transactions) still sees
every execution start exactly as often as it polls past it."""

from __future__ import annotations

import asyncio
import time

import pytest

from loom.model import Envelope, EventType
from loom.storage.postgres import PostgresStore
from tests.support.pg import require_pg, temp_schema

pytestmark = pytest.mark.postgres

WRITERS = 4
PER_WRITER = 60


def _start(execution_id: str) -> list[Envelope]:
    payload = {"flow_id": "f", "flow_version": "1", "input": None}
    return [
        Envelope.create(
            execution_id, 0, EventType.EXECUTION_STARTED, payload, fence=1, recorded_at=time.time()
        )
    ]


async def test_a_reader_racing_concurrent_writers_sees_every_change() -> None:
    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        reader = await PostgresStore.open(dsn, schema=schema)
        # group_commit=False: every start is its own transaction, many in flight at once.
        writers = [
            await PostgresStore.open(dsn, schema=schema, group_commit=False, pool_max=8)
            for _ in range(WRITERS)
        ]
        expected = {f"w{w}-{i}" for w in range(WRITERS) for i in range(PER_WRITER)}
        seen: set[str] = set()
        done = asyncio.Event()

        async def read() -> None:
            after = 0
            while True:
                batch = await reader.changes(after, 1000)
                for s in batch:
                    assert s.cursor > after
                    after = s.cursor
                    seen.add(s.execution_id)
                if not batch:
                    if done.is_set() and not await reader.changes(after, 1):
                        return
                    await reader.wait_for_changes(after, timeout=0.05)

        async def write(w: int) -> None:
            store = writers[w]
            await asyncio.gather(
                *(store.take_over(_start(f"w{w}-{i}"), from_fence=0) for i in range(PER_WRITER))
            )

        try:
            reading = asyncio.ensure_future(read())
            await asyncio.gather(*(write(w) for w in range(WRITERS)))
            done.set()
            await asyncio.wait_for(reading, 60)
            missing = expected - seen
            assert not missing, f"the feed skipped {len(missing)} committed changes"
        finally:
            for s in [reader, *writers]:
                await s.close()
