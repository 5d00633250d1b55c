"""A store in a process of its own, driven line by line (JSON) by tests/support/store_harness.py.

Run as ``python -m tests.children.store``; arm faults with ``LOOM_FAULTS`` in its environment.
Every command gets exactly one JSON answer line, except ``race`` (``ready`` first) and
``load`` (one line per attempted append, then ``done``).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import sys
import time
from typing import Any

from loom.errors import (
    ExecutionAlreadyExistsError,
    LoomError,
    StartFencedOutError,
    StorageError,
    StorageWriteError,
)
from loom.storage import SQLiteStore, Store
from loom.storage.postgres import PostgresStore
from loom.testing._store_conformance import env


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def describe(exc: BaseException) -> dict[str, Any]:
    details = exc.details if isinstance(exc, LoomError) else {}
    return {
        "error": type(exc).__name__,
        "execution_id": getattr(exc, "execution_id", None),
        "cause": type(exc.__cause__).__name__ if exc.__cause__ is not None else None,
        "outcome": details.get("outcome"),
        "message": str(exc),
    }


async def open_store(cmd: dict[str, Any]) -> Store:
    if cmd["backend"] == "sqlite":
        return SQLiteStore(cmd["target"])
    return await PostgresStore.open(cmd["target"], schema=cmd["schema"])


async def settle(store: Store, execution_id: str, deadline: float = 30.0) -> int:
    """The last stored sequence, asking again while the database is unreachable."""
    end = time.monotonic() + deadline
    while True:
        try:
            return await store.last_sequence(execution_id)
        except StorageError:
            if time.monotonic() > end:
                raise
        await asyncio.sleep(0.02)


async def race(store: Store, cmd: dict[str, Any]) -> dict[str, Any]:
    """Start one execution id the way a runtime does: fence, append sequence 0, and retry a
    start that was fenced out by a holder that had not written yet."""
    execution_id = cmd["id"]
    with open(cmd["barrier"]) as barrier:
        emit({"ready": True})
        fcntl.flock(barrier, fcntl.LOCK_SH)  # blocks until the parent lets every racer go
    fenced_out = 0
    while True:
        fence = await store.acquire_fence(execution_id)
        try:
            await store.append([env(execution_id, 0, fence)])
            return {"outcome": "won", "fence": fence, "fenced_out": fenced_out}
        except ExecutionAlreadyExistsError as exc:
            assert exc.execution_id == execution_id
            return {"outcome": "exists", "fence": fence, "fenced_out": fenced_out}
        except StorageWriteError as exc:
            if not isinstance(exc.__cause__, StartFencedOutError) or fenced_out > 1000:
                raise
            fenced_out += 1


async def write_loop(store: Store, cmd: dict[str, Any]) -> dict[str, Any]:
    """Append one event at a time with ``fence`` until ``n`` are written or one is refused."""
    execution_id, fence = cmd["id"], cmd["fence"]
    written = 0
    while written < cmd["n"]:
        seq = await store.last_sequence(execution_id) + 1
        try:
            await store.append([env(execution_id, seq, fence)])
        except LoomError as exc:
            return {"written": written, **describe(exc)}
        written += 1
        if written == 1:
            emit({"progress": seq})
    return {"written": written}


async def batch(store: Store, cmd: dict[str, Any]) -> dict[str, Any]:
    """One coalesced batch: every execution's append queued at once."""
    start, count = cmd["start"], cmd["count"]
    results = await asyncio.gather(
        *(
            store.append([env(i, start + k, f) for k in range(count)])
            for i, f in zip(cmd["ids"], cmd["fences"], strict=True)
        ),
        return_exceptions=True,
    )
    return {"results": [None if r is None else describe(r) for r in results]}


async def load(store: Store, cmd: dict[str, Any]) -> dict[str, Any]:
    """Concurrent writers, two envelopes per append, reporting every attempt's outcome."""

    async def writer(execution_id: str, fence: int) -> None:
        seq = await settle(store, execution_id) + 1
        for _ in range(cmd["appends"]):
            batch = [env(execution_id, seq, fence), env(execution_id, seq + 1, fence)]
            try:
                await store.append(batch)
            except StorageError as exc:
                emit(
                    {
                        "attempt": execution_id,
                        "seq": seq,
                        "eids": [e.envelope_id for e in batch],
                        "sums": [e.checksum() for e in batch],
                        **describe(exc),
                    }
                )
                seq = await settle(store, execution_id) + 1  # learn what landed, go on
                continue
            emit(
                {
                    "attempt": execution_id,
                    "seq": seq,
                    "eids": [e.envelope_id for e in batch],
                    "sums": [e.checksum() for e in batch],
                }
            )
            seq += 2

    await asyncio.gather(*(writer(i, f) for i, f in zip(cmd["ids"], cmd["fences"], strict=True)))
    # Recovery without a restart: the same store object must work again.
    end = time.monotonic() + 30
    for execution_id, fence in zip(cmd["ids"], cmd["fences"], strict=True):
        while True:
            seq = await settle(store, execution_id) + 1
            final = env(execution_id, seq, fence)
            try:
                await store.append([final])
            except StorageError as exc:
                emit(
                    {
                        "attempt": execution_id,
                        "seq": seq,
                        "eids": [final.envelope_id],
                        "sums": [final.checksum()],
                        **describe(exc),
                    }
                )
                if time.monotonic() > end:
                    raise
                continue
            emit(
                {
                    "attempt": execution_id,
                    "seq": seq,
                    "eids": [final.envelope_id],
                    "sums": [final.checksum()],
                    "final": True,
                }
            )
            break
    return {"done": True}


async def main() -> None:
    store: Store | None = None
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            cmd = json.loads(line)
            op = cmd["op"]
            try:
                if op == "open":
                    store = await open_store(cmd)
                    answer: dict[str, Any] = {"ok": True}
                elif op == "exit":
                    return
                else:
                    assert store is not None, "open first"
                    if op == "acquire":
                        answer = {"fence": await store.acquire_fence(cmd["id"])}
                    elif op == "append":
                        await store.append(
                            [
                                env(cmd["id"], cmd["start"] + k, cmd["fence"])
                                for k in range(cmd["count"])
                            ]
                        )
                        answer = {"ok": True}
                    elif op == "race":
                        answer = await race(store, cmd)
                    elif op == "write_loop":
                        answer = await write_loop(store, cmd)
                    elif op == "batch":
                        answer = await batch(store, cmd)
                    elif op == "load":
                        answer = await load(store, cmd)
                    else:
                        raise ValueError(f"unknown op {op!r}")
            except Exception as exc:
                answer = describe(exc)
            emit(answer)
    finally:
        if store is not None:
            await store.close()


if __name__ == "__main__":
    asyncio.run(main())
