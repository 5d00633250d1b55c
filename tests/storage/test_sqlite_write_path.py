"""SQLite's per-step write path: four statements, and a contended lock still waited for."""

from __future__ import annotations

import asyncio
from pathlib import Path

from loom.model import Envelope, EventType
from loom.storage import SQLiteStore
from tests.support.poll import until
from tests.support.sqlite_lock import write_lock_held


def _env(eid: str, seq: int, fence: int) -> Envelope:
    kind = EventType.EXECUTION_STARTED if seq == 0 else EventType.STEP_COMPLETED
    return Envelope.create(
        eid,
        seq,
        kind,
        {"position": seq, "step_id": "s", "flow_id": "f"},
        fence=fence,
        recorded_at=1.0,
    )


async def test_an_uncontended_append_is_begin_one_read_insert_commit(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "path.db")
    fence = await store.acquire_fence("e")
    await store.append([_env("e", 0, fence)])
    seen: list[str] = []
    store._writer_conn().set_trace_callback(seen.append)
    for seq in range(1, 21):
        await store.append([_env("e", seq, fence)])
    store._writer_conn().set_trace_callback(None)
    verbs = [s.split()[0].upper() for s in seen]
    # The first reads the fence and the tail; the others find no other connection committed
    # since (data_version) and use the tail this writer wrote: one statement each.
    assert len(verbs) == 5 + 4 * 19, seen
    assert verbs[:5] == ["BEGIN", "PRAGMA", "SELECT", "INSERT", "COMMIT"]
    assert verbs[5:] == ["BEGIN", "PRAGMA", "INSERT", "COMMIT"] * 19
    assert all(s == "PRAGMA data_version" for s in seen if s.startswith("PRAGMA"))  # no toggling
    assert await store.last_sequence("e") == 20
    await store.close()


async def test_an_append_behind_another_connections_write_lock_waits_and_commits(
    tmp_path: Path,
) -> None:
    db = tmp_path / "busy.db"
    store = SQLiteStore(db)
    fence = await store.acquire_fence("e")
    await store.append([_env("e", 0, fence)])
    async with write_lock_held(db):
        append = asyncio.ensure_future(store.append([_env("e", 1, fence)]))
        # The loop's attempt found the lock busy at once (busy timeout 0 on the writer), so the
        # batch went to the writer thread, which waits for the lock (busy timeout raised).
        await until(lambda: store._thread is not None, "the writer thread to take the batch")
        assert not append.done()
    await asyncio.wait_for(append, 20)
    assert await store.last_sequence("e") == 1
    # The writer connection is back to not waiting: the next append commits on the loop.
    await store.append([_env("e", 2, fence)])
    assert store._writer_conn().execute("PRAGMA busy_timeout").fetchone()[0] == 0
    await store.close()
