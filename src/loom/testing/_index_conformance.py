"""Conformance checks of the ``ExecutionIndex`` side of a store (part of ``STORE_CHECKS``).

They run on every store that implements :class:`~loom.storage.ExecutionIndex` (memory, SQLite,
PostgreSQL, the tenant view); a store without an index passes them vacuously.
"""

from __future__ import annotations

import asyncio
import time

from loom.model import EventType, ExecutionStatus
from loom.storage import ExecutionIndex, ExecutionQuery, Store
from loom.testing._store_conformance import Reopen, _check, env

__all__: list[str] = []


def _index(store: Store) -> ExecutionIndex | None:
    return store if isinstance(store, ExecutionIndex) else None


async def _begin(store: Store, execution_id: str, flow_id: str = "f", **extra: object) -> int:
    fence = await store.acquire_fence(execution_id)
    payload = {"flow_id": flow_id, "flow_version": "v1", "input": None, **extra}
    await store.append([env(execution_id, 0, fence, EventType.EXECUTION_STARTED, payload)])
    return fence


def _suspend(execution_id: str, sequence: int, fence: int, event_type: str = "approve") -> object:
    return env(
        execution_id,
        sequence,
        fence,
        EventType.EXECUTION_SUSPENDED,
        {"position": sequence, "event_type": event_type},
    )


@_check
async def check_index_follows_the_lifecycle(store: Store, reopen: Reopen | None) -> None:
    index = _index(store)
    if index is None:
        return
    assert await index.get_summary("life") is None
    fence = await _begin(store, "life", parent_id="boss")
    started = await index.get_summary("life")
    assert started is not None and started.status is ExecutionStatus.RUNNING
    assert (started.flow_id, started.flow_version, started.parent_id) == ("f", "v1", "boss")
    assert started.cursor > 0 and started.waiting_for is None
    await store.append([env("life", 1, fence)])  # a plain step: the summary does not move
    assert await index.get_summary("life") == started
    await store.append([_suspend("life", 2, fence)])  # type: ignore[list-item]
    waiting = await index.get_summary("life")
    assert waiting is not None and waiting.status is ExecutionStatus.SUSPENDED
    assert waiting.waiting_for == "approve" and waiting.cursor > started.cursor
    assert waiting.created_at == started.created_at
    resumed = env("life", 3, fence, EventType.EXECUTION_RESUMED, {"position": 2, "payload": 1})
    done = env("life", 4, fence, EventType.EXECUTION_COMPLETED, {"output": 1})
    await store.append([resumed, done])
    final = await index.get_summary("life")
    assert final is not None and final.status is ExecutionStatus.COMPLETED
    assert final.waiting_for is None and final.cursor > waiting.cursor
    assert final.parent_id == "boss" and final.updated_at >= waiting.updated_at
    # A take-over that records a recovery moves the summary too.
    fence2 = await _begin(store, "taken")
    recovered = env("taken", 1, fence2 + 1, EventType.EXECUTION_RECOVERED, {"reason": "x"})
    before = await index.get_summary("taken")
    await store.take_over([recovered], from_fence=fence2)
    after = await index.get_summary("taken")
    assert before is not None and after is not None and after.cursor > before.cursor
    forked = env("taken", 2, fence2 + 1, EventType.EXECUTION_FORKED, {"parent_id": "life"})
    await store.append([forked])
    fork = await index.get_summary("taken")
    assert fork is not None and fork.forked_from == "life"
    # A fork record moves only forked_from: a suspended execution stays suspended.
    fence3 = await _begin(store, "gated")
    await store.append([_suspend("gated", 1, fence3)])  # type: ignore[list-item]
    marked = env("gated", 2, fence3, EventType.EXECUTION_FORKED, {"parent_id": "life"})
    await store.append([marked])
    gated = await index.get_summary("gated")
    assert gated is not None and gated.status is ExecutionStatus.SUSPENDED
    assert gated.waiting_for == "approve" and gated.forked_from == "life"


@_check
async def check_index_lists_by_keyset_pages(store: Store, reopen: Reopen | None) -> None:
    index = _index(store)
    if index is None:
        return
    ids = [f"page-{i:02d}" for i in range(7)]
    for i, execution_id in enumerate(ids):
        fence = await _begin(store, execution_id, flow_id="even" if i % 2 == 0 else "odd")
        if i != 3:
            await store.append([_suspend(execution_id, 1, fence)])  # type: ignore[list-item]
    query = ExecutionQuery(statuses=[ExecutionStatus.SUSPENDED], limit=4)
    first = await index.list_executions(query)
    assert len(first.items) == 4 and first.next_cursor is not None
    second = await index.list_executions(
        ExecutionQuery(statuses=["suspended"], limit=4, cursor=first.next_cursor)
    )
    assert len(second.items) == 2 and second.next_cursor is None
    listed = [s.execution_id for s in first.items + second.items]
    expected = sorted(
        (s for s in first.items + second.items), key=lambda s: (s.created_at, s.execution_id)
    )[::-1]
    assert listed == [s.execution_id for s in expected], "pages are newest first, no overlap"
    assert sorted(listed) == [i for n, i in enumerate(ids) if n != 3]
    assert await index.count_executions(query) == 6
    assert await index.count_executions(ExecutionQuery()) == 7
    assert await index.count_executions(ExecutionQuery(flow_id="odd")) == 3
    running = await index.list_executions(ExecutionQuery(statuses=["running"]))
    assert [s.execution_id for s in running.items] == ["page-03"]
    both = ExecutionQuery(statuses=["running", "suspended"], flow_id="odd", id_contains="-0")
    assert await index.count_executions(both) == 3
    assert await index.count_executions(ExecutionQuery(id_contains="ge-05")) == 1
    future = ExecutionQuery(created_after=time.time() + 3600)
    assert (await index.list_executions(future)).items == []
    assert await index.count_executions(ExecutionQuery(created_before=time.time() + 3600)) == 7


@_check
async def check_change_feed_is_ordered_and_wakes(store: Store, reopen: Reopen | None) -> None:
    index = _index(store)
    if index is None:
        return
    start = await index.wait_for_changes(0, timeout=0)
    fence = await _begin(store, "feed-a")
    await _begin(store, "feed-b")
    await store.append([env("feed-a", 1, fence)])  # no change
    await store.append([_suspend("feed-a", 2, fence)])  # type: ignore[list-item]
    changes = await index.changes(start)
    assert [s.execution_id for s in changes] == ["feed-b", "feed-a"]
    assert [s.cursor for s in changes] == sorted(s.cursor for s in changes)
    assert changes[1].status is ExecutionStatus.SUSPENDED
    assert [s.execution_id for s in await index.changes(start, limit=1)] == ["feed-b"]
    high = changes[-1].cursor
    assert await index.changes(high) == []
    assert await index.wait_for_changes(high, timeout=0.05) >= high
    waiter = asyncio.ensure_future(index.wait_for_changes(high, timeout=30))
    await asyncio.sleep(0)
    await _begin(store, "feed-c")
    async with asyncio.timeout(30):
        woke = await waiter
    assert woke > high
    assert [s.execution_id for s in await index.changes(high)] == ["feed-c"]


@_check
async def check_read_pages_with_a_limit(store: Store, reopen: Reopen | None) -> None:
    fence = await store.acquire_fence("paged")
    await store.append([env("paged", i, fence) for i in range(5)])
    assert [e.sequence for e in await store.read("paged", limit=2)] == [0, 1]
    assert [e.sequence for e in await store.read("paged", from_sequence=3, limit=5)] == [3, 4]
    assert await store.read("paged", from_sequence=1, limit=0) == []
    assert [e.sequence for e in await store.read("paged", from_sequence=2)] == [2, 3, 4]
