"""Multi-process store scenarios, shared by tests/storage/test_multiprocess_store.py and
``python -m tests.chaos_store``: real subprocesses (tests/children/store.py) over one SQLite file or
one PostgreSQL schema, checked afterwards with plain SQL (not through the store under test)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import random
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from loom.model import derived_envelope_id
from loom.storage import SQLiteStore, Store
from loom.storage.postgres import PostgresStore
from loom.testing._store_conformance import env
from tests.support.pg import tagged_dsn, terminate
from tests.support.proc import Child

__all__ = [
    "Target",
    "kill_in_batch",
    "race_to_start",
    "random_batch_shape",
    "stale_holder",
    "terminate_under_load",
]


def record_key(envelope_id: str, checksum: str) -> str:
    """One attempt's envelope: its id and checksum (which covers its time and payload)."""
    return f"{envelope_id}@{checksum}"


@dataclass(frozen=True)
class Target:
    """One physical store every process opens: a SQLite file or a PostgreSQL schema."""

    backend: str  # "sqlite" | "postgres"
    location: str  # file path or DSN
    schema: str = "loom"

    def open_cmd(self, tag: str | None = None) -> dict[str, Any]:
        target = self.location if tag is None else tagged_dsn(self.location, tag)
        return {"op": "open", "backend": self.backend, "target": target, "schema": self.schema}

    async def open(self) -> Store:
        if self.backend == "sqlite":
            return SQLiteStore(self.location)
        return await PostgresStore.open(self.location, schema=self.schema)

    def _rows(self) -> list[tuple[str, int, str, int, str]]:
        """(execution_id, sequence, envelope_id, fence, checksum) of every stored event."""
        columns = "execution_id, sequence, envelope_id, fence, checksum"
        if self.backend == "sqlite":
            with sqlite3.connect(self.location) as conn:
                rows = conn.execute(f"SELECT {columns} FROM loom_events").fetchall()
        else:
            with psycopg.connect(self.location) as pg:
                rows = pg.execute(f'SELECT {columns} FROM "{self.schema}".events').fetchall()
        # An empty stored id is the record's derived one (schema rung 10).
        return [
            (e, seq, i or derived_envelope_id(e, seq, fence), fence, checksum)
            for e, seq, i, fence, checksum in sorted(rows)
        ]

    def log(self) -> dict[str, list[tuple[int, str, int]]]:
        """Every execution's (sequence, envelope_id, fence) rows, read with plain SQL."""
        out: dict[str, list[tuple[int, str, int]]] = {}
        for execution_id, seq, envelope_id, fence, _ in self._rows():
            out.setdefault(execution_id, []).append((seq, envelope_id, fence))
        return out

    def records(self) -> dict[str, tuple[str, int]]:
        """{record key: (execution_id, sequence)}: a key (see ``record_key``) names one
        attempt's envelope, where a derived envelope id alone is shared by every attempt at
        the same sequence and fence."""
        return {record_key(i, s): (e, seq) for e, seq, i, _, s in self._rows()}


class StoreChild(Child):
    """One store process (tests/children/store.py), driven by JSON lines; faults only where
    a scenario arms them."""

    def __init__(self, env_extra: dict[str, str] | None = None) -> None:
        super().__init__("store", env=env_extra, stdin=True, stderr=False)
        self.proc = self.popen

    def send(self, cmd: dict[str, Any]) -> None:  # type: ignore[override]
        super().send(json.dumps(cmd))

    def recv(self) -> dict[str, Any] | None:
        """The next answer line, or None once the process has ended (killed)."""
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        return json.loads(line) if line else None

    def call(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Send ``cmd`` and return its answer (skipping progress lines)."""
        self.send(cmd)
        answer = self.recv()
        while answer is not None and "progress" in answer:
            answer = self.recv()
        assert answer is not None, f"the store process died during {cmd['op']}"
        assert "error" not in answer or cmd["op"] != "open", answer
        return answer

    def close(self) -> int:
        if self.proc.poll() is None:
            try:
                self.send({"op": "exit"})
            except BrokenPipeError:
                pass
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        return self.proc.wait(timeout=60)


@contextmanager
def children(n: int, env_extra: dict[str, str] | None = None) -> Iterator[list[StoreChild]]:
    procs = [StoreChild(env_extra) for _ in range(n)]
    try:
        yield procs
    finally:
        for child in procs:
            child.close()


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


# ---------------------------------------------------------------- scenarios


def race_to_start(target: Target, execution_id: str, n: int = 8) -> list[dict[str, Any]]:
    """``n`` processes start one execution id at the same instant (a file-lock barrier: the
    parent holds it exclusively until every racer is blocked on it). Returns their outcomes."""
    with tempfile.NamedTemporaryFile("w", suffix=".barrier") as barrier:
        fcntl.flock(barrier, fcntl.LOCK_EX)
        with children(n) as procs:
            for child in procs:
                child.call(target.open_cmd())
            for child in procs:
                child.send({"op": "race", "id": execution_id, "barrier": barrier.name})
            for child in procs:
                assert child.recv() == {"ready": True}
            fcntl.flock(barrier, fcntl.LOCK_UN)  # go
            outcomes = [child.recv() for child in procs]
    assert all(o is not None for o in outcomes)
    return [o for o in outcomes if o is not None]


def stale_holder(target: Target, execution_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Process A writes with its fence; process B takes a newer fence mid-stream and writes.

    Returns (A's final answer, B's final answer)."""
    with children(2) as (a, b):
        a.call(target.open_cmd())
        b.call(target.open_cmd())
        fence_a = a.call({"op": "acquire", "id": execution_id})["fence"]
        start = {"op": "append", "id": execution_id, "start": 0, "count": 1, "fence": fence_a}
        assert a.call(start) == {"ok": True}
        a.send({"op": "write_loop", "id": execution_id, "fence": fence_a, "n": 100_000})
        assert "progress" in (a.recv() or {})  # A is appending right now
        fence_b = b.call({"op": "acquire", "id": execution_id})["fence"]
        answer_b = b.call({"op": "write_loop", "id": execution_id, "fence": fence_b, "n": 20})
        answer_a = a.recv()
        assert answer_a is not None
    return answer_a, {**answer_b, "fence": fence_b, "fence_a": fence_a}


@dataclass
class BatchRun:
    point: str
    executions: int
    count: int
    killed: bool
    whole: int = 0
    none: int = 0
    partial: list[str] = field(default_factory=list)


def kill_in_batch(target: Target, point: str, executions: int, count: int, run: str) -> BatchRun:
    """SIGKILL a process at ``point`` inside one coalesced batch of ``executions`` appends of
    ``count`` events each; then count executions holding the whole batch, none, or a part."""
    ids = [f"{run}-{i:02d}" for i in range(executions)]

    async def setup() -> list[int]:
        store = await target.open()
        try:
            fences = [await store.acquire_fence(i) for i in ids]
            for i, fence in zip(ids, fences, strict=True):
                await store.append([env(i, 0, fence)])
            return fences
        finally:
            await store.close()

    fences = _run(setup())
    with children(1, {"LOOM_FAULTS": f"{point}=kill@1"}) as (child,):
        child.call(target.open_cmd())
        child.send({"op": "batch", "ids": ids, "fences": fences, "start": 1, "count": count})
        answer = child.recv()
        returncode = child.proc.wait(timeout=60)
    result = BatchRun(point, executions, count, killed=returncode == -9 and answer is None)
    log = target.log()
    for i in ids:
        sequences = [seq for seq, _, _ in log.get(i, [])]
        if sequences == list(range(count + 1)):
            result.whole += 1
        elif sequences == [0]:
            result.none += 1
        else:
            result.partial.append(f"{i}: {sequences}")
    return result


@dataclass
class LoadRun:
    acked: int = 0
    failed: int = 0
    unknown: int = 0
    terminated: int = 0
    violations: list[str] = field(default_factory=list)


def terminate_under_load(
    target: Target,
    *,
    writers: int = 8,
    appends: int = 60,
    every: int = 40,
    restart_cmd: str | None = None,
    run: str = "load",
) -> LoadRun:
    """A process appends concurrently (2 events per append) while its PostgreSQL sessions are
    terminated every ``every`` acknowledged appends (or the server restarted with
    ``restart_cmd``). Afterwards: no acknowledged append lost, no append half-written, nothing
    written that was not attempted, failed appends (unless the store said the outcome is
    unknown) not written, and the same store object writing again."""
    assert target.backend == "postgres"
    ids = [f"{run}-{i}" for i in range(writers)]
    tag = f"loom-load-{target.schema}"[:60]

    async def setup() -> list[int]:
        store = await target.open()
        try:
            fences = [await store.acquire_fence(i) for i in ids]
            for i, fence in zip(ids, fences, strict=True):
                await store.append([env(i, 0, fence)])
            return fences
        finally:
            await store.close()

    fences = _run(setup())
    out = LoadRun()
    attempts: list[dict[str, Any]] = []
    with children(1) as (child,):
        child.call(target.open_cmd(tag))
        child.send({"op": "load", "ids": ids, "fences": fences, "appends": appends})
        since = 0
        while True:
            line = child.recv()
            assert line is not None, "the load process died"
            if line.get("done") or ("error" in line and "attempt" not in line):
                assert line.get("done"), line
                break
            attempts.append(line)
            if "error" not in line and not line.get("final"):
                since += 1
                if since >= every:
                    since = 0
                    if restart_cmd:
                        subprocess.run(restart_cmd, shell=True, check=True)
                        out.terminated += 1
                    else:
                        out.terminated += terminate(target.location, tag)
    log = target.log()
    stored = target.records()
    for i in ids:
        sequences = [seq for seq, _, _ in log.get(i, [])]
        if sequences != list(range(len(sequences))):
            out.violations.append(f"{i}: log not dense: {sequences}")
    attempted: set[str] = set()
    for a in attempts:
        eids = [record_key(i, c) for i, c in zip(a["eids"], a["sums"], strict=True)]
        attempted.update(eids)
        present = [eid in stored for eid in eids]
        if "error" not in a:
            out.acked += 1
            expected = [(a["attempt"], a["seq"] + k) for k in range(len(eids))]
            if [stored.get(eid) for eid in eids] != expected:
                out.violations.append(f"acknowledged append lost or moved: {a}")
            continue
        out.failed += 1
        if a.get("outcome") == "unknown":
            out.unknown += 1
        if any(present) and not all(present):
            out.violations.append(f"append half-written: {a}")
        elif all(present) and a.get("outcome") != "unknown":
            out.violations.append(f"an append that failed was written: {a}")
    for eid, (i, seq) in stored.items():
        if seq > 0 and eid not in attempted:
            out.violations.append(f"{i}@{seq}: stored but never attempted")
    recovered = {a["attempt"] for a in attempts if a.get("final") and "error" not in a}
    if recovered != set(ids):
        out.violations.append(f"the store did not write again for {set(ids) - recovered}")
    return out


def random_batch_shape(rng: random.Random) -> tuple[str, int, int]:
    point = rng.choice(["before_commit", "after_append_before_ack"])
    return point, rng.randint(2, 24), rng.randint(1, 3)
