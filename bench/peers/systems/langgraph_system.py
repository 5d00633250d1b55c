"""LangGraph: a step is a graph node; a flow of N steps is a ``StateGraph`` of N nodes in a chain.

Why a chain of nodes and not the functional API (``@task`` inside ``@entrypoint``): a node is
LangGraph's unit of durable progress. With ``durability="sync"`` the checkpoint of a super-step
is written before the next super-step starts, which is the guarantee Loom gives per step (a
completed step's result is durable before the next step's effect runs). A ``@task``'s result is
handed to the checkpointer's ``put_writes`` on a background executor that the entrypoint does
not wait for, even in ``"sync"`` mode (``PregelLoop.put_writes`` in langgraph's
``pregel/_loop.py``), so a crash can lose a task that had returned and run it again: a weaker
guarantee, and not the natural unit for a chain of durable steps. (A prototype of the functional
API was ~30 % faster per step on SQLite.)

The gate is ``interrupt()`` inside a node and ``Command(resume=...)`` from outside. Savers:
``SqliteSaver`` (WAL from its own setup, ``synchronous=FULL`` set here) or ``PostgresSaver`` on a
psycopg pool; the ``async`` API uses ``AsyncSqliteSaver`` (aiosqlite) / ``AsyncPostgresSaver``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from typing import Any, NotRequired, TypedDict

from bench.peers import ledger
from bench.peers.systems.base import SkipError, System, Target, sqlite_pragmas
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

__all__ = ["SYSTEM", "LangGraphSystem"]

GATE_PAYLOAD = {"ok": True, "by": "bench"}
DURABILITY = "sync"
POOL_SIZE = 10


class State(TypedDict):
    x: int
    decision: NotRequired[dict[str, Any]]


def _node(index: int, asynchronous: bool, record: bool) -> Callable[..., Any]:
    if asynchronous:

        async def astep(state: State) -> dict[str, Any]:
            if record:
                ledger.record(index)
            return {"x": state["x"] + 1}

        return astep

    def step(state: State) -> dict[str, Any]:
        if record:
            ledger.record(index)
        return {"x": state["x"] + 1}

    return step


def chain(n: int, *, asynchronous: bool, record: bool = False) -> StateGraph[State]:
    graph: StateGraph[State] = StateGraph(State)
    prev = START
    for i in range(n):
        name = f"s{i}"
        graph.add_node(name, _node(i, asynchronous, record))  # type: ignore[call-overload]
        graph.add_edge(prev, name)
        prev = name
    graph.add_edge(prev, END)
    return graph


def gate_graph(*, asynchronous: bool) -> StateGraph[State]:
    graph: StateGraph[State] = StateGraph(State)

    def gate(state: State) -> dict[str, Any]:
        return {"decision": interrupt("Go")}

    async def agate(state: State) -> dict[str, Any]:
        return {"decision": interrupt("Go")}

    graph.add_node("prep", _node(0, asynchronous, False))  # type: ignore[call-overload]
    graph.add_node("gate", agate if asynchronous else gate)  # type: ignore[call-overload]
    graph.add_edge(START, "prep")
    graph.add_edge("prep", "gate")
    graph.add_edge("gate", END)
    return graph


def _config(thread_id: str, steps: int = 0) -> Any:
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": steps + 25}


def _unreachable(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) or type(seen).__name__ in ("OperationalError", "PoolTimeout"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class LangGraphSystem(System):
    name = "langgraph"

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self._runner: asyncio.Runner | None = None
        self._closers: list[Callable[[], Any]] = []
        self.saver: Any = None
        self._graphs: dict[Any, Any] = {}
        self._sqlite: Any = None  # the saver's connection, to read its pragmas back
        self._pool: Any = None

    @property
    def is_async(self) -> bool:
        return self.target.peer_api == "async"

    # ------------------------------------------------------------------ savers

    def _open_sync(self) -> Any:
        if self.target.backend == "sqlite":
            from langgraph.checkpoint.sqlite import SqliteSaver

            conn = sqlite3.connect(self.target.location, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._sqlite = conn
            self._closers.append(conn.close)
            saver: Any = SqliteSaver(conn)
        else:
            from langgraph.checkpoint.postgres import PostgresSaver
            from psycopg.rows import dict_row
            from psycopg_pool import ConnectionPool

            pool: Any = ConnectionPool(
                self.target.location,
                min_size=1,
                max_size=POOL_SIZE,
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
                open=False,
            )
            try:
                pool.open(wait=True, timeout=10)
            except Exception as exc:
                if _unreachable(exc):
                    raise SkipError(f"PostgreSQL server unreachable for LangGraph ({exc})") from exc
                raise
            self._pool = pool
            self._closers.append(pool.close)
            saver = PostgresSaver(pool)
        saver.setup()
        return saver

    async def _open_async(self) -> Any:
        if self.target.backend == "sqlite":
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            conn = await aiosqlite.connect(self.target.location)
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute("PRAGMA synchronous=FULL")
            self._sqlite = conn
            self._closers.append(conn.close)
            saver: Any = AsyncSqliteSaver(conn)
        else:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg.rows import dict_row
            from psycopg_pool import AsyncConnectionPool

            pool: Any = AsyncConnectionPool(
                self.target.location,
                min_size=1,
                max_size=POOL_SIZE,
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
                open=False,
            )
            try:
                await pool.open(wait=True, timeout=10)
            except Exception as exc:
                if _unreachable(exc):
                    raise SkipError(f"PostgreSQL server unreachable for LangGraph ({exc})") from exc
                raise
            self._pool = pool
            self._closers.append(pool.close)
            saver = AsyncPostgresSaver(pool)
        await saver.setup()
        return saver

    def _graph(self, kind: str, n: int = 0, record: bool = False) -> Any:
        key = (kind, n, record)
        graph = self._graphs.get(key)
        if graph is None:
            builder = (
                gate_graph(asynchronous=self.is_async)
                if kind == "gate"
                else chain(n, asynchronous=self.is_async, record=record)
            )
            graph = self._graphs[key] = builder.compile(checkpointer=self.saver)
        return graph

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        if self.is_async:
            self._runner = asyncio.Runner()
            self.saver = self._runner.run(self._open_async())
        else:
            self.saver = self._open_sync()

    def close(self) -> None:
        for closer in reversed(self._closers):
            out = closer()
            if asyncio.iscoroutine(out):
                assert self._runner is not None
                self._runner.run(out)
        self._closers.clear()
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def describe(self) -> dict[str, Any]:
        from importlib import metadata  # not at import: recovery children pay for imports

        backend = "sqlite" if self.target.backend == "sqlite" else "postgres"
        info: dict[str, Any] = {
            "version": metadata.version("langgraph"),
            "checkpointer": f"langgraph-checkpoint-{backend} "
            f"{metadata.version(f'langgraph-checkpoint-{backend}')}",
            "api": "async (ainvoke; asyncio.gather for throughput)"
            if self.is_async
            else "sync (invoke; Pregel.batch thread pool for throughput)",
            "model": "StateGraph, one node per step, chained",
        }
        durability: dict[str, Any] = {"durability": DURABILITY}
        try:
            if self.target.backend == "sqlite" and self._sqlite is not None:
                if self.is_async:

                    async def read() -> dict[str, Any]:
                        async with self._sqlite.execute("PRAGMA journal_mode") as cur:
                            journal = (await cur.fetchone())[0]
                        async with self._sqlite.execute("PRAGMA synchronous") as cur:
                            sync = (await cur.fetchone())[0]
                        names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
                        return {"journal_mode": journal.upper(), "synchronous": names[sync]}

                    assert self._runner is not None
                    durability.update(self._runner.run(read()))
                else:
                    durability.update(sqlite_pragmas(self._sqlite))
            elif self._pool is not None and not self.is_async:
                with self._pool.connection() as conn:
                    row = conn.execute("SHOW synchronous_commit").fetchone()
                    durability["synchronous_commit"] = row["synchronous_commit"]
        except Exception as exc:
            durability["unverified"] = repr(exc)
        info["durability"] = durability
        return info

    # ------------------------------------------------------------------ workloads

    def per_step(self, steps: int, run_id: str) -> float:
        graph = self._graph("chain", steps)
        cfg = _config(f"{run_id}-seq", steps)
        t0 = time.perf_counter()
        if self.is_async:
            assert self._runner is not None
            out = self._runner.run(graph.ainvoke({"x": 0}, cfg, durability=DURABILITY))
        else:
            out = graph.invoke({"x": 0}, cfg, durability=DURABILITY)
        elapsed = time.perf_counter() - t0
        assert out["x"] == steps, out
        return elapsed

    def throughput(self, flows: int, steps: int, run_id: str) -> float:
        if steps != 3:
            raise NotImplementedError
        graph = self._graph("chain", steps)
        inputs = [{"x": i} for i in range(flows)]
        configs = [_config(f"{run_id}-{i}", steps) for i in range(flows)]
        t0 = time.perf_counter()
        if self.is_async:

            async def go() -> list[Any]:
                return list(
                    await asyncio.gather(
                        *(
                            graph.ainvoke(inp, cfg, durability=DURABILITY)
                            for inp, cfg in zip(inputs, configs, strict=True)
                        )
                    )
                )

            assert self._runner is not None
            outs = self._runner.run(go())
        else:
            outs = graph.batch(inputs, configs, durability=DURABILITY)
        elapsed = time.perf_counter() - t0
        assert [o["x"] for o in outs] == [i + 3 for i in range(flows)]
        return elapsed

    def gate(self, trips: int, run_id: str) -> list[float]:
        graph = self._graph("gate")
        out: list[float] = []
        for k in range(trips):
            cfg = _config(f"{run_id}-gate-{k}")
            if self.is_async:
                assert self._runner is not None
                result, elapsed = self._runner.run(self._gate_async(graph, cfg, k))
            else:
                first = graph.invoke({"x": k}, cfg, durability=DURABILITY)
                assert "__interrupt__" in first, first
                t0 = time.perf_counter()
                result = graph.invoke(Command(resume=GATE_PAYLOAD), cfg, durability=DURABILITY)
                elapsed = time.perf_counter() - t0
            assert result == {"x": k + 1, "decision": GATE_PAYLOAD}, result
            out.append(elapsed)
        return out

    @staticmethod
    async def _gate_async(graph: Any, cfg: Any, k: int) -> tuple[Any, float]:
        first = await graph.ainvoke({"x": k}, cfg, durability=DURABILITY)
        assert "__interrupt__" in first, first
        t0 = time.perf_counter()
        result = await graph.ainvoke(Command(resume=GATE_PAYLOAD), cfg, durability=DURABILITY)
        return result, time.perf_counter() - t0

    # ------------------------------------------------------------------ recovery children

    def _child(self, execution_id: str, steps: int, inp: Any) -> Any:
        cfg = _config(execution_id, steps)
        if self.is_async:

            async def go() -> Any:
                self.saver = await self._open_async()
                graph = self._graph("chain", steps, record=True)
                return await graph.ainvoke(inp, cfg, durability=DURABILITY)

            return asyncio.run(go())
        self.saver = self._open_sync()
        graph = self._graph("chain", steps, record=True)
        return graph.invoke(inp, cfg, durability=DURABILITY)

    def child_run(self, execution_id: str, steps: int) -> None:
        self._child(execution_id, steps, {"x": 0})

    def child_recover(self, execution_id: str, steps: int) -> Any:
        # Invoking with no input continues the thread from its last checkpoint.
        return self._child(execution_id, steps, None)["x"]


SYSTEM = LangGraphSystem
