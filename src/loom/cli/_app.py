"""``loom``: run the demo, list and inspect executions, decide gates, cancel and recover."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

import loom
from loom.cli._render import render_state, render_timeline, timeline_rows
from loom.errors import ConfigurationError, LoomError
from loom.model import decode_json
from loom.runtime import Flow, WorkflowRuntime
from loom.storage import SQLiteStore

app = typer.Typer(
    help="Loom: durable execution for agent and workflow code.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(highlight=False)


def _add_worker_commands() -> None:
    from loom.cli._worker import worker_app

    app.add_typer(worker_app, name="worker")


_add_worker_commands()
T = TypeVar("T")

DbOption = Annotated[
    str,
    typer.Option("--db", envvar="LOOM_DB", help="SQLite file of the store."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
AppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        envvar="LOOM_APP",
        help="module:attribute holding your flows (a Flow, a list of flows or a "
        "WorkflowRuntime). Default: the demo's flows.",
    ),
]


def _run(coro_fn: Callable[[], Awaitable[T]], as_json: bool) -> T:
    try:
        return asyncio.run(coro_fn())  # type: ignore[arg-type]
    except LoomError as exc:
        if as_json:
            print(json.dumps({"error": exc.to_dict()}))
        else:
            console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None


def load_flows(spec: str | None) -> list[Flow[Any, Any]]:
    """Resolve ``module:attribute`` to the flows it holds."""
    if not spec:
        from loom.cli._demo import FLOWS

        return list(FLOWS)
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ConfigurationError(f"--app must look like module:attribute, not {spec!r}")
    try:
        target: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load --app {spec!r}: {exc}") from exc
    if isinstance(target, WorkflowRuntime):
        return target.flows
    if isinstance(target, Flow):
        return [target]
    if isinstance(target, (list, tuple)) and all(isinstance(f, Flow) for f in target):
        return list(target)
    raise ConfigurationError(f"--app {spec!r} is not a Flow, a list of flows or a WorkflowRuntime")


def _runtime(db: str, flows: list[Flow[Any, Any]] | None = None) -> WorkflowRuntime:
    # A CLI process lives for one command: it must not claim other executions' due timers and
    # then exit halfway through waking them. Long-lived runtimes (workers) fire timers.
    runtime = WorkflowRuntime(SQLiteStore(db), timers=False)
    if flows:
        runtime.register(*flows)
    return runtime


@app.command()
def demo(
    db: Annotated[str, typer.Option("--db", help="Where the demo keeps its store.")] = (
        ".loom-demo/loom.db"
    ),
    table: Annotated[str, typer.Option(help="The table the migration touches.")] = "orders",
) -> None:
    """Run the schema-migration guard: crash mid-flight, recover, approve, show the log."""
    from loom.cli import _demo

    workdir = Path(db).parent
    if workdir.exists() and workdir.name == ".loom-demo":
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ledger = str(workdir / "effects.db")
    os.environ["LOOM_DEMO_LEDGER"] = ledger
    eid = f"mig-{table}"

    console.rule("[bold]Loom demo: schema-migration guard")
    console.print(
        f"store: SQLite file [cyan]{db}[/] (WAL, synchronous=FULL). Flow: inspect -> "
        "assess-risk -> [yellow]approval gate[/] -> apply.\n"
    )
    console.print(
        "[bold]1.[/] A worker process starts the execution. It is armed to SIGKILL itself "
        "after [cyan]assess-risk[/]'s effect runs but before its result is recorded."
    )
    code = _demo.run_worker_process(db, eid, table, ledger)
    if code != _demo.KILLED:
        console.print(f"[red]the worker was expected to die by SIGKILL, it exited {code}[/]")
        raise typer.Exit(1)
    console.print(f"   worker died (exit {code}, SIGKILL). What the log holds now:")

    async def after_crash() -> None:
        async with _runtime(db, [_demo.migration_guard]) as rt:
            render_timeline(console, await rt.store.read(eid), f"{eid} after the crash")
            counts = _demo.effect_counts(ledger, eid)
            console.print(f"   effects so far: {counts}\n")
            console.print(
                "[bold]2.[/] This fresh process recovers it: [cyan]runtime.recover()[/] "
                "replays the log, serves [cyan]inspect[/] from it, re-runs only the interrupted "
                "step, and stops at the durable gate."
            )
            handle = await rt.recover(eid)
            state = await handle.wait_for_suspend(timeout=30)
            render_state(console, state)
            console.print(
                "\n[bold]3.[/] A malformed approval is refused before anything is recorded:"
            )
            try:
                await rt.resume(eid, "ApprovalGranted", {"approved": "yes please"})
            except loom.ResumeValidationError as exc:
                console.print(f"   [red]refused:[/] {exc.message}")
            console.print(
                "\n[bold]4.[/] The DBA approves (the same as "
                f"[cyan]loom resume {eid} ApprovalGranted --data "
                '\'{"approved": true, "approved_by": "dba"}\'[/]):'
            )
            done = await rt.resume(
                eid, "ApprovalGranted", {"approved": True, "approved_by": "dba@example.com"}
            )
            result = await done.result(timeout=30)
            console.print(f"   result: [green]{result}[/]\n")
            render_timeline(console, await rt.store.read(eid), f"{eid}: the full timeline")
            counts = _demo.effect_counts(ledger, eid)
            console.print(f"effects: {counts}")
            if counts != {"inspect": 1, "assess-risk": 2, "apply": 1}:
                raise LoomError(f"unexpected effect counts {counts}")
            console.print(
                "[green]inspect ran once[/] (committed before the crash, never re-run); "
                "[yellow]assess-risk ran twice[/] (it was the step in flight when the worker "
                "died: the one at-least-once re-run Loom allows); apply ran once.\n"
                f"Inspect it yourself: [cyan]loom show {eid} --db {db}[/]  "
                f"(add [cyan]--at 3[/] for the state as of sequence 3)"
            )

    _run(after_crash, False)


@app.command()
def executions(
    db: DbOption = "loom.db",
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            envvar="LOOM_STORE",
            help="Store URL: sqlite:///path or postgresql://user@host/db[?schema=loom] "
            "(overrides --db).",
        ),
    ] = None,
    status: Annotated[
        list[str] | None, typer.Option("--status", help="Only these statuses (repeatable).")
    ] = None,
    flow: Annotated[str | None, typer.Option("--flow", help="Only this flow id.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many rows.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """List executions (newest first) from the store's index; reads never write."""
    from loom.storage import ExecutionQuery, open_store
    from loom.views import ExecutionViews

    where = store or db
    query = ExecutionQuery(statuses=status or None, flow_id=flow, limit=limit)

    async def go() -> list[loom.model.ExecutionSummary]:
        opened = await open_store(where, read_only=True)
        try:
            return (await ExecutionViews(opened).list(query)).items
        finally:
            await opened.close()

    rows = _run(go, as_json)
    if as_json:
        print(json.dumps([s.to_dict() for s in rows]))
        return
    if not rows:
        console.print(f"no executions in {where}")
        return
    from rich.table import Table

    table = Table()
    for col in ("execution", "flow", "version", "status", "waiting for"):
        table.add_column(col)
    for s in rows:
        table.add_row(
            s.execution_id, s.flow_id, s.flow_version, s.status.value, s.waiting_for or ""
        )
    console.print(table)


@app.command()
def show(
    execution_id: str,
    db: DbOption = "loom.db",
    at: Annotated[int | None, typer.Option("--at", help="State as of this sequence.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Show an execution's timeline and folded state (at any sequence with --at)."""

    async def go() -> tuple[list[loom.Envelope], loom.ExecutionState]:
        async with _runtime(db) as rt:
            state = await rt.load_state(execution_id, at_sequence=at)
            if state is None:
                raise loom.ExecutionNotFoundError(
                    f"no execution {execution_id!r} in {db}", execution_id=execution_id
                )
            envelopes = await rt.store.read(execution_id)
            if at is not None:
                envelopes = [e for e in envelopes if e.sequence <= at]
            return envelopes, state

    envelopes, state = _run(go, as_json)
    if as_json:
        print(json.dumps({"state": state.to_dict(), "timeline": timeline_rows(envelopes)}))
        return
    title = f"{execution_id}" + (f" up to sequence {at}" if at is not None else "")
    render_timeline(console, envelopes, title)
    render_state(console, state)


@app.command()
def resume(
    execution_id: str,
    event: str,
    data: Annotated[str, typer.Option("--data", help="The decision, as JSON.")] = "null",
    db: DbOption = "loom.db",
    flows_app: AppOption = None,
    as_json: JsonOption = False,
    position: Annotated[
        int | None,
        typer.Option(
            "--position",
            help="The gate position the decision is for (see `loom show`); refused if the "
            "execution waits at another gate.",
        ),
    ] = None,
) -> None:
    """Deliver a gate's decision and run the execution until it suspends again or ends."""
    try:
        payload = decode_json(data)
    except loom.errors.PayloadError as exc:
        err = loom.errors.PayloadError(
            f"--data is not acceptable JSON: {exc.message}",
            execution_id=execution_id,
            hint="Nothing was recorded",
        )
        if as_json:
            print(json.dumps({"error": err.to_dict()}))
        else:
            console.print(f"[red]error:[/] {err}")
        raise typer.Exit(1) from None

    async def go() -> loom.ExecutionState:
        async with _runtime(db, load_flows(flows_app)) as rt:
            handle = await rt.resume(execution_id, event, payload, position=position)
            return await handle.settled()

    state = _run(go, as_json)
    if as_json:
        print(json.dumps(state.to_dict()))
    else:
        render_state(console, state)


@app.command()
def cancel(
    execution_id: str,
    reason: Annotated[str | None, typer.Option(help="Recorded with the cancellation.")] = None,
    db: DbOption = "loom.db",
    as_json: JsonOption = False,
) -> None:
    """Cancel an execution (its holder is fenced out; no later step runs)."""

    async def go() -> loom.ExecutionState:
        async with _runtime(db) as rt:
            return await rt.cancel(execution_id, reason=reason)

    state = _run(go, as_json)
    if as_json:
        print(json.dumps(state.to_dict()))
    else:
        render_state(console, state)


@app.command()
def recover(
    execution_id: str,
    db: DbOption = "loom.db",
    flows_app: AppOption = None,
    as_json: JsonOption = False,
) -> None:
    """Continue an execution left running by a dead process."""

    async def go() -> loom.ExecutionState:
        async with _runtime(db, load_flows(flows_app)) as rt:
            return await (await rt.recover(execution_id)).settled()

    state = _run(go, as_json)
    if as_json:
        print(json.dumps(state.to_dict()))
    else:
        render_state(console, state)


def _add_agent_commands() -> None:
    from loom.cli import _agents

    _agents.register(app)


_add_agent_commands()


def main() -> None:
    app()
