"""Two HTTP worker processes serving the scenario's agents over one SQLite store.

Started on 127.0.0.1 with ports the OS picked (``--port 0 --port-file``) and waited for with a
deadline (the port file, then ``/healthz``), never a sleep.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loom.placement import LocalDispatcher
from loom.placement.http import FailoverWorkerRuntime, RemoteWorkerRuntime

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "orchestration-worker-token-0123456789"
DEADLINE = 30.0


@dataclass
class Workers:
    tmp: Path
    db: Path
    ledger: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    remotes: list[RemoteWorkerRuntime] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "LOOM_TEST_DB": str(self.db),
            "LOOM_TEST_LEDGER": str(self.ledger),
            "LOOM_TEST_WORKER_TOKEN": TOKEN,
        }

    async def start(self, count: int = 2) -> None:
        ports = []
        for index in range(count):
            port_file = self.tmp / f"worker-{index}.port"
            log = open(self.tmp / f"worker-{index}.log", "wb")  # noqa: SIM115 - the child owns it
            args = [
                sys.executable, "-m", "loom.cli._worker", "serve",
                "--app", "tests.support.orchestration:make_runtime",
                "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
                "--token-env", "LOOM_TEST_WORKER_TOKEN",
                "--drain-timeout", "2", "--log-level", "warning",
            ]  # fmt: skip
            proc = subprocess.Popen(
                args, env=self.env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
            )
            log.close()
            self.procs.append(proc)
            ports.append((proc, port_file))
        loop = asyncio.get_running_loop()
        async with httpx.AsyncClient() as client:
            for index, (proc, port_file) in enumerate(ports):
                deadline = loop.time() + DEADLINE
                url = ""
                while True:
                    if proc.poll() is not None:
                        log_text = (self.tmp / f"worker-{index}.log").read_text(errors="replace")
                        raise AssertionError(f"worker {index} died:\n{log_text[-3000:]}")
                    if not url and port_file.exists() and port_file.read_text().strip():
                        url = f"http://127.0.0.1:{int(port_file.read_text())}"
                    if url:
                        try:
                            if (await client.get(url + "/healthz", timeout=2)).status_code == 200:
                                break
                        except httpx.HTTPError:
                            pass
                    if loop.time() > deadline:
                        raise AssertionError(f"worker {index} did not come up in {DEADLINE}s")
                    await asyncio.sleep(0.05)
                self.urls.append(url)

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
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
