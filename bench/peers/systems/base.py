"""The interface every benchmarked system implements, in the same terms for all of them."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

__all__ = ["SkipError", "System", "Target", "sqlite_pragmas"]

Backend = Literal["sqlite", "postgres"]
PeerApi = Literal["sync", "async"]


class SkipError(Exception):
    """This system cannot run on this backend here; the message says why."""


@dataclass(frozen=True)
class Target:
    """Where a system keeps its state: a SQLite file path or a PostgreSQL URL of its own."""

    backend: Backend
    location: str
    peer_api: PeerApi = "sync"


class System(ABC):
    """A durable-execution system under test.

    The in-process workloads return wall-clock seconds measured around exactly the work the
    workload names (setup such as opening stores or starting a gate is outside the clock).
    ``child_run`` and ``child_recover`` run in the recovery workload's child processes.
    """

    name: ClassVar[str]
    workloads: ClassVar[frozenset[str]] = frozenset({"per_step", "throughput", "gate", "recovery"})

    def __init__(self, target: Target) -> None:
        self.target = target

    @abstractmethod
    def open(self) -> None:
        """Create or open the store and register the workloads' flows. Raises :class:`SkipError`."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Version, API used and the durability settings actually in force."""

    def per_step(self, steps: int, run_id: str) -> float:
        """Seconds for one sequential flow of ``steps`` trivial steps, start to result."""
        raise NotImplementedError

    def throughput(self, flows: int, steps: int, run_id: str) -> float:
        """Seconds to start ``flows`` flows of ``steps`` steps at once and collect every result."""
        raise NotImplementedError

    def gate(self, trips: int, run_id: str) -> list[float]:
        """Seconds from the resume call to the flow's result, once per round trip."""
        raise NotImplementedError

    def child_run(self, execution_id: str, steps: int) -> None:
        """Start the ``steps``-step recovery flow and run it (the parent kills this process)."""
        raise NotImplementedError

    def child_recover(self, execution_id: str, steps: int) -> Any:
        """In a fresh process: continue the killed execution and return its result."""
        raise NotImplementedError


def sqlite_pragmas(conn: Any) -> dict[str, Any]:
    """The journal mode and synchronous level of a DB-API SQLite connection, as it reports them."""
    journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = int(conn.execute("PRAGMA synchronous").fetchone()[0])
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return {"journal_mode": str(journal).upper(), "synchronous": names.get(sync, str(sync))}


def monotonic() -> float:
    """A clock shared by every process on this host (CLOCK_MONOTONIC)."""
    return time.monotonic()
