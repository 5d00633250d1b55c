"""Names a package imports on first use (PEP 562), so that ``import loom`` stays light."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` for ``exports`` (name -> the module that
    defines it): a name is imported on its first use and kept in ``namespace`` (the module's
    globals), so later lookups find it without the hook. Define them under ``if not
    TYPE_CHECKING``: a module ``__getattr__`` seen by mypy would make every name resolve."""

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(module), name)
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *exports})

    return getattr_, dir_
