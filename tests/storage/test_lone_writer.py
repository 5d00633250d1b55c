"""The group-commit engine's lone-writer path: a write with nothing to coalesce with commits in
its caller's task (no future, no yield), and still meets every check; writers that are there
together still share commits, including those arriving while a lone write waits for the lock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import DuplicateSequenceError, ExecutionEndedError, StaleFenceError
from loom.model import Envelope, EventType
from loom.storage import SQLiteStore
from loom.storage._batching import GroupCommit, WriteRequest
from tests.support.poll import until
from tests.support.sqlite_lock import write_lock_held


def _env(eid: str, seq: int, fence: int, kind: str | None = None) -> Envelope:
    kind = kind or (EventType.EXECUTION_STARTED if seq == 0 else EventType.STEP_COMPLETED)
    return Envelope.create(
        eid,
        seq,
        kind,
        {"position": seq, "step_id": "s", "flow_id": "f"},
        fence=fence,
        recorded_at=1.0,
    )


class _Batches:
    """Records the batches a store commits: ``sizes`` of every batch, ``alone`` for each
    whether it was committed by ``commit_alone`` (in the caller's frame, no coroutine), and
    the futures its requests carried."""

    def __init__(self, store: SQLiteStore) -> None:
        self.sizes: list[int] = []
        self.alone: list[bool] = []
        self.futures: list[object] = []
        commit, commit_here = store._commit, store._commit_here
        depth = [0]

        async def recording(batch: list[Any]) -> None:
            self.sizes.append(len(batch))
            self.alone.append(False)
            self.futures.extend(r.future for r in batch)
            depth[0] += 1
            try:
                await commit(batch)
            finally:
                depth[0] -= 1

        def recording_here(batch: list[Any]) -> bool:
            done = commit_here(batch)
            if done and not depth[0]:  # not inside a recorded _commit: commit_alone's
                self.sizes.append(len(batch))
                self.alone.append(True)
                self.futures.extend(r.future for r in batch)
            return done

        append_lone = store._append_lone

        def recording_lone(env: Envelope) -> Any:
            # A plain record's lone write, committed (or refused: raised) straight through in
            # the caller's frame.
            done: Any = True
            try:
                done = append_lone(env)
                return done
            finally:
                if done is True:
                    self.sizes.append(1)
                    self.alone.append(True)
                    self.futures.append(None)

        store._commit = recording  # type: ignore[method-assign]
        store._commit_here = recording_here  # type: ignore[method-assign]
        store._append_lone = recording_lone  # type: ignore[method-assign]
        # The engine binds both when made: make it anew, over the recording ones.
        store._hot_engine = None
        store._engines.clear()


async def test_a_lone_write_commits_in_its_callers_task_without_a_future(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "lone.db")
    fence = await store.acquire_fence("e")
    seen = _Batches(store)
    for seq in range(5):
        await store.append([_env("e", seq, fence)])
    assert seen.sizes == [1] * 5
    assert seen.alone == [True] * 5  # committed in the caller's frame
    assert seen.futures == [None] * 5  # nobody waited on a future
    assert await store.last_sequence("e") == 4
    await store.close()


async def test_a_lone_write_is_still_refused_by_every_check(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "checks.db")
    old = await store.acquire_fence("z")
    await store.append([_env("z", 0, old)])
    seen = _Batches(store)
    new = await store.acquire_fence("z")  # a new holder: the old one is a zombie now
    with pytest.raises(StaleFenceError):
        await store.append([_env("z", 1, old)])
    await store.append([_env("z", 1, new)])
    with pytest.raises(DuplicateSequenceError):
        await store.append([_env("z", 1, new)])
    await store.append([_env("z", 2, new, EventType.EXECUTION_COMPLETED)])
    with pytest.raises(ExecutionEndedError):
        await store.append([_env("z", 3, new)])
    assert seen.alone == [True] * 6  # each of them took the lone path
    assert all(f is None for f in seen.futures)
    assert [e.sequence for e in await store.read("z")] == [0, 1, 2]
    # A refusal leaves the engine idle: the next lone write goes through.
    fence = await store.acquire_fence("after")
    await store.append([_env("after", 0, fence)])
    await store.close()


async def test_concurrent_writers_still_share_commits(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "many.db")
    fences = await asyncio.gather(*(store.acquire_fence(f"g{i}") for i in range(32)))
    seen = _Batches(store)
    await asyncio.gather(*(store.append([_env(f"g{i}", 0, f)]) for i, f in enumerate(fences)))
    assert sum(seen.sizes) == 32
    assert len(seen.sizes) < 4, seen.sizes  # coalesced, not 32 lone commits
    assert not any(seen.alone)
    await store.close()


async def test_writers_arriving_while_a_lone_write_waits_commit_together_after_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "behind.db"
    store = SQLiteStore(db)
    fences = {e: await store.acquire_fence(e) for e in ("a", "b", "c", "d")}
    seen = _Batches(store)
    async with write_lock_held(db):
        # Alone on an idle engine, "a" finds the lock busy and waits for it on the writer
        # thread; the others arrive meanwhile and queue behind it.
        lone = asyncio.ensure_future(store.append([_env("a", 0, fences["a"])]))
        await until(lambda: store._thread is not None, "the lone write to wait on the thread")
        others = [
            asyncio.ensure_future(store.append([_env(e, 0, fences[e])])) for e in ("b", "c", "d")
        ]
        await until(lambda: len(seen.sizes) == 1 and all(not o.done() for o in others), "queue")
    await asyncio.wait_for(asyncio.gather(lone, *others), 20)
    # The lone write (tried in its caller's frame, then on the thread), then one batch of
    # everything that queued behind it.
    assert seen.sizes == [1, 3]
    assert seen.alone == [False, False]
    for e in fences:
        assert await store.last_sequence(e) == 0
    await store.close()


async def test_steps_of_concurrent_executions_share_commits(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "flows.db")

    @loom.step(id="bump")
    async def bump(x: int) -> int:
        return x + 1

    @loom.flow(id="counting")
    async def counting(ctx: loom.WorkflowContext) -> int:
        x = 0
        for _ in range(10):
            x = await ctx.run(bump, x)
        return x

    runtime = loom.WorkflowRuntime(store)
    runtime.register(counting)
    seen = _Batches(store)
    handles = await asyncio.gather(*(runtime.start(counting) for _ in range(8)))
    assert await asyncio.gather(*(h.result() for h in handles)) == [10] * 8
    # 8 executions x (start + 10 steps + end), written by 8 concurrent drivers: most commits
    # carry several of them.
    assert sum(seen.sizes) >= 8 * 12
    assert len(seen.sizes) < sum(seen.sizes) / 2, seen.sizes
    await runtime.close()


async def test_an_engine_write_queued_behind_a_lone_one_gets_its_outcome() -> None:
    # The engine alone, over a run_batch that parks: the second writer queues (with a future)
    # behind the lone one in flight and is committed by a batch started when that one ends.
    gate = asyncio.Event()
    batches: list[list[str]] = []

    class Req(WriteRequest):
        pass

    async def run_batch(batch: list[Req]) -> None:
        batches.append([r.result for r in batch])
        if len(batches) == 1:
            await gate.wait()
        for r in batch:
            r.result = f"{r.result}!"

    engine: GroupCommit[Req] = GroupCommit(run_batch)
    first, second = Req(result="a"), Req(result="b")
    one = asyncio.ensure_future(engine.submit(first))
    await until(lambda: batches, "the lone write to start")
    two = asyncio.ensure_future(engine.submit(second))
    await until(lambda: second.future is not None, "the second write to queue")
    gate.set()
    assert await one == "a!" and await two == "b!"
    assert batches == [["a"], ["b"]]
    assert first.future is None
