"""What every ``loom`` command shares: its options, one error path and the console.

Every command group lives in its own module and registers on :data:`loom.cli._app.app`. A
command reports any error through :func:`run` / :func:`fail`: one line on stderr (``--json``:
one JSON object on stdout), exit code :data:`EXIT_ERROR`. Only command-line syntax errors,
which click reports itself, exit with 2.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console

from loom.errors import ConfigurationError, LoomError

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "AppOption",
    "DbOption",
    "JsonOption",
    "StoreOption",
    "console",
    "err_console",
    "fail",
    "print_json",
    "run",
    "setup_logging",
]

#: The exit code of every error Loom reports (click's own usage errors exit with 2).
EXIT_ERROR = 1
#: Ctrl-C, as shells report SIGINT.
EXIT_INTERRUPTED = 130

T = TypeVar("T")


def _make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # Piped output is read by scripts and people with wide pagers: never wrap or truncate it
    # at rich's 80-column default (ids must survive a pipe whole).
    width = None if stream.isatty() else 10_000
    return Console(highlight=False, stderr=stderr, width=width, soft_wrap=width is not None)


console = _make_console()
err_console = _make_console(stderr=True)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="PATH",
        envvar="LOOM_DB",
        help="SQLite file of the store (shorthand for --store sqlite:///PATH). Default: loom.db.",
        show_default=False,
    ),
]
StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="URL",
        envvar="LOOM_STORE",
        help="The store: sqlite:///path/to/loom.db, a bare path, or postgresql://...",
        show_default=False,
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Machine-readable output (errors too).", show_default=False)
]
AppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        metavar="MODULE:ATTR",
        envvar="LOOM_APP",
        help="module:attribute holding your flows: a Flow, a list of flows, or a "
        "WorkflowRuntime (whose store is then the default). Imported from the current "
        "directory.",
        show_default=False,
    ),
]


def print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False, default=str))


def fail(exc: LoomError, as_json: bool, *, code: int = EXIT_ERROR) -> NoReturn:
    """Report ``exc`` as one line (or one JSON object) and exit with ``code``."""
    if as_json:
        print_json({"error": exc.to_dict()})
    else:
        text = str(exc).replace("\n", " ")
        err_console.print(f"[red]error:[/] {text}", markup=True, soft_wrap=True)
    raise typer.Exit(code)


def run(
    coro_fn: Callable[[], Awaitable[T]],
    as_json: bool,
    *,
    on_interrupt: Callable[[], str | None] | None = None,
) -> T:
    """Run one command's coroutine; any error becomes :func:`fail`'s one line.
    ``on_interrupt`` says what Ctrl-C left behind (e.g. a recorded decision)."""
    try:
        return asyncio.run(coro_fn())  # type: ignore[arg-type]
    except LoomError as exc:
        fail(exc, as_json)
    except KeyboardInterrupt:
        hint = on_interrupt() if on_interrupt is not None else None
        fail(
            LoomError("interrupted", hint=hint or "Anything already recorded stays recorded"),
            as_json,
            code=EXIT_INTERRUPTED,
        )
    except OSError as exc:
        fail(ConfigurationError(f"{type(exc).__name__}: {exc}"), as_json)


_chosen = False


def log_level_chosen() -> bool:
    """Whether the user picked a log level (``--log-level`` or ``LOOM_LOG_LEVEL``)."""
    return _chosen


def setup_logging(level: str | None = None) -> None:
    """Send ``loom.*`` records to stderr at ``level`` (default ``$LOOM_LOG_LEVEL`` or ERROR:
    a command reports its own outcome, so only failed executions are logged besides; pass
    WARNING to see failed step attempts, INFO for recoveries and wakes)."""
    global _chosen
    _chosen = bool(level or os.environ.get("LOOM_LOG_LEVEL"))
    chosen = (level or os.environ.get("LOOM_LOG_LEVEL") or "ERROR").upper()
    if chosen not in logging.getLevelNamesMapping():
        raise ConfigurationError(
            f"unknown log level {chosen!r}", hint="Use DEBUG, INFO, WARNING or ERROR"
        )
    logger = logging.getLogger("loom")
    if not any(getattr(h, "_loom_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler._loom_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False  # one copy of each record, even if the root logs too
    logger.setLevel(chosen)


def fail_outside_click(exc: LoomError, as_json: bool) -> NoReturn:
    """:func:`fail` for errors that escaped a command (no click context to exit through)."""
    try:
        fail(exc, as_json)
    except typer.Exit as done:
        sys.exit(done.exit_code)
