"""Children placed off-box: the parent's runtime dispatches each child to one of two HTTP
worker processes; a child's end (in its worker) wakes the parent there."""

from __future__ import annotations

import asyncio
import itertools
import signal
from pathlib import Path
from typing import Any

import loom
from loom.model import ExecutionStatus
from loom.placement import ExecutionPackage, ExecutionResult, Health, LocalDispatcher
from loom.placement.http import RemoteWorkerRuntime
from loom.storage import ExecutionQuery, SQLiteStore
from tests.support.children_app import FLOWS
from tests.support.proc import Child

TOKEN = "children-worker-token-0123456789abcdef"


class RoundRobin:
    """Spreads packages over several dispatchers, one after the other."""

    def __init__(self, targets: list[LocalDispatcher]) -> None:
        self.targets = targets
        self._next = itertools.cycle(targets)
        self.placed: list[str] = []

    async def dispatch(self, package: ExecutionPackage) -> ExecutionResult:
        self.placed.append(package.execution_id)
        return await next(self._next).dispatch(package)

    async def cancel(self, execution_id: str) -> None:
        for target in self.targets:
            await target.cancel(execution_id)

    async def health(self) -> Health:
        return await self.targets[0].health()


async def _worker(tmp: Path, name: str, env: dict[str, str]) -> tuple[Child, str]:
    port_file = tmp / f"{name}.port"
    proc = Child(
        "loom.cli._worker", "serve",
        "--app", "tests.support.children_app:make_runtime",
        "--host", "127.0.0.1", "--port", "0", "--port-file", port_file,
        "--token-env", "LOOM_TEST_WORKER_TOKEN",
        "--log-level", "warning",
        env=env, log=tmp / f"{name}.log",
    )  # fmt: skip
    return proc, await proc.serving(port_file, timeout=30)


async def test_children_dispatched_to_http_workers(tmp_path: Path) -> None:
    db = tmp_path / "loom.db"
    env = {
        "LOOM_TEST_STORE": f"sqlite:{db}",
        "LOOM_TEST_WORKER_TOKEN": TOKEN,
    }
    SQLiteStore(db)  # create the schema before the workers open it
    procs: list[Child] = []
    remotes: list[RemoteWorkerRuntime] = []
    try:
        urls = []
        for name in ("worker-a", "worker-b"):
            proc, url = await _worker(tmp_path, name, env)
            procs.append(proc)
            urls.append(url)
        remotes = [RemoteWorkerRuntime(url, token=TOKEN, timeout=60) for url in urls]
        dispatcher = RoundRobin([LocalDispatcher(r) for r in remotes])
        async with loom.WorkflowRuntime(store=SQLiteStore(db), dispatcher=dispatcher) as rt:
            rt.register(*FLOWS)
            await rt.start("rc-parent", 4, execution_id="rp")
            state = await rt.wait("rp", timeout=60)
            assert state.status is ExecutionStatus.COMPLETED, state.error
            output: list[dict[str, Any]] = state.output
            assert [o["n"] for o in output] == [0, 1, 2, 3]
            worker_pids = {p.pid for p in procs}
            # Every child ran in a worker process, both workers got some, none here.
            assert {o["pid"] for o in output} == worker_pids
            assert sorted(dispatcher.placed) == ["rp.0", "rp.1", "rp.2", "rp.3"]
            kids = [s async for s in rt.executions(ExecutionQuery(parent_id="rp"))]
            assert len(kids) == 4
            for kid in kids:
                log = await rt.store.read(kid.execution_id)
                assert [str(e.type) for e in log].count("EXECUTION_STARTED") == 1
    finally:
        for remote in remotes:
            await remote.close()
        for proc in procs:
            proc.signal(signal.SIGTERM)
        for proc in procs:
            await asyncio.to_thread(proc.finish, timeout=30)
