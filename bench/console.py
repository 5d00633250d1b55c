"""The console over 100,000 executions on SQLite: how fast each page is served.

    .venv/bin/python bench/console.py [--executions 100000] [--rounds 15] [--db PATH]

Builds (once; reused when ``--db`` exists) a SQLite store of suspended executions, serves the
console on 127.0.0.1 with uvicorn, and times real HTTP requests from a keep-alive client: the
first and the next page of the executions list (keyset pagination: the next page starts after
the last id of the one before, never OFFSET), the same through the JSON API, a filtered page,
an execution page, the slider's state-at-sequence call and the gates page. The floor row reads
the same next page from the console's data layer (the store's execution index) without HTTP or
HTML, in the same run. Prints a table (median and p95).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import loom  # noqa: E402
from loom.console import create_app  # noqa: E402
from loom.console._data import ListQuery  # noqa: E402
from loom.model import EventType  # noqa: E402


async def build(db: Path, n: int) -> None:
    store = loom.SQLiteStore(db, synchronous="NORMAL")
    started = time.perf_counter()
    now = time.time()

    async def one(i: int) -> None:
        eid = f"ex-{i:07d}"
        fence = await store.acquire_fence(eid)
        await store.append(
            [
                loom.Envelope.create(
                    eid,
                    0,
                    EventType.EXECUTION_STARTED,
                    {"flow_id": "review", "flow_version": "1", "input": {"title": f"post {i}"}},
                    fence=fence,
                    recorded_at=now,
                ),
                loom.Envelope.create(
                    eid,
                    1,
                    EventType.EXECUTION_SUSPENDED,
                    {"position": 0, "event_type": "Approval", "correlation_key": None},
                    fence=fence,
                    recorded_at=now,
                ),
            ]
        )

    try:
        chunk = 500
        for base in range(0, n, chunk):
            await asyncio.gather(*(one(i) for i in range(base, min(n, base + chunk))))
            if base % 10_000 == 0:
                print(f"  built {base:,} executions", file=sys.stderr)
    finally:
        await store.close()
    print(f"built {n:,} executions in {time.perf_counter() - started:.1f}s", file=sys.stderr)


def _stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


async def measure(db: Path, rounds: int) -> list[tuple[str, float, float, str]]:
    store = loom.SQLiteStore(db)
    app = create_app(store)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    rows: list[tuple[str, float, float, str]] = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            first = (await c.get("/api/executions")).json()
            cursor = first["next_cursor"]
            eid = first["items"][0]["execution_id"]

            data = app.state.data

            async def floor() -> None:
                # The same page straight from the console's data layer (the store's execution
                # index): no HTTP, no HTML. What any page costs at least.
                await data.list_executions(ListQuery(after=cursor))

            checks: list[tuple[str, Any, str]] = [
                ("next page from the index, no HTTP (floor)", floor, ""),
                ("GET /executions (first page)", "/executions", "html"),
                ("GET /executions (next page)", f"/executions?after={cursor}", "html"),
                ("GET /api/executions (first page)", "/api/executions", "json"),
                ("GET /api/executions (next page)", f"/api/executions?after={cursor}", "json"),
                ("GET /executions?status=suspended", "/executions?status=suspended", "html"),
                ("GET /executions/{id}", f"/executions/{eid}", "html"),
                ("GET /api/executions/{id}/state?at=0", f"/api/executions/{eid}/state?at=0", ""),
                ("GET /gates (first 200)", "/gates", "html"),
            ]
            for name, target, _kind in checks:
                samples = []
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    if callable(target):
                        await target()
                    else:
                        r = await c.get(target)
                        r.raise_for_status()
                    samples.append((time.perf_counter() - t0) * 1000)
                med, p95 = _stats(samples)
                rows.append((name, med, p95, ""))
    finally:
        server.should_exit = True
        await task
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--db", type=Path, default=None)
    args = parser.parse_args()
    tmp = None
    db = args.db
    if db is None:
        tmp = tempfile.TemporaryDirectory()
        db = Path(tmp.name) / "console-bench.db"
    try:
        if not db.exists():
            asyncio.run(build(db, args.executions))
        rows = asyncio.run(measure(db, args.rounds))
    finally:
        if tmp is not None:
            tmp.cleanup()
    floor = rows[0][1]
    print(f"\nconsole over {args.executions:,} executions on SQLite, {args.rounds} rounds each\n")
    print(f"{'request':<40} {'median ms':>10} {'p95 ms':>9} {'x floor':>8}")
    for name, med, p95, _ in rows:
        print(f"{name:<40} {med:>10.1f} {p95:>9.1f} {med / floor:>8.1f}")


if __name__ == "__main__":
    main()
