"""An agent on PostgreSQL: a tool result's blob is written in the same transaction (the same
statement) as the step event that first names it, so a turn is two commits and no fault can
leave a stored blob without its event, or an event naming a blob the store lacks."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

import loom
from loom import faults
from loom.llm import ScriptedProvider, reply, tool_calls
from loom.storage import AppendsWithBlobs
from loom.testing import SkippingClock
from tests.support.pg import require_pg, temp_schema

pytestmark = pytest.mark.postgres

RESULTS: list[int] = []


@loom.tool
def page(i: int) -> str:
    """Read page i."""
    RESULTS.append(i)
    return f"page {i}: " + "x" * 2048


@pytest.fixture
async def pg() -> AsyncIterator[tuple[str, str]]:
    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        yield dsn, schema


def reader(turns: int) -> loom.Agent:
    script: list[Any] = [tool_calls(("page", {"i": i})) for i in range(turns)]
    return loom.agent(
        id="pg-reader",
        provider=ScriptedProvider([*script, reply("read")], by_turn=True),
        model="m",
        tools=[page],
        max_turns=turns + 2,
    )


def _stored(dsn: str, schema: str) -> tuple[set[str], list[str]]:
    """(every stored blob hash, every event payload) of the schema, read from the database."""
    with psycopg.connect(dsn) as conn:
        blobs = {r[0] for r in conn.execute(f'SELECT hash FROM "{schema}".blobs')}
        payloads = [r[0] for r in conn.execute(f'SELECT payload FROM "{schema}".events')]
    return blobs, payloads


def _named(payloads: list[str], blobs: set[str]) -> set[str]:
    return {h for h in blobs if any(h in p for p in payloads)}


async def test_a_turn_is_two_writes_and_the_blob_rides_in_the_tool_steps(
    pg: tuple[str, str],
) -> None:
    from loom.storage.postgres import PostgresStore

    dsn, schema = pg
    store = await PostgresStore.open(dsn, schema=schema)
    assert isinstance(store, AppendsWithBlobs)
    writes: Counter[str] = Counter()
    submit = store._writer.engine.submit

    async def counting(req: Any) -> Any:
        params = req.params if isinstance(req.params, dict) else {}
        writes[req.kind + ("+blobs" if "b_hashes" in params else "")] += 1
        return await submit(req)

    store._writer.engine.submit = counting  # type: ignore[method-assign]
    turns = 5
    rt = loom.WorkflowRuntime(store, clock=SkippingClock(), timers=False)
    agent = reader(turns)
    rt.register(agent)
    result = await (await rt.start(agent, "read", execution_id="pg-1")).result()
    assert result["turns"] == turns + 1
    await rt.close()
    # Per turn: the model call's event (its first turn also stores the input message with
    # it) and the tool step's event with its result's blob. No blob write of its own.
    assert writes["blob"] == 0, writes
    assert writes["append+blobs"] == turns + 1, writes  # every tool step + the first model call
    snapshots = writes["snapshot"]
    total = sum(writes.values()) - snapshots
    # start + (model + tool) per turn + the last model call + the completion (which carries
    # the agent's outcome record)
    assert total == 1 + 2 * turns + 1 + 1, writes
    blobs, payloads = _stored(dsn, schema)
    assert len(blobs) == turns + 1 and _named(payloads, blobs) == blobs


@pytest.mark.parametrize("on_hit", [1, 2])
async def test_a_failed_commit_after_the_tool_leaves_no_unnamed_blob(
    pg: tuple[str, str], on_hit: int
) -> None:
    """Commit 1 after the tool's effect is its record (with the blob), commit 2 the next model
    call's. Put-then-append (the fallback) would store the blob in commit 1 and the event in
    commit 2: a fault at 2 left a blob no event names."""
    from loom.storage.postgres import PostgresStore

    dsn, schema = pg
    RESULTS.clear()

    @loom.tool(name="page")
    def failing_page(i: int) -> str:
        """Read page i (and make a later commit fail once)."""
        if not RESULTS:
            faults.arm("before_commit", faults.Raise(), on_hit=on_hit)
        RESULTS.append(i)
        return f"page {i}: " + "x" * 2048

    agent = loom.agent(
        id="pg-fault",
        provider=ScriptedProvider([tool_calls(("page", {"i": 1})), reply("ok")], by_turn=True),
        model="m",
        tools=[failing_page],
    )
    store = await PostgresStore.open(dsn, schema=schema)
    rt = loom.WorkflowRuntime(store, clock=SkippingClock(), timers=False)
    rt.register(agent)
    handle = await rt.start(agent, "read", execution_id="pg-2")
    with pytest.raises(loom.LoomError):
        await handle.result()
    blobs, payloads = _stored(dsn, schema)
    assert _named(payloads, blobs) == blobs  # nothing stored that no event names
    tool_recorded = any('"agents.tool:page"' in p for p in payloads)
    if on_hit == 1:
        # The tool result's blob failed with its event, in one transaction; only the input
        # message (stored with the first model call's event) is there.
        assert len(blobs) == 1 and not tool_recorded
    else:
        assert len(blobs) == 2 and tool_recorded
    again = await rt.recover("pg-2")
    assert (await again.result())["output"] == "ok"
    # The tool ran again only if its record had not landed.
    expected = [1, 1] if on_hit == 1 else [1]
    assert expected == RESULTS
    blobs, payloads = _stored(dsn, schema)
    assert len(blobs) == 2 and _named(payloads, blobs) == blobs
    await rt.close()


async def test_votes_are_typed_events_on_postgresql_and_the_index_follows(
    pg: tuple[str, str],
) -> None:
    from loom.storage import ExecutionQuery
    from loom.storage.postgres import PostgresStore
    from tests.agents.golden_agent import make_agent

    dsn, schema = pg
    store = await PostgresStore.open(dsn, schema=schema)
    rt = loom.WorkflowRuntime(store, clock=SkippingClock(), timers=False)
    agent = make_agent()
    rt.register(agent)
    await (await rt.start(agent, "refund o-7", execution_id="pg-v")).wait_for_suspend()
    summary = await store.get_summary("pg-v")
    assert summary is not None and summary.waiting_for == "agents.approval"
    await (await loom.agents.vote(rt, "pg-v", by="alice")).wait_for_suspend()
    result = await (await loom.agents.vote(rt, "pg-v", by="bob")).result()
    assert result["output"] == "Both in stock; o-7 refunded."
    events = await store.read("pg-v")
    assert [e.payload["by"] for e in events if e.type == "agents.vote_recorded"] == [
        "alice",
        "bob",
    ]
    summary = await store.get_summary("pg-v")
    assert summary is not None and summary.status.value == "completed"
    page_ = await store.list_executions(ExecutionQuery(statuses=["suspended"]))
    assert [s.execution_id for s in page_.items] == []
    await rt.close()
