"""One adapter per system. Each module is imported only by the process that runs it."""

from __future__ import annotations

import importlib

from bench.peers.systems.base import SkipError, System, Target

__all__ = ["SkipError", "System", "Target", "load"]

_MODULES = {
    "loom": "bench.peers.systems.loom_system",
    "dbos": "bench.peers.systems.dbos_system",
    "langgraph": "bench.peers.systems.langgraph_system",
    "floor": "bench.peers.systems.floor_system",
}


def load(name: str) -> type[System]:
    """Import the adapter for ``name`` (and with it that system's library)."""
    try:
        module_name = _MODULES[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r} (known: {', '.join(_MODULES)})") from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SkipError(f"{name} is not installed here ({exc}); pip install -e '.[bench]'") from exc
    system: type[System] = module.SYSTEM
    return system
