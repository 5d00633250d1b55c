"""``--app module:attribute``: import the user's flows the way uvicorn imports an app.

The current directory is put on ``sys.path`` first, so ``--app flows:guard`` works from the
folder holding ``flows.py`` without ``PYTHONPATH``. Whatever goes wrong while importing (a
missing module, a syntax error, an exception at import) becomes one :class:`ConfigurationError`
line naming the option; nothing the module does reaches the user as a traceback.
"""

from __future__ import annotations

import gc
import importlib
import inspect
import os
import sys
import warnings
from typing import Any

from loom.errors import ConfigurationError
from loom.runtime import Flow, WorkflowRuntime

__all__ = ["import_target", "load_app", "require_app"]

_GUARD_HINT = (
    "A flows module must only define things at import: guard scripts with "
    "`if __name__ == '__main__': asyncio.run(main())`"
)


def require_app(spec: str | None, command: str) -> str:
    if not spec:
        raise ConfigurationError(
            f"`loom {command}` runs your flow code and needs --app module:attribute (or LOOM_APP)",
            hint="e.g. --app flows:guard for a flows.py in the current directory",
        )
    return spec


def import_target(spec: str) -> Any:
    """Import ``module`` and walk ``attribute`` (dots allowed) of ``module:attribute``."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(
            f"--app must look like module:attribute, not {spec!r}",
            hint="e.g. --app flows:guard for a flows.py in the current directory",
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigurationError(
                f"cannot load --app {spec!r}: no module named {exc.name!r} (looked in {cwd} "
                "and the installed packages)",
                hint="Run loom from the folder holding the module, or install it",
            ) from None
        raise ConfigurationError(
            f"cannot load --app {spec!r}: importing {module_name!r} failed: {exc}"
        ) from None
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else module_name
        raise ConfigurationError(
            f"cannot load --app {spec!r}: syntax error at {where}: {exc.msg}"
        ) from None
    except (Exception, SystemExit) as exc:
        error = ConfigurationError(
            f"cannot load --app {spec!r}: importing {module_name!r} raised "
            f"{type(exc).__name__}: {exc}",
            hint=_GUARD_HINT,
        )
        # A refused `asyncio.run(main())` leaves main's coroutine unawaited in the traceback:
        # drop it now, quietly, instead of a RuntimeWarning on stderr at exit.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
            exc.__traceback__ = None
            del exc
            gc.collect()
        raise error from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigurationError(
                f"cannot load --app {spec!r}: {type(target).__name__} "
                f"{getattr(target, '__name__', '')!r} has no attribute {part!r}"
            ) from None
    return target


async def call_factory(spec: str, target: Any) -> Any:
    """Call a zero-argument *Python* function (sync or async) that builds the runtime. Only
    functions written in Python are called: ``--app os:system`` is refused, never run."""
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        return target
    params = [
        p
        for p in inspect.signature(target).parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if params:
        raise ConfigurationError(
            f"--app {spec!r} is a function that needs arguments "
            f"({', '.join(p.name for p in params)}); a factory takes none"
        )
    try:
        made = target()
        if inspect.isawaitable(made):
            made = await made
    except ConfigurationError:
        raise
    except Exception as exc:
        raise ConfigurationError(
            f"--app {spec!r}: the factory raised {type(exc).__name__}: {exc}"
        ) from None
    return made


async def load_app(spec: str) -> tuple[list[Flow[Any, Any]], WorkflowRuntime | None]:
    """The flows ``spec`` names, and the runtime when it names one (its store is then the
    default store). Imported inside the running event loop, so a module that calls
    ``asyncio.run`` at import is refused instead of run."""
    target = await call_factory(spec, import_target(spec))
    if isinstance(target, WorkflowRuntime):
        if not target.flows:
            raise ConfigurationError(f"the runtime at --app {spec!r} has no registered flows")
        return target.flows, target
    if isinstance(target, Flow):
        return [target], None
    if isinstance(target, (list, tuple)) and target and all(isinstance(f, Flow) for f in target):
        return list(target), None
    raise ConfigurationError(
        f"--app {spec!r} is a {type(target).__name__}, not a Flow, a list of flows or a "
        "WorkflowRuntime",
        hint="Point it at a @loom.flow, a list of them, or the runtime that registers them",
    )
