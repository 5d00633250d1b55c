"""The operator commands: ``logs``, ``export``, ``upgrade-check`` and ``console`` (the web
inspector), and the plain-gate decisions behind ``loom approve/reject``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

import loom
from loom.cli import _app as base
from loom.cli import _common as common
from loom.cli._render import render_timeline, timeline_rows
from loom.errors import ConfigurationError, ExecutionNotFoundError, LoomError
from loom.runtime import WorkflowRuntime
from loom.storage import Store

__all__ = ["decide_gate", "register"]

err_console = Console(stderr=True, highlight=False)

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="LOOM_STORE_URL",
        help="PostgreSQL URL of the store (postgresql://...); overrides --db.",
    ),
]


def open_store(db: str | None, url: str | None) -> Store:
    """The store named by ``--url`` (PostgreSQL) or ``--db`` (a SQLite file)."""
    if url:
        if not url.startswith(("postgresql://", "postgres://")):
            raise ConfigurationError(f"--url must be a postgresql:// URL, not {url!r}")
        from loom.storage import PostgresStore

        return PostgresStore(url)
    db = db or "loom.db"
    if db.startswith(("postgresql://", "postgres://")):
        raise ConfigurationError("--db takes a SQLite file; pass a PostgreSQL URL with --url")
    return loom.SQLiteStore(db)


def _runtime(db: str | None, url: str | None, flows_app: str | None = None) -> WorkflowRuntime:
    runtime = WorkflowRuntime(open_store(db, url), timers=False)
    if flows_app is not None:
        runtime.register(*base.load_flows(flows_app))
    return runtime


def _fail(exc: LoomError, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"error": exc.to_dict()}))
    else:
        err_console.print(f"[red]error:[/] {exc}")
    raise typer.Exit(1)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err_console,
        transient=True,
    )


def logs(
    execution_id: str,
    db: common.DbOption = "loom.db",
    url: UrlOption = None,
    after: Annotated[int, typer.Option("--after", help="Only events after this sequence.")] = -1,
    as_json: common.JsonOption = False,
) -> None:
    """Show an execution's timeline: one row per event."""

    async def go() -> list[loom.Envelope]:
        async with _runtime(db, url) as rt:
            envelopes = await rt.store.read(execution_id)
            if not envelopes:
                raise ExecutionNotFoundError(
                    f"no execution {execution_id!r} in this store", execution_id=execution_id
                )
            return [e for e in envelopes if e.sequence > after]

    envelopes = common.run(go, as_json)
    if as_json:
        print(json.dumps(timeline_rows(envelopes)))
    else:
        render_timeline(common.console, envelopes, execution_id)


def export(
    execution_ids: Annotated[list[str] | None, typer.Argument(help="Executions to export.")] = None,
    all_executions: Annotated[
        bool, typer.Option("--all", help="Export every execution in the store.")
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write here instead of standard output.")
    ] = None,
    db: common.DbOption = "loom.db",
    url: UrlOption = None,
) -> None:
    """Export executions as their log (a JSON array of envelopes, the golden-log format): an
    exported execution replays in a test with ``loom.testing.replay_flow``."""
    if not execution_ids and not all_executions:
        _fail(ConfigurationError("name the executions to export, or pass --all"), False)

    async def go() -> list[dict[str, Any]]:
        async with _runtime(db, url) as rt:
            ids = list(execution_ids or [])
            if all_executions:
                ids = [i async for i in rt.store.iterate_execution_ids()]
            rows: list[dict[str, Any]] = []
            with _progress() as bar:
                task = bar.add_task("exporting", total=len(ids))
                for eid in ids:
                    envelopes = await rt.store.read(eid)
                    if not envelopes:
                        raise ExecutionNotFoundError(
                            f"no execution {eid!r} in this store", execution_id=eid
                        )
                    rows.extend(e.to_dict() for e in envelopes)
                    bar.advance(task)
            return rows

    rows = common.run(go, False)
    text = json.dumps(rows, indent=1, ensure_ascii=False)
    if out is None:
        sys.stdout.write(text + "\n")
    else:
        out.write_text(text + "\n", encoding="utf-8")
        err_console.print(f"exported {len(rows)} events to {out}")


async def decide_gate(
    rt: WorkflowRuntime,
    execution_id: str,
    *,
    approve: bool,
    by: str | None,
    reason: str | None,
    data: Any = None,
) -> loom.ExecutionState:
    """Approve or reject the plain gate (``ctx.suspend``) an execution waits on, filling the
    gate schema's conventional fields (see :mod:`loom.console._decide`), and run it on to its
    next wait or its end. ``loom approve/reject`` use it when no agent approval is open."""
    from loom.console._decide import decision_payload, gate_schema

    state = await rt.load_state(execution_id)
    if state is None:
        raise ExecutionNotFoundError(
            f"no execution {execution_id!r} in this store", execution_id=execution_id
        )
    gate = state.waiting
    flow = rt.get_flow(state.flow_id, state.flow_version)
    event = gate.event_type if gate is not None else ""
    payload = decision_payload(
        state, gate_schema(flow, event), approve=approve, by=by, reason=reason, data=data
    )
    handle = await rt.resume(execution_id, event, payload)
    return await handle.settled()


def upgrade_check(
    flows_app: Annotated[
        str,
        typer.Option("--app", envvar="LOOM_APP", help="module:attribute of the NEW code's flows."),
    ],
    db: common.DbOption = "loom.db",
    url: UrlOption = None,
    as_json: common.JsonOption = False,
) -> None:
    """Replay every running or suspended execution against the code in --app (no effect runs)
    and name those that would hit NonDeterminismError after a deploy. Exit 1 if any would."""
    from loom.testing import upgrade_check as check

    async def go() -> Any:
        flows = base.load_flows(flows_app)
        store = open_store(db, url)
        try:
            with _progress() as bar:
                task = bar.add_task("replaying", total=None)
                return await check(store, flows, progress=lambda n: bar.update(task, completed=n))
        finally:
            await store.close()

    report = common.run(go, as_json)
    if as_json:
        print(json.dumps(report.to_dict()))
    elif report.ok:
        common.console.print(
            f"[green]ok:[/] {report.checked} in-flight execution(s) replay unchanged"
        )
    else:
        from rich.table import Table

        table = Table(title=f"{len(report.issues)} of {report.checked} in-flight executions")
        for col in ("execution", "flow", "status", "kind", "position", "recorded", "new code"):
            table.add_column(col, overflow="fold")
        for i in report.issues:
            table.add_row(
                i.execution_id,
                f"{i.flow_id} v{i.flow_version}",
                i.status,
                i.kind,
                "" if i.position is None else str(i.position),
                i.recorded or "",
                i.requested or i.message,
            )
        common.console.print(table)
    if not report.ok:
        raise typer.Exit(1)


def console_command(
    db: common.DbOption = "loom.db",
    url: UrlOption = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 35789,
    flows_app: common.AppOption = None,
) -> None:
    """Serve the web inspector (executions, timelines, gates) on http://HOST:PORT/."""
    import os

    try:
        import uvicorn

        from loom.console import ConsoleConfig, create_app
    except ImportError as exc:
        _fail(
            ConfigurationError(
                f"the console needs the 'console' extra ({exc.name} is not installed): "
                "pip install 'loom-runtime[console]'"
            ),
            False,
        )
        return
    try:
        flows = base.load_flows(flows_app) if flows_app else []
        config = ConsoleConfig(host=host, token=os.environ.get("LOOM_CONSOLE_TOKEN") or None)
        config.check_binding()
        from loom.console import branch_pages

        application = create_app(open_store(db, url), flows, config=config, pages=branch_pages())
    except LoomError as exc:
        _fail(exc, False)
        return
    common.console.print(f"Loom console on [cyan]http://{host}:{port}/[/] (Ctrl-C stops it)")
    uvicorn.run(application, host=host, port=port, log_level="warning")


def register(app: typer.Typer) -> None:
    """Add the operator commands to the ``loom`` app."""
    app.command()(logs)
    app.command()(export)
    app.command("upgrade-check")(upgrade_check)
    app.command("console")(console_command)
