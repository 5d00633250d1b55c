"""Two HTTP worker processes serving the scenario's agents over one SQLite store.

Started on 127.0.0.1 with ports the OS picked (``--port 0 --port-file``) and waited for with a
deadline (the port file, then ``/healthz``), never a sleep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loom.placement import LocalDispatcher
from loom.placement.http import FailoverWorkerRuntime, RemoteWorkerRuntime
from tests.support.proc import Child

TOKEN = "orchestration-worker-token-0123456789"
DEADLINE = 30.0


@dataclass
class Workers:
    tmp: Path
    db: Path
    ledger: Path
    procs: list[Child] = field(default_factory=list)
    remotes: list[RemoteWorkerRuntime] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {
            "LOOM_TEST_DB": str(self.db),
            "LOOM_TEST_LEDGER": str(self.ledger),
            "LOOM_TEST_WORKER_TOKEN": TOKEN,
        }

    async def start(self, count: int = 2) -> None:
        ports = []
        for index in range(count):
            port_file = self.tmp / f"worker-{index}.port"
            proc = Child(
                "loom.cli._worker", "serve",
                "--app", "tests.support.orchestration:make_runtime",
                "--host", "127.0.0.1", "--port", "0", "--port-file", port_file,
                "--token-env", "LOOM_TEST_WORKER_TOKEN",
                "--drain-timeout", "2", "--log-level", "warning",
                env=self.env(), log=self.tmp / f"worker-{index}.log",
            )  # fmt: skip
            self.procs.append(proc)
            ports.append((proc, port_file))
        for proc, port_file in ports:
            self.urls.append(await proc.serving(port_file, timeout=DEADLINE))

    def dispatcher(self) -> LocalDispatcher:
        remotes = [RemoteWorkerRuntime(url, token=TOKEN, timeout=60) for url in self.urls]
        self.remotes.extend(remotes)
        return LocalDispatcher(FailoverWorkerRuntime(remotes), execute_timeout=60)

    def pids(self) -> set[int]:
        return {p.pid for p in self.procs}

    async def close(self) -> None:
        for remote in self.remotes:
            await remote.close()
        for proc in self.procs:
            proc.kill()
