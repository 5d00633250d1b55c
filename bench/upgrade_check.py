"""The upgrade check over 1,000 suspended executions on SQLite.

    .venv/bin/python bench/upgrade_check.py [--executions 1000]

Version 1 of a flow branches on its input; half the executions took branch "a" (two steps),
half branch "b" (one step); all wait at an approval gate. Version 2 of the code swaps the two
steps of branch "a". The check must name exactly the branch-"a" executions. Timed: the
``loom.testing.upgrade_check`` function, and the ``loom upgrade-check`` command end to end
(process start, imports, progress bar). The floor row reads every log once (the least any
check must do) in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import loom  # noqa: E402
from loom.testing import upgrade_check  # noqa: E402


@loom.step(id="reserve")
async def reserve(kind: str) -> str:
    return f"reserved-{kind}"


@loom.step(id="charge")
async def charge(kind: str) -> str:
    return f"charged-{kind}"


@loom.step(id="quote")
async def quote(kind: str) -> int:
    return 42


async def _v1(ctx: loom.WorkflowContext, kind: str) -> Any:
    if kind == "a":
        await ctx.run(reserve, kind)
        await ctx.run(charge, kind)
    else:
        await ctx.run(quote, kind)
    return await ctx.suspend("Approval")


async def _v2(ctx: loom.WorkflowContext, kind: str) -> Any:
    if kind == "a":
        await ctx.run(charge, kind)
        await ctx.run(reserve, kind)
    else:
        await ctx.run(quote, kind)
    return await ctx.suspend("Approval")


FLOWS_V1 = [loom.flow(id="orders", version="1")(_v1)]
FLOWS_V2 = [loom.flow(id="orders", version="1")(_v2)]


async def build(db: Path, n: int) -> set[str]:
    branch_a = set()
    async with loom.WorkflowRuntime(loom.SQLiteStore(db, synchronous="NORMAL")) as rt:
        rt.register(*FLOWS_V1)

        async def one(i: int) -> None:
            kind = "a" if i % 2 == 0 else "b"
            eid = f"order-{i:05d}"
            if kind == "a":
                branch_a.add(eid)
            await (await rt.start(FLOWS_V1[0], kind, execution_id=eid)).wait_for_suspend()

        for base in range(0, n, 100):
            await asyncio.gather(*(one(i) for i in range(base, min(n, base + 100))))
    return branch_a


async def floor(db: Path) -> float:
    store = loom.SQLiteStore(db)
    try:
        t0 = time.perf_counter()
        async for eid in store.iterate_execution_ids():
            await store.read(eid)
        return time.perf_counter() - t0
    finally:
        await store.close()


async def check(db: Path, flows: list[Any]) -> tuple[float, loom.testing.UpgradeReport]:
    store = loom.SQLiteStore(db)
    try:
        t0 = time.perf_counter()
        report = await upgrade_check(store, flows)
        return time.perf_counter() - t0, report
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "upgrade.db"
        branch_a = asyncio.run(build(db, args.executions))
        floor_s = asyncio.run(floor(db))
        same_s, same = asyncio.run(check(db, FLOWS_V1))
        v2_s, report = asyncio.run(check(db, FLOWS_V2))
        named = {i.execution_id for i in report.issues}
        exact = named == branch_a and same.ok
        t0 = time.perf_counter()
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "loom.cli",
                "upgrade-check",
                "--db",
                str(db),
                "--json",
                "--app",
                "bench.upgrade_check:FLOWS_V2",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        cli_s = time.perf_counter() - t0
    print(f"\nupgrade check over {args.executions:,} suspended executions on SQLite\n")
    print(f"{'pass':<46} {'seconds':>8} {'x floor':>8}")
    rows = [
        ("read every log once (floor)", floor_s),
        ("upgrade_check, code unchanged (0 named)", same_s),
        (f"upgrade_check, v2 ({len(named)} named)", v2_s),
        (f"loom upgrade-check --app ... (exit {cli.returncode})", cli_s),
    ]
    for name, secs in rows:
        print(f"{name:<46} {secs:>8.2f} {secs / floor_s:>8.1f}")
    print(f"\nnamed exactly the {len(branch_a)} branch-a executions: {exact}")


if __name__ == "__main__":
    main()
