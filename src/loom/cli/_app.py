"""``loom``: start, list, inspect, decide, cancel and recover executions; serve a node; demo.

One module per command group, each registering on :data:`app`: ``_exec`` (executions),
``_serve`` (a long-running node), ``_worker`` (the HTTP worker), and any later group (e.g. a
console). Every command reports errors through :mod:`loom.cli._common`: one line on stderr,
``--json`` errors as JSON on stdout, exit code 1.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import traceback
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

import loom
from loom.cli import _common
from loom.cli._common import EXIT_ERROR, JsonOption, print_json, run, setup_logging
from loom.cli._render import render_state, render_timeline
from loom.errors import ConfigurationError, LoomError
from loom.runtime import Flow, WorkflowRuntime
from loom.storage import SQLiteStore

app = typer.Typer(
    help="Loom: durable execution for agent and workflow code. Docs: docs/cli.md.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)


def _version() -> str:
    try:
        return version("loom-runtime")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        print(f"loom {_version()} (Python {sys.version.split()[0]})")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            help="Print the version and exit.",
            callback=_show_version,
            is_eager=True,
        ),
    ] = False,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            metavar="LEVEL",
            envvar="LOOM_LOG_LEVEL",
            help="Log level of loom.* records on stderr (default ERROR; `serve`: INFO).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Loom: durable execution for agent and workflow code."""
    try:
        setup_logging(log_level)
    except LoomError as exc:
        _common.fail(exc, "--json" in sys.argv)


@app.command()
def demo(
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="PATH",
            help="Where the demo keeps its store (default: a new temporary directory).",
            show_default=False,
        ),
    ] = None,
    table: Annotated[
        str, typer.Option("--table", metavar="NAME", help="The table the migration touches.")
    ] = "orders",
    as_json: JsonOption = False,
) -> None:
    """Run the schema-migration guard: crash mid-flight, recover, approve, show the log."""
    from loom.cli import _demo
    from loom.cli._exec import command_runtime

    if db is None:
        db = str(Path(tempfile.mkdtemp(prefix="loom-demo-")) / "loom.db")
    workdir = Path(db).parent
    workdir.mkdir(parents=True, exist_ok=True)
    if Path(db).exists():
        raise_exit = ConfigurationError(
            f"{db} exists already; the demo starts from an empty store",
            hint="Pass another --db, or remove it",
        )
        _common.fail(raise_exit, as_json)
    ledger = str(workdir / "effects.db")
    os.environ["LOOM_DEMO_LEDGER"] = ledger
    eid = f"mig-{table}"
    out = Console(file=io.StringIO()) if as_json else _common.console

    out.rule("[bold]Loom demo: schema-migration guard")
    out.print(
        f"store: SQLite file [cyan]{db}[/] (WAL, synchronous=FULL). Flow: inspect -> "
        "assess-risk -> [yellow]approval gate[/] -> apply.\n"
    )
    out.print(
        "[bold]1.[/] A worker process starts the execution. It is armed to SIGKILL itself "
        "after [cyan]assess-risk[/]'s effect runs but before its result is recorded."
    )
    code = _demo.run_worker_process(db, eid, table, ledger)
    if code != _demo.KILLED:
        _common.fail(
            LoomError(f"the worker was expected to die by SIGKILL, it exited {code}"), as_json
        )
    out.print(f"   worker died (exit {code}, SIGKILL). What the log holds now:")
    summary: dict[str, object] = {"db": db, "execution_id": eid}

    async def after_crash() -> None:
        async with command_runtime(
            store=None, db=db, app_spec=None, mode="write", command="demo"
        ) as (rt, _):
            rt.register(_demo.migration_guard)
            render_timeline(out, await rt.store.read(eid), f"{eid} after the crash")
            counts = _demo.effect_counts(ledger, eid)
            out.print(f"   effects so far: {counts}\n")
            out.print(
                "[bold]2.[/] This fresh process recovers it: [cyan]runtime.recover()[/] "
                "replays the log, serves [cyan]inspect[/] from it, re-runs only the interrupted "
                "step, and stops at the durable gate."
            )
            handle = await rt.recover(eid)
            state = await handle.wait_for_suspend(timeout=30)
            render_state(out, state)
            out.print("\n[bold]3.[/] A malformed approval is refused before anything is recorded:")
            try:
                await rt.resume(eid, "ApprovalGranted", {"approved": "yes please"})
            except loom.ResumeValidationError as exc:
                out.print(f"   [red]refused:[/] {exc.message}")
                summary["refused"] = exc.message
            out.print(
                "\n[bold]4.[/] The DBA approves (the same as "
                f"[cyan]loom resume {eid} ApprovalGranted --data "
                '\'{"approved": true, "approved_by": "dba"}\'[/]):'
            )
            done = await rt.resume(
                eid, "ApprovalGranted", {"approved": True, "approved_by": "dba@example.com"}
            )
            result = await done.result(timeout=30)
            summary["result"] = result
            out.print(f"   result: [green]{result}[/]\n")
            render_timeline(out, await rt.store.read(eid), f"{eid}: the full timeline")
            counts = _demo.effect_counts(ledger, eid)
            summary["effects"] = counts
            out.print(f"effects: {counts}")
            if counts != {"inspect": 1, "assess-risk": 2, "apply": 1}:
                raise LoomError(f"unexpected effect counts {counts}")
            out.print(
                "[green]inspect ran once[/] (committed before the crash, never re-run); "
                "[yellow]assess-risk ran twice[/] (it was the step in flight when the worker "
                "died: the one at-least-once re-run Loom allows); apply ran once.\n"
                f"Inspect it yourself: [cyan]loom show {eid} --db {db}[/]  "
                f"(add [cyan]--at 3[/] for the state as of sequence 3)"
            )

    run(after_crash, as_json)
    if as_json:
        print_json(summary)


def load_flows(spec: str | None) -> list[Flow[Any, Any]]:
    """The flows ``--app`` names (a Flow, a list of flows, a WorkflowRuntime), imported now;
    for command groups that run flows inside their own runtime (``loom approve``)."""
    from loom.cli._load import import_target, require_app

    target = import_target(require_app(spec, "this command"))
    if isinstance(target, WorkflowRuntime):
        return target.flows
    if isinstance(target, Flow):
        return [target]
    if isinstance(target, (list, tuple)) and target and all(isinstance(f, Flow) for f in target):
        return list(target)
    raise ConfigurationError(
        f"--app {spec!r} is a {type(target).__name__}, not a Flow, a list of flows or a "
        "WorkflowRuntime"
    )


def _runtime(db: str, flows: list[Flow[Any, Any]] | None = None) -> WorkflowRuntime:
    """A short-lived command runtime over an existing SQLite Loom database (never created
    here), its timers off (``loom serve`` fires timers)."""
    from loom.cli._store import _check_sqlite

    _check_sqlite(db, "write")
    runtime = WorkflowRuntime(SQLiteStore(db), timers=False)
    if flows:
        runtime.register(*flows)
    return runtime


def _register_groups() -> None:
    from loom.cli import _agents, _branches, _exec, _serve
    from loom.cli._worker import worker_app

    _exec.register(app)
    _serve.register(app)
    app.add_typer(worker_app, name="worker")
    _agents.register(app)  # loom approve / loom reject
    _branches.register(app)  # loom fork / branches / promote / learn report


_register_groups()


def _add_operator_commands() -> None:
    from loom.cli import _console

    _console.register(app)


_add_operator_commands()


def main() -> None:
    """The ``loom`` entry point: every error is one line (a traceback only with
    ``LOOM_DEBUG=1``, for bugs in Loom itself)."""
    try:
        app()
    except SystemExit:
        raise
    except LoomError as exc:
        _common.fail_outside_click(exc, "--json" in sys.argv)
    except KeyboardInterrupt:
        sys.exit(_common.EXIT_INTERRUPTED)
    except Exception as exc:
        if os.environ.get("LOOM_DEBUG"):
            traceback.print_exc()
        _common.fail_outside_click(
            LoomError(
                f"internal error: {type(exc).__name__}: {exc}",
                hint="This is a bug in Loom; LOOM_DEBUG=1 prints the traceback for a report",
            ),
            "--json" in sys.argv,
        )
    sys.exit(EXIT_ERROR)  # pragma: no cover - fail_outside_click exits
