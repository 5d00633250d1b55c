"""Real processes for the remote end-to-end tests: HTTP workers, dispatchers, recovery passes.

Every process runs on 127.0.0.1 with a port the OS picked (``--port 0 --port-file``), shares
one store (SQLite file or PostgreSQL schema) and one effect ledger, and is waited for with a
deadline (its port file, then ``/healthz``), never with a sleep.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loom.model import EventType
from loom.storage import Store
from tests.support.http_keys import AUDIENCE, kit
from tests.support.poll import until
from tests.support.proc import Child

TOKEN = "e2e-worker-token-0123456789abcdef"
STARTUP_DEADLINE = 30.0


class Proc(Child):
    """One process of a cluster, its stdout and stderr in ``log``."""

    def __init__(self, name: str, module: str, *args: str, env: dict[str, str], log: Path) -> None:
        super().__init__(module, *args, env=env, drop=("LOOM_TEST_HOLD_DIR",), log=log)
        self.name = name
        self.url = ""

    async def exited(self, timeout: float) -> int:
        try:
            return await asyncio.to_thread(self.popen.wait, timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} did not exit within {timeout}s; its log:\n{self.tail()}"
            ) from None


@dataclass
class Cluster:
    """The processes of one test over one store and one effect ledger."""

    tmp: Path
    spec: str
    store: Store
    procs: list[Proc] = field(default_factory=list)

    @property
    def ledger(self) -> Path:
        return self.tmp / "effects.db"

    @property
    def hold_dir(self) -> Path:
        return self.tmp / "holds"

    @property
    def certs_file(self) -> Path:
        return self.tmp / "certs.json"

    def env(self, **extra: str) -> dict[str, str]:
        """What a process of this cluster sets in its environment (LOOM_TEST_HOLD_DIR only
        when ``extra`` names it)."""
        return {
            "LOOM_TEST_STORE": self.spec,
            "LOOM_TEST_LEDGER": str(self.ledger),
            "LOOM_TEST_WORKER_TOKEN": TOKEN,
            **extra,
        }

    def spawn(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        assert args[0] == "-m", args
        proc = Proc(name, args[1], *args[2:], env=env, log=self.tmp / f"{name}.log")
        self.procs.append(proc)
        return proc

    async def workers(self, *holds: bool) -> list[Proc]:
        """Start one worker per entry (True: its ``hold`` step waits for a release file) and
        wait until every one answers ``/healthz``."""
        self.hold_dir.mkdir(exist_ok=True)
        self.certs_file.write_text(json.dumps(kit().certs()))
        started: list[tuple[Proc, Path]] = []
        for index, hold in enumerate(holds):
            name = f"worker-{'AB'[index] if index < 2 else index}"
            port_file = self.tmp / f"{name}.port"
            extra = {"LOOM_TEST_HOLD_DIR": str(self.hold_dir)} if hold else {}
            args = [
                "-m", "loom.cli._worker", "serve",
                "--app", "tests.support.http_flows:make_runtime",
                "--host", "127.0.0.1",
                "--port", "0",
                "--port-file", str(port_file),
                "--token-env", "LOOM_TEST_WORKER_TOKEN",
                "--google-audience", AUDIENCE,
                "--google-certs-file", str(self.certs_file),
                "--drain-timeout", "2",
                "--log-level", "warning",
            ]  # fmt: skip
            started.append((self.spawn(name, args, self.env(**extra)), port_file))
        async with httpx.AsyncClient() as client:
            for proc, port_file in started:

                async def has_port(proc: Proc = proc, port_file: Path = port_file) -> bool:
                    if proc.popen.poll() is not None:
                        raise AssertionError(f"{proc.name} died at startup:\n{proc.tail()}")
                    return await asyncio.to_thread(port_file.exists)

                await until(has_port, f"{proc.name}'s port", timeout=STARTUP_DEADLINE, every=0.05)
                proc.url = f"http://127.0.0.1:{int(port_file.read_text())}"

                async def healthy(proc: Proc = proc) -> bool:
                    try:
                        response = await client.get(proc.url + "/healthz", timeout=2)
                    except httpx.HTTPError:
                        return False
                    return response.status_code == 200

                await until(
                    healthy, f"{proc.name}'s /healthz", timeout=STARTUP_DEADLINE, every=0.05
                )
        return [proc for proc, _ in started]

    def dispatcher(
        self,
        urls: list[str],
        ids: list[str],
        *,
        flow: str = "held-three",
        max_attempts: int = 2,
        execute_timeout: float = 45.0,
    ) -> tuple[Proc, Path]:
        out = self.tmp / f"dispatch-{len(self.procs)}.jsonl"
        args = [
            "-m", "tests.children.http_dispatcher",
            "--out", str(out),
            "--urls", ",".join(urls),
            "--flow", flow,
            "--ids", ",".join(ids),
            "--max-attempts", str(max_attempts),
            "--execute-timeout", str(execute_timeout),
        ]  # fmt: skip
        return self.spawn("dispatcher", args, self.env()), out

    def recovery(self, urls: list[str]) -> tuple[Proc, Path]:
        out = self.tmp / "recovery.json"
        args = ["-m", "tests.children.http_recover", "--out", str(out), "--urls", ",".join(urls)]
        return self.spawn("recovery", args, self.env()), out

    def release(self, execution_id: str = "all", *, only: Proc | None = None) -> None:
        """Let held ``hold`` steps return: of one execution (or all), in one process or all."""
        name = f"release-{execution_id}" + (f"@{only.pid}" if only is not None else "")
        (self.hold_dir / name).touch()

    def effects(self) -> list[tuple[str, str, int]]:
        """(execution id, step id, pid) of every effect so far."""
        if not self.ledger.exists():
            return []
        conn = sqlite3.connect(self.ledger, timeout=30)
        try:
            rows = conn.execute("SELECT execution_id, step_id, pid FROM effects").fetchall()
        except sqlite3.OperationalError:
            return []  # the table is created by the first effect
        finally:
            conn.close()
        return [(str(e), str(s), int(p)) for e, s, p in rows]

    def counts(self, execution_id: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for eid, step, _ in self.effects():
            if eid == execution_id:
                counts[step] = counts.get(step, 0) + 1
        return counts

    def held_by(self, proc: Proc) -> set[str]:
        """Executions whose ``hold`` step ran in ``proc``."""
        return {eid for eid, step, pid in self.effects() if step == "hold" and pid == proc.pid}

    async def check_log(self, execution_id: str) -> list[EventType]:
        """The store's invariants for one execution; returns its event types."""
        log = await self.store.read(execution_id)
        assert [e.sequence for e in log] == list(range(len(log))), "sequences are not dense"
        types = [e.type for e in log]
        assert (
            types.count(EventType.EXECUTION_STARTED) == 1
            and types[0] is EventType.EXECUTION_STARTED
        )
        completed = [e.payload["position"] for e in log if e.type is EventType.STEP_COMPLETED]
        assert len(completed) == len(set(completed)), "a step position completed twice"
        fences = [e.fence for e in log]
        assert fences == sorted(fences), "a fence went backwards in accepted writes"
        return types

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
