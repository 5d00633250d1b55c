"""Named fault points at every durability boundary.

In production every point is a no-op (one falsy check). Tests arm them to raise, block or kill
the process with SIGKILL, so crash tests can enumerate :data:`FAULT_POINTS` mechanically.

Arming in-process::

    faults.arm("after_effect_before_record", faults.Kill(), on_hit=3)

Arming a subprocess: set ``LOOM_FAULTS="after_effect_before_record=kill@3"`` (comma-separated;
actions ``kill``, ``raise``, ``exit``) before it imports loom.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "ARMED",
    "FAULT_POINTS",
    "Block",
    "FaultAction",
    "InjectedFaultError",
    "Kill",
    "Raise",
    "arm",
    "disarm_all",
    "hit",
    "hits",
]

#: Every named point, in the order a step's life crosses them.
FAULT_POINTS: tuple[str, ...] = (
    "after_start_before_drive",  # sequence 0 is durable, the flow has not run yet
    "before_effect",  # a step is about to run its handler
    "after_effect_before_record",  # the handler returned; its completion is not stored yet
    "before_append",  # a store is about to begin a write transaction
    "before_commit",  # rows are written inside the transaction, COMMIT not issued
    "after_append_before_ack",  # COMMIT returned; the caller has not been told yet
    "after_suspend_recorded",  # a gate's EXECUTION_SUSPENDED is durable
    "before_snapshot",  # a snapshot is about to be written
    # Inside an agent's tool loop (loom.agents):
    "agents.after_model_recorded",  # a model call's response is durable
    "agents.between_tool_calls",  # one tool call is recorded, the next has not started
    "agents.tool_effect_before_record",  # a tool returned; its result is not stored yet
)


class InjectedFaultError(Exception):
    """Raised by an armed :class:`Raise` action."""


class FaultAction:
    def __call__(self, point: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class Raise(FaultAction):
    def __init__(self, exc: BaseException | None = None) -> None:
        self.exc = exc

    def __call__(self, point: str) -> None:
        raise self.exc if self.exc is not None else InjectedFaultError(f"fault injected at {point}")


class Kill(FaultAction):
    """SIGKILL this process: no cleanup, no flush, exactly like a crash."""

    def __call__(self, point: str) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class Exit(FaultAction):
    def __call__(self, point: str) -> None:
        os._exit(99)


class Block(FaultAction):
    """Block the calling thread until :meth:`release`; ``reached`` is set when it arrives."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self._go = threading.Event()

    def release(self) -> None:
        self._go.set()

    def __call__(self, point: str) -> None:
        self.reached.set()
        self._go.wait()


@dataclass
class _Armed:
    action: Callable[[str], None]
    on_hit: int
    times: int | None


_armed: dict[str, _Armed] = {}
#: Truthy while any point is armed (the same dict, never rebound): a path crossed on every step
#: tests it before calling :func:`hit`, which is then a no-op anyway, and saves the call.
ARMED: Mapping[str, object] = _armed
_counts: dict[str, int] = {}
_lock = threading.Lock()


def arm(
    point: str, action: Callable[[str], None], *, on_hit: int = 1, times: int | None = 1
) -> None:
    """Run ``action`` at the ``on_hit``-th crossing of ``point`` (and ``times`` times after)."""
    if point not in FAULT_POINTS:
        raise ValueError(f"unknown fault point {point!r}; known: {', '.join(FAULT_POINTS)}")
    with _lock:
        _armed[point] = _Armed(action, on_hit, times)
        _counts[point] = 0


def disarm_all() -> None:
    with _lock:
        _armed.clear()
        _counts.clear()


def hits(point: str) -> int:
    return _counts.get(point, 0)


def hit(point: str) -> None:
    """Cross ``point``. A no-op unless a test armed it."""
    if not _armed:
        return
    with _lock:
        armed = _armed.get(point)
        if armed is None:
            return
        _counts[point] = n = _counts.get(point, 0) + 1
        if n < armed.on_hit:
            return
        if armed.times is not None:
            if armed.times <= 0:
                return
            armed.times -= 1
    armed.action(point)


_ACTIONS: dict[str, Callable[[], Callable[[str], None]]] = {
    "kill": Kill,
    "raise": Raise,
    "exit": Exit,
}


def _arm_from_env(spec: str) -> None:
    for item in filter(None, (s.strip() for s in spec.split(","))):
        point, _, rest = item.partition("=")
        action, _, nth = rest.partition("@")
        arm(point, _ACTIONS[action or "kill"](), on_hit=int(nth or 1))


if os.environ.get("LOOM_FAULTS"):
    _arm_from_env(os.environ["LOOM_FAULTS"])
