"""The effect ledger: one fixed-width line per step effect, outside every system's database.

A step's effect appends ``<tag><index>\\n`` with a single ``os.write`` on an ``O_APPEND`` file, so
a line is in the kernel's page cache (and survives a SIGKILL of the writer) the moment the write
returns. The parent reads the file size to follow progress and the lines to count re-executions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LINE", "Ledger", "LedgerCount", "count", "progress"]

ENV_PATH = "BENCH_LEDGER"
ENV_TAG = "BENCH_LEDGER_TAG"
LINE = 9  # tag (1) + index (7 digits) + newline


class Ledger:
    """Appends effect lines for one process; the path and tag come from the environment."""

    def __init__(self, path: str | os.PathLike[str], tag: str) -> None:
        if len(tag) != 1:
            raise ValueError("a ledger tag is one character")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._tag = tag

    @classmethod
    def from_env(cls) -> Ledger | None:
        path = os.environ.get(ENV_PATH)
        return cls(path, os.environ.get(ENV_TAG, "x")) if path else None

    def record(self, index: int) -> None:
        os.write(self._fd, f"{self._tag}{index:07d}\n".encode())

    def close(self) -> None:
        os.close(self._fd)


_active: Ledger | None = None


def record(index: int) -> None:
    """Record one effect in this process's ledger (a no-op when no ledger is configured)."""
    global _active
    if _active is None:
        _active = Ledger.from_env()
        if _active is None:
            return
    _active.record(index)


def progress(path: Path) -> int:
    """How many effect lines the file holds now."""
    try:
        return path.stat().st_size // LINE
    except FileNotFoundError:
        return 0


@dataclass(frozen=True)
class LedgerCount:
    """What a crash-then-recover ledger shows."""

    crash_effects: int  # effects the killed process ran
    crash_last: int  # the index of its last effect (the step in flight when it died), -1 if none
    recovery_effects: int  # effects the recovering process ran
    re_executed: int  # effects of steps that had durably completed before the kill
    in_flight_rerun: bool  # whether the step in flight at the kill ran again (allowed)
    missing: int  # indices in [0, steps) that never ran at all (must be 0)


def count(path: Path, steps: int, crash_tag: str = "c", recover_tag: str = "r") -> LedgerCount:
    crash: list[int] = []
    recovered: list[int] = []
    for raw in path.read_text().splitlines():
        if not raw:
            continue
        tag, index = raw[0], int(raw[1:])
        if tag == crash_tag:
            crash.append(index)
        elif tag == recover_tag:
            recovered.append(index)
    last = max(crash) if crash else -1
    seen: set[int] = set()
    re_executed = 0
    for index in recovered:
        # A step whose successor had already started was durably complete (every system here
        # commits a step's result before it starts the next one); a second run in the
        # recovering process is a re-execution as well.
        if index < last or index in seen:
            re_executed += 1
        seen.add(index)
    ran = set(crash) | seen
    return LedgerCount(
        crash_effects=len(crash),
        crash_last=last,
        recovery_effects=len(recovered),
        re_executed=re_executed,
        in_flight_rerun=last in seen,
        missing=sum(1 for i in range(steps) if i not in ran),
    )
