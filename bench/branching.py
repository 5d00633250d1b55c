"""Fork cost against the length of the prefix it copies, and what loading a branch reads.

    python bench/branching.py [--lengths 10,1000,10000] [--forks 3] [--store sqlite|memory|pg]
                              [--pg-dsn DSN]

For each parent length N (a log of N step records after its start), the parent is forked at
its head ``--forks`` times; the table gives the median wall time of one fork, that time per
copied event, and the events a load of the branch then reads: right after the fork, and after
the branch appended 10 events of its own. A branch loads from the snapshot the fork seeded,
so it reads only its own tail (0, then 10), never the N events of the parent; the parent, with
no snapshot, reads all N + 1. Target: the per-event fork cost stays flat as N grows (the fork
does not grow faster than the prefix it copies).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import loom
from loom.model import EventType
from loom.storage import InMemoryStore, SQLiteStore


class CountingStore:
    """A store proxy that counts the events ``read`` returns (what a load costs)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.events_read = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def read(self, execution_id: str, **kw: Any) -> list[loom.Envelope]:
        out: list[loom.Envelope] = await self.inner.read(execution_id, **kw)
        self.events_read += len(out)
        return out


def _log(eid: str, first: int, count: int, fence: int) -> list[loom.Envelope]:
    out = []
    for seq in range(first, first + count):
        if seq == 0:
            out.append(
                loom.Envelope.create(
                    eid,
                    0,
                    EventType.EXECUTION_STARTED,
                    {"flow_id": "bench", "flow_version": "1", "input": None},
                    fence=fence,
                    recorded_at=time.time(),
                )
            )
            continue
        payload = {"position": seq - 1, "step_id": "s", "attempt": 1, "output": seq}
        out.append(
            loom.Envelope.create(
                eid, seq, EventType.STEP_COMPLETED, payload, fence=fence, recorded_at=time.time()
            )
        )
    return out


async def _open(kind: str, folder: Path, dsn: str | None) -> Any:
    if kind == "memory":
        return InMemoryStore()
    if kind == "sqlite":
        return SQLiteStore(folder / "branching.db")
    from loom.storage.postgres import PostgresStore

    schema = f"loom_bench_branching_{os.getpid()}"
    await PostgresStore.drop_schema(dsn or "", schema)
    return await PostgresStore.open(dsn or "", schema=schema)


async def bench(kind: str, lengths: list[int], forks: int, dsn: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        raw = await _open(kind, Path(tmp), dsn)
        store = CountingStore(raw)
        rt = loom.WorkflowRuntime(store, timers=False)  # type: ignore[arg-type]
        print(f"store: {kind}; {forks} forks per length, median")
        print(
            f"{'parent events':>14} {'fork ms':>9} {'us/event':>9} {'branch load reads':>18} "
            f"{'after +10':>10} {'parent load reads':>18}"
        )
        for n in lengths:
            parent = f"parent-{n}"
            fence = await raw.acquire_fence(parent)
            events = _log(parent, 0, n + 1, fence)
            for start in range(0, len(events), 2000):
                await raw.append(events[start : start + 2000])
            times = []
            branch = ""
            for i in range(forks):
                branch = f"branch-{n}-{i}"
                t0 = time.perf_counter()
                await rt.fork(parent, n, execution_id=branch)
                times.append(time.perf_counter() - t0)
            store.events_read = 0
            await rt.load_state(branch)
            fresh = store.events_read
            bfence = await raw.current_fence(branch)
            await raw.append(_log(branch, n + 2, 10, bfence))
            store.events_read = 0
            await rt.load_state(branch)
            after = store.events_read
            store.events_read = 0
            await rt.load_state(parent)
            parent_reads = store.events_read
            ms = statistics.median(times) * 1000
            print(
                f"{n:>14,} {ms:>9.2f} {ms * 1000 / (n + 1):>9.1f} {fresh:>18} {after:>10} "
                f"{parent_reads:>18,}"
            )
        await rt.close()
        if kind == "pg":
            from loom.storage.postgres import PostgresStore

            await PostgresStore.drop_schema(dsn or "", f"loom_bench_branching_{os.getpid()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="10,1000,10000")
    parser.add_argument("--forks", type=int, default=3)
    parser.add_argument("--store", choices=["sqlite", "memory", "pg"], default="sqlite")
    parser.add_argument("--pg-dsn", default=os.environ.get("LOOM_TEST_PG_DSN"))
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    asyncio.run(bench(args.store, lengths, args.forks, args.pg_dsn))


if __name__ == "__main__":
    main()
