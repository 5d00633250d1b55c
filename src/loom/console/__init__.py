"""``loom console``: the web inspector (Starlette, server-rendered, assets in the package).

Needs the ``console`` extra. :func:`create_app` builds the ASGI app over any store; layers add
pages (and their nav entries) by passing :class:`ConsolePage` objects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loom.console._app import ConsoleConfig, ConsolePage, create_app
    from loom.console._branches import branch_pages

__all__ = ["ConsoleConfig", "ConsolePage", "branch_pages", "create_app"]


def __getattr__(name: str) -> object:
    # The web stack is an optional extra: import it only when the app is asked for, so that
    # the CLI's approve/reject (which share the gate helpers) work without it.
    if name == "branch_pages":
        from loom.console import _branches

        return _branches.branch_pages
    if name in __all__:
        from loom.console import _app

        return getattr(_app, name)
    raise AttributeError(f"module 'loom.console' has no attribute {name!r}")
