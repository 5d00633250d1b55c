"""SQLite's straight-through lone append (one plain record, no other writer): it writes exactly
the row the general write path writes, refuses exactly what that path refuses (with the same
errors), and crosses the same fault points."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from loom import faults
from loom.errors import (
    DuplicateSequenceError,
    ExecutionEndedError,
    LoomError,
    StaleFenceError,
    StorageWriteError,
    WriteOutcome,
)
from loom.model import Envelope, EventType, StepCompleted
from loom.storage import SQLiteStore
from loom.storage import sqlite as sqlite_store
from loom.storage._common import batch_head, plain_record
from tests.support.poll import until


class _Lone:
    """Counts the appends ``store`` committed or refused straight through (``taken``); with
    ``off`` the straight path is never taken, so the store runs its general write path."""

    def __init__(self, store: SQLiteStore, *, off: bool = False) -> None:
        self.taken = 0
        append_lone = store._append_lone

        def counting(env: Envelope) -> Any:
            if off:
                return False
            done: Any = True
            try:
                done = append_lone(env)
                return done
            finally:
                self.taken += done is True

        store._append_lone = counting  # type: ignore[method-assign]


def _step(eid: str, seq: int, fence: int, output: Any = None) -> Envelope:
    event = StepCompleted(seq, "s", 1, output, 1.5)
    return Envelope.of(eid, seq, event, fence=fence, recorded_at=2.25 + seq)


def _start(eid: str, fence: int) -> Envelope:
    payload = {"flow_id": "f", "flow_version": "1", "input": None, "metadata": {}}
    return Envelope.create(
        eid, 0, EventType.EXECUTION_STARTED, payload, fence=fence, recorded_at=2.0
    )


def _rows(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT * FROM loom_events ORDER BY execution_id, sequence").fetchall()


async def _refusals(store: SQLiteStore) -> list[tuple[type[BaseException], str]]:
    """Every refusal an append of one step record can meet, in order, as (type, message)."""
    seen: list[tuple[type[BaseException], str]] = []

    async def refused(env: Envelope) -> None:
        with pytest.raises(LoomError) as info:
            await store.append([env])
        seen.append((type(info.value), str(info.value)))

    old = await store.acquire_fence("z")
    await store.append([_start("z", old)])
    await store.append([_step("z", 1, old)])
    new = await store.acquire_fence("z")  # a new holder: the old one is fenced out
    await refused(_step("z", 2, old))  # the zombie's next record
    await refused(_step("z", 2, new + 1))  # a fence never issued
    await refused(_step("z", 1, new))  # a duplicate sequence
    await refused(_step("z", 3, new))  # a gap
    await store.append([_step("z", 2, new)])
    ended = Envelope.create(
        "z", 3, EventType.EXECUTION_COMPLETED, {"output": None}, fence=new, recorded_at=9.0
    )
    await store.append([ended])
    await refused(_step("z", 4, new))  # after the terminal record
    return seen


async def test_the_lone_append_writes_what_the_general_path_writes(tmp_path: Path) -> None:
    lone_store, general_store = SQLiteStore(tmp_path / "lone.db"), SQLiteStore(tmp_path / "gen.db")
    lone, general = _Lone(lone_store), _Lone(general_store, off=True)
    outputs: list[Any] = [None, 7, "é\u2028", True, 2.5, {"a": [1, None]}, [1.5, "x"]]
    for store in (lone_store, general_store):
        fence = await store.acquire_fence("e")
        await store.append([_start("e", fence)])
        for seq, output in enumerate(outputs, start=1):
            await store.append([_step("e", seq, fence, output)])
    assert lone.taken == len(outputs) and general.taken == 0
    assert _rows(tmp_path / "lone.db") == _rows(tmp_path / "gen.db")  # byte for byte
    read_lone, read_general = await lone_store.read("e"), await general_store.read("e")
    assert [e.to_dict() for e in read_lone] == [e.to_dict() for e in read_general]
    assert [e.payload_json for e in read_lone] == [e.payload_json for e in read_general]
    assert [e.checksum() for e in read_lone] == [e.checksum() for e in read_general]
    await lone_store.close()
    await general_store.close()


async def test_the_lone_append_refuses_what_the_general_path_refuses(tmp_path: Path) -> None:
    lone_store, general_store = SQLiteStore(tmp_path / "lone.db"), SQLiteStore(tmp_path / "gen.db")
    lone, general = _Lone(lone_store), _Lone(general_store, off=True)
    on_lone, on_general = await _refusals(lone_store), await _refusals(general_store)
    assert on_lone == on_general
    assert [kind for kind, _ in on_lone] == [
        StaleFenceError,
        StaleFenceError,
        DuplicateSequenceError,
        DuplicateSequenceError,
        ExecutionEndedError,
    ]
    assert lone.taken == 7 and general.taken == 0  # 2 writes + 5 refusals straight through
    assert _rows(tmp_path / "lone.db") == _rows(tmp_path / "gen.db")  # refusals left nothing
    # A refusal leaves the writer usable: the next lone write commits.
    fence = await lone_store.acquire_fence("after")
    await lone_store.append([_start("after", fence)])
    await lone_store.append([_step("after", 1, fence)])
    assert await lone_store.last_sequence("after") == 1
    await lone_store.close()
    await general_store.close()


@pytest.mark.parametrize("point", ["before_append", "before_commit", "after_append_before_ack"])
async def test_the_lone_append_crosses_every_fault_point(tmp_path: Path, point: str) -> None:
    store = SQLiteStore(tmp_path / "faults.db")
    lone = _Lone(store)
    fence = await store.acquire_fence("e")
    await store.append([_start("e", fence)])
    faults.arm(point, faults.Raise())
    try:
        with pytest.raises(StorageWriteError) as info:
            await store.append([_step("e", 1, fence)])
    finally:
        faults.disarm_all()
    assert lone.taken == 1
    committed = point == "after_append_before_ack"
    assert info.value.outcome is (WriteOutcome.COMMITTED if committed else WriteOutcome.NOT_APPLIED)
    assert await store.last_sequence("e") == (1 if committed else 0)
    await store.append([_step("e", 2 if committed else 1, fence)])  # the writer goes on
    await store.close()


class _FailingCommit:
    """The writer's cursor, whose COMMIT fails (an I/O error at commit)."""

    def __init__(self, inner: sqlite3.Cursor) -> None:
        self.inner = inner

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            raise sqlite3.OperationalError("disk I/O error")
        return self.inner.execute(sql, *args)


async def test_a_failed_commit_of_a_lone_append_stops_the_writer(tmp_path: Path) -> None:
    """An I/O error at COMMIT is never retried blindly, on this path as on the general one:
    the write fails and every later write is refused (nothing half-written stays)."""
    store = SQLiteStore(tmp_path / "commit.db")
    lone = _Lone(store)
    fence = await store.acquire_fence("c")
    await store.append([_start("c", fence)])
    real = store._writer_cursor
    store._writer_cursor = _FailingCommit(real)  # type: ignore[arg-type,assignment]
    with pytest.raises(StorageWriteError, match="COMMIT failed"):
        await store.append([_step("c", 1, fence)])
    assert lone.taken == 1
    store._writer_cursor = real  # the disk is back: the writer stays stopped all the same
    with pytest.raises(StorageWriteError, match="stopped after a failed commit"):
        await store.append([_step("c", 1, fence)])
    await store.close()
    reopened = SQLiteStore(tmp_path / "commit.db")
    assert await reopened.last_sequence("c") == 0
    await reopened.close()


async def test_a_lone_append_wakes_its_waiters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter in this process is woken by the write itself, not by a poll or the change
    watch (both set far beyond the test's deadline here)."""
    monkeypatch.setattr(sqlite_store, "_SAFETY_POLL", 3600.0)
    store = SQLiteStore(tmp_path / "wake.db", poll_interval=3600)
    lone = _Lone(store)
    fence = await store.acquire_fence("w")
    await store.append([_start("w", fence)])
    waiting = asyncio.ensure_future(store.wait_for_append("w", 0, timeout=30))
    await until(lambda: "w" in store._waiters._by_execution, "waiting")
    await store.append([_step("w", 1, fence)])
    assert lone.taken == 1
    assert await asyncio.wait_for(waiting, 10) == 1
    await store.close()


async def _refusals_after_own_tail(store: SQLiteStore) -> list[tuple[type[BaseException], str]]:
    """Each refusal met right after this store's own lone append of the execution's tail
    (what the store remembers of it, see ``SQLiteStore._tails``)."""
    seen: list[tuple[type[BaseException], str]] = []

    async def refused(env: Envelope) -> None:
        with pytest.raises(LoomError) as info:
            await store.append([env])
        seen.append((type(info.value), str(info.value)))

    older = await store.acquire_fence("t")
    fence = await store.acquire_fence("t")
    await store.append([_start("t", fence)])
    await store.append([_step("t", 1, fence)])
    await refused(_step("t", 1, fence))  # a duplicate sequence
    await store.append([_step("t", 2, fence)])
    await refused(_step("t", 4, fence))  # a gap
    await store.append([_step("t", 3, fence)])
    await refused(_step("t", 4, fence + 1))  # a fence never issued
    await store.append([_step("t", 4, fence)])
    await refused(_step("t", 5, older))  # an older fence
    return seen


async def test_a_remembered_tail_refuses_what_the_general_path_refuses(tmp_path: Path) -> None:
    lone_store, general_store = SQLiteStore(tmp_path / "lone.db"), SQLiteStore(tmp_path / "gen.db")
    lone, general = _Lone(lone_store), _Lone(general_store, off=True)
    on_lone = await _refusals_after_own_tail(lone_store)
    on_general = await _refusals_after_own_tail(general_store)
    assert on_lone == on_general
    assert [kind for kind, _ in on_lone] == [
        DuplicateSequenceError,
        DuplicateSequenceError,
        StaleFenceError,
        StaleFenceError,
    ]
    assert lone.taken == 8 and general.taken == 0
    assert _rows(tmp_path / "lone.db") == _rows(tmp_path / "gen.db")
    await lone_store.close()
    await general_store.close()


async def test_another_connections_commit_makes_the_lone_append_read_the_tail(
    tmp_path: Path,
) -> None:
    """The tail this store wrote last is trusted only while no other connection committed:
    a record or a fence written by another process in between is seen and refused on."""
    path = tmp_path / "other.db"
    store, other = SQLiteStore(path), SQLiteStore(path)  # other: another process's store
    lone = _Lone(store)
    fence = await store.acquire_fence("o")
    await store.append([_start("o", fence)])
    await store.append([_step("o", 1, fence)])
    await other.append([_step("o", 2, fence)])  # a second writer under the same fence
    with pytest.raises(DuplicateSequenceError):
        await store.append([_step("o", 2, fence)])
    await store.append([_step("o", 3, fence)])
    with sqlite3.connect(path) as conn:  # another holder moved the fence
        conn.execute("UPDATE loom_heads SET fence = fence + 1 WHERE execution_id = 'o'")
    with pytest.raises(StaleFenceError):
        await store.append([_step("o", 4, fence)])
    assert lone.taken == 4
    assert [e.sequence for e in await store.read("o")] == [0, 1, 2, 3]
    await store.close()
    await other.close()


async def test_a_new_writer_connection_reads_the_tail_again(tmp_path: Path) -> None:
    """A writer connection opened anew (as in a forked child) starts from a data_version that
    may equal the one the remembered tails were read under: they are forgotten with the old
    connection, so a fence moved meanwhile by another connection is still seen."""
    path = tmp_path / "reopen.db"
    store = SQLiteStore(path)
    fence = await store.acquire_fence("n")
    await store.append([_start("n", fence)])
    await store.append([_step("n", 1, fence)])
    assert "n" in store._tails
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE loom_heads SET fence = fence + 1 WHERE execution_id = 'n'")
    old = store._writer
    assert old is not None
    store._writer_pid = 0  # the next write opens its own connection, as after fork
    with pytest.raises(StaleFenceError):
        await store.append([_step("n", 2, fence)])
    assert store._writer is not old
    old.close()
    await store.close()


def _shapes() -> list[Envelope]:
    """Records of every shape ``batch_head`` or ``plain_record`` tells apart."""
    base = _step("e", 3, 2)
    shapes = [base, _step("e", 1, 1), _start("e", 1)]
    for change in (
        # Each with its own derived id, so that only the changed field can refuse it.
        {"sequence": 0, "envelope_id": "e#0.2"},
        {"sequence": -1, "envelope_id": "e#-1.2"},
        {"fence": 0, "envelope_id": "e#3.0"},
        {"fence": -4, "envelope_id": "e#3.-4"},
        {"payload_json": ""},
        {"recorded_at": float("nan")},
        {"recorded_at": float("inf")},
        {"recorded_at": float("-inf")},
        {"envelope_id": "explicit-id"},
        {"envelope_id": "e#3.1"},  # the derived form of another record
        {"envelope_id": ""},
        {"type": EventType.EXECUTION_COMPLETED},  # moves the summary
    ):
        shapes.append(dataclasses.replace(base, **change))
    return shapes


@pytest.mark.parametrize("env", _shapes(), ids=lambda e: f"{e.type}@{e.sequence}.{e.fence}")
def test_a_record_the_lone_path_takes_passes_every_check_of_the_general_path(
    env: Envelope,
) -> None:
    # The lone path skips batch_head for a plain_record: the two must never disagree, or a
    # check added to batch_head (as the finite-time one was) would be skipped on every step.
    if plain_record(env):
        assert batch_head([env]) == (env.execution_id, env.sequence, env.fence)


def test_the_shapes_include_plain_and_refused_records() -> None:
    shapes = _shapes()
    assert sum(plain_record(e) for e in shapes) == 2  # the two steps, nothing else
    refused = 0
    for env in shapes:
        try:
            batch_head([env])
        except (ValueError, LoomError):
            refused += 1
    assert refused >= 8


def test_each_loops_lone_appends_use_that_loops_engine(tmp_path: Path) -> None:
    """The lone append keeps one engine hot (SQLiteStore._hot_engine): with two loops in two
    threads writing in turns, every write still asks its own loop's engine, never the other
    loop's (which the last write made hot), and hands it its own loop."""
    store = SQLiteStore(tmp_path / "loops.db")
    asked: list[bool] = []
    alone = sqlite_store.GroupCommit.alone

    def checked(engine: Any, loop: Any = None) -> bool:
        running = asyncio.get_running_loop()
        asked.append(engine is store._engines.get(running) and loop is running)
        return alone(engine, loop)

    turns = [threading.Event(), threading.Event()]
    errors: list[BaseException] = []

    def writer(me: int, eid: str) -> None:
        async def go() -> None:
            fence = await store.acquire_fence(eid)
            await store.append([_start(eid, fence)])
            for seq in range(1, 6):
                assert turns[me].wait(10)
                turns[me].clear()
                await store.append([_step(eid, seq, fence)])
                turns[1 - me].set()

        try:
            asyncio.run(go())
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
            turns[1 - me].set()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite_store.GroupCommit, "alone", checked)
        threads = [threading.Thread(target=writer, args=(i, f"t{i}")) for i in range(2)]
        for t in threads:
            t.start()
        turns[0].set()
        for t in threads:
            t.join(30)
    asyncio.run(store.close())
    assert not errors, errors
    assert len(asked) >= 10 and all(asked), asked
    with sqlite3.connect(tmp_path / "loops.db") as conn:
        tails = conn.execute(
            "SELECT execution_id, max(sequence) FROM loom_events GROUP BY execution_id"
        ).fetchall()
    assert sorted(tails) == [("t0", 5), ("t1", 5)]
