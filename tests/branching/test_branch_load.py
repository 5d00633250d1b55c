"""Loading a branch reads its seeded snapshot plus its own tail: never the prefix it copied
from its parent, however long (counted by a store proxy, as bench/branching.py does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import loom
from loom.storage import SQLiteStore

PREFIX_STEPS = 60


@loom.step(id="tick")
async def tick(i: int) -> int:
    return i


@loom.flow(id="long-then-gate", version="1")
async def long_then_gate(ctx: loom.WorkflowContext, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.run(tick, i)
    decision = await ctx.suspend("Go")
    return total + await ctx.run(tick, int(decision["extra"]))


class CountingStore:
    """Every ``read`` of the wrapped store: (execution, from_sequence, events returned)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads: list[tuple[str, int, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def read(self, execution_id: str, **kw: Any) -> list[loom.Envelope]:
        out: list[loom.Envelope] = await self.inner.read(execution_id, **kw)
        self.reads.append((execution_id, kw.get("from_sequence", 0), len(out)))
        return out


async def test_a_branch_loads_from_its_snapshot_and_own_tail(tmp_path: Path) -> None:
    inner = SQLiteStore(tmp_path / "l.db")
    store = CountingStore(inner)
    rt = loom.WorkflowRuntime(store, timers=False)  # type: ignore[arg-type]
    rt.register(long_then_gate)
    handle = await rt.start(long_then_gate, PREFIX_STEPS, execution_id="p")
    gate = (await handle.wait_for_suspend(timeout=60)).last_sequence
    assert gate > PREFIX_STEPS  # the prefix a fork copies is long
    branch = await rt.fork("p", gate, execution_id="b")
    own_first = gate + 1  # EXECUTION_FORKED, then the re-opened gate

    store.reads.clear()
    state = await rt.load_state("b")
    assert state is not None and state.last_sequence == branch.state.last_sequence
    assert [r[0] for r in store.reads] == ["b"], store.reads
    assert sum(r[2] for r in store.reads) == 0, store.reads  # the snapshot is at the head

    result = await (await rt.resume("b", "Go", {"extra": 5})).result(timeout=60)
    assert result == sum(range(PREFIX_STEPS)) + 5
    store.reads.clear()
    state = await rt.load_state("b")
    assert state is not None and state.status.value == "completed"
    assert all(eid == "b" and start >= own_first for eid, start, _ in store.reads), store.reads
    tail = state.last_sequence - branch.state.last_sequence
    assert sum(r[2] for r in store.reads) <= tail, store.reads
    await rt.close()
    await inner.close()
