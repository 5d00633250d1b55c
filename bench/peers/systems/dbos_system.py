"""DBOS Transact: ``@DBOS.step`` functions called from ``@DBOS.workflow`` functions.

The system database is given by ``system_database_url``: ``sqlite:///<file>`` or the PostgreSQL
URL of a database of its own. The gate is ``DBOS.recv`` inside the workflow and ``DBOS.send``
from outside.

Durability made equal to Loom's:
* SQLite: DBOS leaves SQLite's defaults (rollback journal, ``synchronous=FULL``); a SQLAlchemy
  ``connect`` hook here puts every connection in WAL with ``synchronous=FULL``, as Loom runs.
  On SQLite DBOS has no push notifications: a waiting ``recv`` is woken by a poller whose
  interval defaults to 1 s; it is set to its documented minimum, 0.001 s, to give DBOS its best
  gate latency (say so when quoting the gate numbers).
* PostgreSQL: the server's ``synchronous_commit`` (on by default); LISTEN/NOTIFY as DBOS defaults.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

import sqlalchemy as sa
from bench.peers import ledger
from bench.peers.systems.base import SkipError, System, Target, sqlite_pragmas
from dbos import DBOS, DBOSConfig, SetWorkflowID
from sqlalchemy import event

__all__ = ["SYSTEM", "DbosSystem"]

GATE_PAYLOAD = {"ok": True, "by": "bench"}
POLL = 0.001  # seconds; DBOS's result/notification pollers, set to their minimum


@event.listens_for(sa.engine.Engine, "connect")
def _sqlite_wal_full(dbapi_conn: Any, _record: Any) -> None:
    if isinstance(dbapi_conn, sqlite3.Connection):
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=FULL")


# ---------------------------------------------------------------------- sync API


@DBOS.step()
def inc(x: int) -> int:
    return x + 1


@DBOS.step()
def effect(i: int) -> int:
    ledger.record(i)
    return i + 1


@DBOS.workflow()
def seq_wf(n: int) -> int:
    x = 0
    for _ in range(n):
        x = inc(x)
    return x


@DBOS.workflow()
def three_wf(n: int) -> int:
    return inc(inc(inc(n)))


@DBOS.workflow()
def gate_wf(n: int) -> dict[str, Any]:
    x = inc(n)
    DBOS.set_event("gate", "waiting")
    decision = DBOS.recv("Go", timeout_seconds=120)
    return {"x": x, "decision": decision}


@DBOS.workflow()
def long_wf(n: int) -> int:
    done = 0
    for i in range(n):
        done = effect(i)
    return done


# ---------------------------------------------------------------------- async API


@DBOS.step()
async def inc_async(x: int) -> int:
    return x + 1


@DBOS.step()
async def effect_async(i: int) -> int:
    ledger.record(i)
    return i + 1


@DBOS.workflow()
async def seq_wf_async(n: int) -> int:
    x = 0
    for _ in range(n):
        x = await inc_async(x)
    return x


@DBOS.workflow()
async def three_wf_async(n: int) -> int:
    return await inc_async(await inc_async(await inc_async(n)))


@DBOS.workflow()
async def gate_wf_async(n: int) -> dict[str, Any]:
    x = await inc_async(n)
    await DBOS.set_event_async("gate", "waiting")
    decision = await DBOS.recv_async("Go", timeout_seconds=120)
    return {"x": x, "decision": decision}


@DBOS.workflow()
async def long_wf_async(n: int) -> int:
    done = 0
    for i in range(n):
        done = await effect_async(i)
    return done


def _unreachable(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) or type(seen).__name__ == "OperationalError":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class DbosSystem(System):
    name = "dbos"

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self._runner: asyncio.Runner | None = None
        self._launched = False

    @property
    def is_async(self) -> bool:
        return self.target.peer_api == "async"

    def config(self) -> DBOSConfig:
        if self.target.backend == "sqlite":
            url = f"sqlite:///{self.target.location}"
        else:
            url = self.target.location
        cfg: DBOSConfig = {"name": "loom-bench", "system_database_url": url, "log_level": "WARNING"}
        if self.target.backend == "sqlite":
            cfg["notification_listener_polling_interval_sec"] = POLL
        return cfg

    def _launch(self) -> None:
        DBOS(config=self.config())
        try:
            DBOS.launch()
        except Exception as exc:
            DBOS.destroy()
            if self.target.backend == "postgres" and _unreachable(exc):
                raise SkipError(f"PostgreSQL server unreachable for DBOS ({exc})") from exc
            raise
        self._launched = True

    def open(self) -> None:
        self._launch()
        if self.is_async:
            self._runner = asyncio.Runner()

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        if self._launched:
            DBOS.destroy()
            self._launched = False

    def describe(self) -> dict[str, Any]:
        from importlib import metadata  # not at import: recovery children pay for imports

        info: dict[str, Any] = {
            "version": metadata.version("dbos"),
            "api": "async (start_workflow_async, asyncio.gather)"
            if self.is_async
            else "sync (start_workflow: one thread per workflow)",
        }
        durability: dict[str, Any] = {}
        try:  # read back what the system database's own connections report
            from dbos._dbos import _get_dbos_instance

            engine = _get_dbos_instance()._sys_db.engine
            with engine.connect() as conn:
                if self.target.backend == "sqlite":
                    durability.update(sqlite_pragmas(conn.connection.dbapi_connection))
                    durability["notification_listener_polling_interval_sec"] = POLL
                else:
                    durability["synchronous_commit"] = conn.exec_driver_sql(
                        "SHOW synchronous_commit"
                    ).scalar()
                    durability["listen_notify"] = True
        except Exception as exc:
            durability["unverified"] = repr(exc)
        info["durability"] = durability
        return info

    # ------------------------------------------------------------------ workloads

    def _async(self, coro: Any) -> Any:
        assert self._runner is not None, "open() first"
        return self._runner.run(coro)

    def per_step(self, steps: int, run_id: str) -> float:
        if self.is_async:

            async def go() -> int:
                with SetWorkflowID(f"{run_id}-seq"):
                    out: int = await seq_wf_async(steps)
                return out

            t0 = time.perf_counter()
            out = self._async(go())
        else:
            t0 = time.perf_counter()
            with SetWorkflowID(f"{run_id}-seq"):
                out = seq_wf(steps)
        elapsed = time.perf_counter() - t0
        assert out == steps, out
        return elapsed

    def throughput(self, flows: int, steps: int, run_id: str) -> float:
        if steps != 3:
            raise NotImplementedError
        if self.is_async:

            async def one(i: int) -> int:
                with SetWorkflowID(f"{run_id}-{i}"):
                    handle = await DBOS.start_workflow_async(three_wf_async, i)
                out: int = await handle.get_result()
                return out

            async def go() -> list[int]:
                return list(await asyncio.gather(*(one(i) for i in range(flows))))

            t0 = time.perf_counter()
            outs = self._async(go())
        else:
            t0 = time.perf_counter()
            handles = []
            for i in range(flows):
                with SetWorkflowID(f"{run_id}-{i}"):
                    handles.append(DBOS.start_workflow(three_wf, i))
            outs = [h.get_result() for h in handles]
        elapsed = time.perf_counter() - t0
        assert outs == [i + 3 for i in range(flows)]
        return elapsed

    def gate(self, trips: int, run_id: str) -> list[float]:
        out: list[float] = []
        for k in range(trips):
            wid = f"{run_id}-gate-{k}"
            if self.is_async:
                result, elapsed = self._async(self._gate_async(wid, k))
            else:
                with SetWorkflowID(wid):
                    handle = DBOS.start_workflow(gate_wf, k)
                DBOS.get_event(wid, "gate", timeout_seconds=60)
                time.sleep(0.02)  # let the workflow get into recv(), so the send wakes it
                t0 = time.perf_counter()
                DBOS.send(wid, GATE_PAYLOAD, topic="Go")
                result = handle.get_result()
                elapsed = time.perf_counter() - t0
            assert result == {"x": k + 1, "decision": GATE_PAYLOAD}, result
            out.append(elapsed)
        return out

    async def _gate_async(self, wid: str, k: int) -> tuple[Any, float]:
        with SetWorkflowID(wid):
            handle = await DBOS.start_workflow_async(gate_wf_async, k)
        await DBOS.get_event_async(wid, "gate", timeout_seconds=60)
        await asyncio.sleep(0.02)
        t0 = time.perf_counter()
        await DBOS.send_async(wid, GATE_PAYLOAD, topic="Go")
        result = await handle.get_result()
        return result, time.perf_counter() - t0

    # ------------------------------------------------------------------ recovery children

    def child_run(self, execution_id: str, steps: int) -> None:
        self._launch()
        with SetWorkflowID(execution_id):
            handle = DBOS.start_workflow(long_wf_async if self.is_async else long_wf, steps)
        handle.get_result()

    def child_recover(self, execution_id: str, steps: int) -> Any:
        # DBOS.launch() recovers this executor's pending workflows on its own.
        self._launch()
        return DBOS.retrieve_workflow(execution_id).get_result(polling_interval_sec=POLL)


SYSTEM = DbosSystem
