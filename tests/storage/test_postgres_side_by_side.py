"""Executions stepping side by side on one PostgreSQL store share its writes fairly.

A lone write waits for its commit in ``poll()`` on its own socket, holding the event loop (see
``loom.storage._postgres_lean``). That is right only while no other write of the store is in
flight: another writer's answer arrives on a socket only the loop watches, so it stayed unseen
while this writer committed step after step, and two executions stepping side by side ran one
at a time, the second one step every few milliseconds (it made ~1 step for 13 of the other's).

The same holds for anything else the loop watches (a read's answer, a request to an HTTP
worker, another store's write): the wait also watches the loop's own selector, and ends as
soon as any of it is ready.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

import loom
import loom._aio
from loom.storage.postgres import PostgresStore
from tests.support.pg import on_lean_poll

STEPS = 80
done_steps: dict[str, int] = {}


@loom.step(id="tick")
async def tick(execution: str) -> int:
    done_steps[execution] = done_steps.get(execution, 0) + 1
    return done_steps[execution]


@loom.flow(id="ticking", version="1")
async def ticking(ctx: loom.WorkflowContext, execution: str) -> int:
    for _ in range(STEPS):
        await ctx.run(tick, execution)
    return done_steps[execution]


@pytest.mark.postgres
async def test_two_executions_stepping_side_by_side_progress_together(
    pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    executions = 2
    done_steps.clear()
    store = await PostgresStore.open(pg_dsn, schema=schema)
    # How many of the store's writes were in flight each time one waited in poll(): one, its
    # own, or the loop would be held while the other's answer sits unseen.
    in_flight_at_poll: list[int] = []

    on_lean_poll(monkeypatch, lambda: in_flight_at_poll.append(store._writer.engine._inflight))
    runtime = loom.WorkflowRuntime(store)
    runtime.register(ticking)
    try:
        ids = [f"side-{i}" for i in range(executions)]
        handles = [await runtime.start(ticking, eid, execution_id=eid) for eid in ids]
        first = await next(asyncio.as_completed([h.result() for h in handles]))
        assert first == STEPS
        # When the first has taken all its steps, every other one has taken most of its own.
        behind = {eid: done_steps.get(eid, 0) for eid in ids}
        assert min(behind.values()) >= STEPS // 2, behind
        assert [await h.result() for h in handles] == [STEPS] * executions
        assert in_flight_at_poll, "no write waited in poll(): the test saw nothing"
        assert max(in_flight_at_poll) == 1, sorted(set(in_flight_at_poll))
    finally:
        await runtime.close()
        await store.close()
    for eid in ids:  # every step landed once, in order
        log = await _read(pg_dsn, schema, eid)
        assert log == list(range(len(log)))


@pytest.mark.postgres
async def test_a_lone_write_stops_waiting_as_soon_as_the_loop_has_io_ready(
    pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    done_steps.clear()
    eid = "poked"
    # The loop's own turn, every SHARE_LOOP_EVERY, would run the reader anyway: put it out of
    # reach, so only the wait's watching of the loop can.
    monkeypatch.setattr(loom._aio, "SHARE_LOOP_EVERY", 3600.0)
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    poked_at: list[int] = []  # steps taken when a byte was sent to a socket the loop watches
    read_at: list[int] = []  # steps taken when the loop ran that socket's reader

    def read() -> None:
        ours.recv(1)
        read_at.append(done_steps.get(eid, 0))

    def poke() -> None:  # just before a write waits in poll(), halfway through the flow
        if not poked_at and done_steps.get(eid, 0) >= STEPS // 2:
            theirs.send(b"x")
            poked_at.append(done_steps[eid])

    loop.add_reader(ours.fileno(), read)
    on_lean_poll(monkeypatch, poke)
    store = await PostgresStore.open(pg_dsn, schema=schema)
    runtime = loom.WorkflowRuntime(store)
    runtime.register(ticking)
    try:
        handle = await runtime.start(ticking, eid, execution_id=eid)
        assert await handle.result() == STEPS
    finally:
        loop.remove_reader(ours.fileno())
        ours.close()
        theirs.close()
        await runtime.close()
        await store.close()
    assert poked_at, "no write waited in poll() halfway through: the test saw nothing"
    # Run while that write still waited, or just before the next one: not steps later.
    assert read_at and read_at[0] - poked_at[0] <= 1, (poked_at, read_at)
    assert await _read(pg_dsn, schema, eid) == list(range(STEPS + 2))


async def _read(dsn: str, schema: str, execution_id: str) -> list[int]:
    store = await PostgresStore.open(dsn, schema=schema)
    try:
        return [e.sequence for e in await store.read(execution_id)]
    finally:
        await store.close()
