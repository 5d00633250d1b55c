"""Loom: ``@loom.step`` effects run by ``ctx.run`` inside ``@loom.flow`` functions.

SQLite: ``loom.SQLiteStore`` with its defaults (WAL, ``synchronous=FULL``, group commit).
PostgreSQL: ``loom.storage.postgres.PostgresStore``, imported lazily: while it does not exist (or
the server is unreachable) these rows are reported as skipped.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

from bench.peers import ledger
from bench.peers.systems.base import SkipError, System, Target, sqlite_pragmas

import loom

__all__ = ["SYSTEM", "LoomSystem"]


@loom.step(id="inc")
async def inc(x: int) -> int:
    return x + 1


@loom.step(id="effect")
async def effect(i: int) -> int:
    ledger.record(i)
    return i + 1


@loom.flow(id="bench-seq", version="1")
async def seq_flow(ctx: loom.WorkflowContext, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.run(inc, x)
    return x


@loom.flow(id="bench-three", version="1")
async def three_flow(ctx: loom.WorkflowContext, n: int) -> int:
    a = await ctx.run(inc, n)
    b = await ctx.run(inc, a)
    return await ctx.run(inc, b)


@loom.flow(id="bench-one", version="1")
async def one_flow(ctx: loom.WorkflowContext, n: int) -> int:
    return await ctx.run(inc, n)


@loom.flow(id="bench-gate", version="1")
async def gate_flow(ctx: loom.WorkflowContext, n: int) -> dict[str, Any]:
    x = await ctx.run(inc, n)
    decision = await ctx.suspend("Go")
    return {"x": x, "decision": decision}


@loom.flow(id="bench-long", version="1")
async def long_flow(ctx: loom.WorkflowContext, n: int) -> int:
    done = 0
    for i in range(n):
        done = await ctx.run(effect, i)
    return done


FLOWS = (seq_flow, three_flow, one_flow, gate_flow, long_flow)


async def open_postgres_store(dsn: str) -> Any:
    """Open the PostgreSQL store if this Loom has one; :class:`SkipError` says why not otherwise."""
    try:
        from loom.storage.postgres import PostgresStore  # type: ignore[import-not-found]
    except ImportError as exc:
        raise SkipError(f"loom.storage.postgres.PostgresStore is not available ({exc})") from exc
    opener = getattr(PostgresStore, "open", None)
    try:
        store = opener(dsn) if callable(opener) else PostgresStore(dsn)
        if inspect.isawaitable(store):
            store = await store
    except Exception as exc:
        if _unreachable(exc):
            raise SkipError(f"PostgreSQL server unreachable for Loom ({exc})") from exc
        raise
    return store


def server_durability(dsn: str) -> dict[str, Any]:
    """The server's ``synchronous_commit`` as a fresh session sees it (the store sets none)."""
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=5) as conn:
            row = conn.execute("SHOW synchronous_commit").fetchone()
        return {"synchronous_commit": row[0] if row else None}
    except Exception as exc:
        return {"synchronous_commit": f"unknown ({exc})"}


def _unreachable(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError | ConnectionError):
            return True
        if type(seen).__name__ in ("OperationalError", "PoolTimeout"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class LoomSystem(System):
    name = "loom"
    workloads = frozenset({"per_step", "throughput", "one_step", "gate", "recovery"})

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self._runner: asyncio.Runner | None = None
        self.runtime: loom.WorkflowRuntime | None = None

    # ------------------------------------------------------------------ lifecycle

    async def _open(self) -> loom.WorkflowRuntime:
        if self.target.backend == "sqlite":
            store: Any = loom.SQLiteStore(self.target.location)
        else:
            store = await open_postgres_store(self.target.location)
        runtime = loom.WorkflowRuntime(store)
        runtime.register(*FLOWS)
        return runtime

    def open(self) -> None:
        self._runner = asyncio.Runner()
        try:
            self.runtime = self._runner.run(self._open())
        except BaseException:
            self._runner.close()
            self._runner = None
            raise

    def close(self) -> None:
        if self._runner is None:
            return
        if self.runtime is not None:
            self._runner.run(self.runtime.close())
        self._runner.close()
        self._runner = None

    def _run(self, coro: Any) -> Any:
        assert self._runner is not None, "open() first"
        return self._runner.run(coro)

    @property
    def rt(self) -> loom.WorkflowRuntime:
        assert self.runtime is not None, "open() first"
        return self.runtime

    def describe(self) -> dict[str, Any]:
        from importlib import metadata  # not at import: recovery children pay for imports

        info: dict[str, Any] = {
            "version": metadata.version("loom-runtime"),
            "api": "async (asyncio)",
        }
        store = self.runtime.store if self.runtime is not None else None
        if self.target.backend == "sqlite" and store is not None:
            conn = store._writer_conn()  # the connection that commits; what it reports is in force
            info["durability"] = {
                **sqlite_pragmas(conn),
                "store": repr(store),
                "group_commit": getattr(store, "group_commit", None),
            }
        elif store is not None:
            info["durability"] = {"store": repr(store), **server_durability(self.target.location)}
        return info

    # ------------------------------------------------------------------ workloads

    def per_step(self, steps: int, run_id: str) -> float:
        async def go() -> float:
            t0 = time.perf_counter()
            handle = await self.rt.start(seq_flow, steps, execution_id=f"{run_id}-seq")
            out = await handle.result()
            elapsed = time.perf_counter() - t0
            assert out == steps, out
            return elapsed

        result: float = self._run(go())
        return result

    def throughput(self, flows: int, steps: int, run_id: str) -> float:
        flow = {1: one_flow, 3: three_flow}[steps]
        rt = self.rt

        async def one(i: int) -> int:
            handle = await rt.start(flow, i, execution_id=f"{run_id}-{i}")
            out: int = await handle.result()
            return out

        async def go() -> float:
            t0 = time.perf_counter()
            outs = await asyncio.gather(*(one(i) for i in range(flows)))
            elapsed = time.perf_counter() - t0
            assert outs == [i + steps for i in range(flows)]
            return elapsed

        result: float = self._run(go())
        return result

    def gate(self, trips: int, run_id: str) -> list[float]:
        rt = self.rt

        async def go() -> list[float]:
            out: list[float] = []
            for k in range(trips):
                eid = f"{run_id}-gate-{k}"
                handle = await rt.start(gate_flow, k, execution_id=eid)
                await handle.wait_for_suspend()
                t0 = time.perf_counter()
                resumed = await rt.resume(eid, "Go", {"ok": True, "by": "bench"})
                result = await resumed.result()
                out.append(time.perf_counter() - t0)
                assert result == {"x": k + 1, "decision": {"ok": True, "by": "bench"}}, result
            return out

        result: list[float] = self._run(go())
        return result

    # ------------------------------------------------------------------ recovery children

    def child_run(self, execution_id: str, steps: int) -> None:
        async def go() -> None:
            runtime = await self._open()
            handle = await runtime.start(long_flow, steps, execution_id=execution_id)
            await handle.result()

        asyncio.run(go())

    def child_recover(self, execution_id: str, steps: int) -> Any:
        async def go() -> Any:
            runtime = await self._open()
            handle = await runtime.recover(execution_id)
            return await handle.result()  # the process exits next; closing is not timed

        return asyncio.run(go())


SYSTEM = LoomSystem
