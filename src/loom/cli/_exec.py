"""Commands on executions: ``executions``, ``show``, ``start``, ``resume``, ``cancel``,
``recover``.

Reads open the store read-only (nothing on disk changes); commands that change executions
check what they can read-only first, so a refused command leaves the database byte-identical.
Only ``start`` may create a database.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

import loom
from loom.cli._common import (
    EXIT_ERROR,
    AppOption,
    DbOption,
    JsonOption,
    StoreOption,
    console,
    err_console,
    fail,
    print_json,
    run,
)
from loom.cli._load import load_app, require_app
from loom.cli._render import render_state, render_timeline, timeline_rows, when_iso
from loom.cli._store import DEFAULT_DB, Mode, describe, open_store_url, resolve_url
from loom.errors import (
    ConfigurationError,
    CorruptEventError,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    LoomError,
    NotWaitingError,
    PayloadError,
)
from loom.model import ExecutionState, ExecutionStatus, decode_json, replay
from loom.runtime import WorkflowRuntime
from loom.runtime._context import TIMER_EVENT
from loom.storage import ExecutionQuery
from loom.views import ExecutionViews

__all__ = ["register"]

_MISSING: Any = object()

ExecutionIdArg = Annotated[str, typer.Argument(metavar="EXECUTION_ID", show_default=False)]
DataOption = Annotated[
    str | None,
    typer.Option(
        "--data",
        "-d",
        metavar="JSON|@FILE|-",
        help="The decision as JSON, @FILE to read it from a file, or - for stdin. Default: {} "
        "(every field takes its default).",
        show_default=False,
    ),
]


@asynccontextmanager
async def command_runtime(
    *,
    store: str | None,
    db: str | None,
    app_spec: str | None,
    mode: Mode,
    command: str,
    need_flows: bool = False,
) -> AsyncIterator[tuple[WorkflowRuntime, str]]:
    """A short-lived runtime over the store the options name: ``--store``/``--db``, else the
    store of the ``--app`` runtime, else ``$LOOM_DB`` or ``loom.db``.

    Its timers are off: a command that lives for one call must not claim other executions'
    due timers and exit halfway through waking them (``loom serve`` fires timers).
    """
    flows: list[loom.Flow[Any, Any]] = []
    app_runtime: WorkflowRuntime | None = None
    if need_flows:
        app_spec = require_app(app_spec, command)
    if app_spec:
        flows, app_runtime = await load_app(app_spec)
    url = resolve_url(store, db)
    if url is None and app_runtime is not None:
        store_obj = app_runtime.store
        where = repr(store_obj)
        limits, snapshot_every = app_runtime.limits, app_runtime.snapshot_every
    else:
        url = url or DEFAULT_DB
        store_obj = await open_store_url(url, mode)
        where = describe(url)
        limits, snapshot_every = loom.model.DEFAULT_LIMITS, 256
    rt = WorkflowRuntime(store_obj, timers=False, limits=limits, snapshot_every=snapshot_every)
    try:
        rt.register(*flows)
        yield rt, where
    finally:
        await rt.close()


async def verified_state(rt: WorkflowRuntime, execution_id: str) -> ExecutionState | None:
    """The state folded from the whole log, every record's checksum verified (not from a
    snapshot): so ``executions``, ``show``, ``cancel``, ``resume`` and ``recover`` give one
    verdict on a tampered log, and nothing is written on top of one."""
    envelopes = await rt.store.read(execution_id)
    if not envelopes:
        return None
    return replay(envelopes)


async def _require_state(rt: WorkflowRuntime, execution_id: str, where: str) -> ExecutionState:
    state = await verified_state(rt, execution_id)
    if state is None:
        raise ExecutionNotFoundError(
            f"no execution {execution_id!r} in {where}",
            execution_id=execution_id,
            hint="List them with `loom executions`; check --db/--store",
        )
    return state


def read_data(text: str | None, option: str) -> Any:
    """``--data``/``--input``: JSON text, ``@file``, or ``-`` for stdin; _MISSING if absent."""
    if text is None:
        return _MISSING
    source = "stdin" if text == "-" else text[1:] if text.startswith("@") else None
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            raise ConfigurationError(f"cannot read {option} {text}: {exc.strerror}") from None
    try:
        return decode_json(text)
    except PayloadError as exc:
        what = f"{option} ({source})" if source else option
        raise PayloadError(
            f"{what} is not acceptable JSON: {exc.message}", hint="Nothing was recorded"
        ) from None


def _state_row(s: ExecutionState) -> dict[str, Any]:
    return {
        "execution_id": s.execution_id,
        "flow_id": s.flow_id,
        "flow_version": s.flow_version,
        "status": s.status.value,
        "last_sequence": s.last_sequence,
        "waiting_for": s.waiting.event_type if s.waiting else None,
        "wakes_or_times_out_at": when_iso(s.waiting.timeout_at)
        if s.waiting and s.waiting.timeout_at
        else None,
    }


def _emit_state(state: ExecutionState, as_json: bool, notice: str | None = None) -> None:
    if as_json:
        out = state.to_dict()
        if notice:
            out["notice"] = notice
        print_json(out)
        return
    render_state(console, state)
    if notice:
        console.print(f"[yellow]{notice}[/]")


def executions(
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            "-s",
            metavar="STATUS",
            help="Only these statuses (repeatable): pending, running, suspended, completed, "
            "failed, cancelled.",
            show_default=False,
        ),
    ] = None,
    flow: Annotated[
        str | None,
        typer.Option("--flow", "-f", metavar="FLOW", help="Only this flow id.", show_default=False),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit", "-n", metavar="N", help="At most this many rows.", show_default=False, min=1
        ),
    ] = None,
    store: StoreOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List executions (full ids, newest first) with their status. Read-only."""
    wanted: set[ExecutionStatus] | None = None
    if status:
        try:
            wanted = {ExecutionStatus(s.lower()) for s in status}
        except ValueError:
            known = ", ".join(s.value for s in ExecutionStatus)
            fail(ConfigurationError(f"--status takes {known}; got {', '.join(status)}"), as_json)

    corrupt: list[CorruptEventError] = []

    async def go() -> tuple[list[ExecutionState], str]:
        rows: list[ExecutionState] = []
        async with command_runtime(
            store=store, db=db, app_spec=None, mode="read", command="executions"
        ) as (rt, where):
            # The index answers the filters and the limit, so a listing reads only the logs of
            # the rows it shows; each of those is still verified record by record, so a
            # tampered log gets the same one verdict here as in show, cancel and resume.
            query = ExecutionQuery(
                statuses=frozenset(wanted) if wanted else None,
                flow_id=flow,
                limit=min(limit or 200, 200),
            )
            scanned = 0
            with err_console.status("listing executions...") as progress:
                async for summary in ExecutionViews(rt.store).all(query):
                    scanned += 1
                    if scanned % 500 == 0:
                        progress.update(f"listing executions... {scanned} listed")
                    try:
                        state = await verified_state(rt, summary.execution_id)
                    except CorruptEventError as exc:
                        corrupt.append(exc)
                        state = ExecutionState(summary.execution_id, status=summary.status)
                        state.flow_id = summary.flow_id or "?"
                        rows.append(state)
                    else:
                        if state is None:
                            continue
                        rows.append(state)
                    if limit is not None and len(rows) >= limit:
                        break
        return rows, where

    states, where = run(go, as_json)
    bad = {exc.execution_id for exc in corrupt}
    if as_json:
        rows = [_state_row(s) for s in states]
        for row in rows:
            if row["execution_id"] in bad:
                row["status"] = "corrupt"
        print_json(rows)
        if corrupt:
            raise typer.Exit(EXIT_ERROR)
        return
    if not states:
        console.print(f"no executions in {where}" + (" match" if wanted or flow else ""))
        return
    from rich.table import Table

    table = Table()
    table.add_column("execution", no_wrap=True, overflow="fold", min_width=8)
    for col in ("flow", "version", "status", "events", "waiting for"):
        table.add_column(col)
    for s in states:
        waiting = ""
        if s.waiting and s.waiting.event_type == TIMER_EVENT:
            waiting = f"sleep, wakes at {when_iso(s.waiting.timeout_at)}"
        elif s.waiting:
            waiting = s.waiting.event_type
        table.add_row(
            s.execution_id,
            s.flow_id,
            s.flow_version,
            "[red]corrupt[/]" if s.execution_id in bad else s.status.value,
            str(s.last_sequence + 1),
            waiting,
        )
    console.print(table)
    for exc in corrupt:
        err_console.print(f"[red]error:[/] {exc}", soft_wrap=True)
    if corrupt:
        raise typer.Exit(EXIT_ERROR)


def show(
    execution_id: ExecutionIdArg,
    at: Annotated[
        int | None,
        typer.Option(
            "--at", metavar="SEQ", help="The state as of this sequence (0 = the start).", min=0
        ),
    ] = None,
    store: StoreOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show an execution's timeline and folded state (as of any sequence with --at).
    Read-only."""

    async def go() -> tuple[list[loom.Envelope], ExecutionState]:
        async with command_runtime(
            store=store, db=db, app_spec=None, mode="read", command="show"
        ) as (rt, where):
            state = await _require_state(rt, execution_id, where)
            envelopes = await rt.store.read(execution_id)
            if at is not None:
                if at > state.last_sequence:
                    raise ConfigurationError(
                        f"--at {at} is past the end: execution {execution_id!r} has "
                        f"sequences 0 to {state.last_sequence}",
                        execution_id=execution_id,
                    )
                envelopes = [e for e in envelopes if e.sequence <= at]
                state = replay(envelopes)
            return envelopes, state

    envelopes, state = run(go, as_json)
    if as_json:
        print_json({"state": state.to_dict(), "timeline": timeline_rows(envelopes)})
        return
    title = f"{execution_id}" + (f" up to sequence {at}" if at is not None else "")
    render_timeline(console, envelopes, title)
    render_state(console, state)


def _default_payload(codec: Any) -> Any:
    """What an absent ``--data``/``--input`` means: ``{}`` when the schema takes an object
    (so fields with defaults need no flag), else ``null``."""
    adapter = getattr(codec, "adapter", None)
    if adapter is None:
        return None
    candidates: tuple[Any, ...] = ({}, None)
    for candidate in candidates:
        try:
            adapter.validate_python(candidate)
        except Exception:
            continue
        return candidate
    return {}  # neither: let the schema say which fields are missing


def _recorded_hint(execution_id: str, app_spec: str | None) -> str:
    app = f" --app {app_spec}" if app_spec else ""
    return (
        f"The decision was recorded; the execution is running with nothing driving it "
        f"now. `loom recover {execution_id}{app}` continues it (or `loom serve` does on start)"
    )


def start(
    flow_id: Annotated[
        str, typer.Argument(metavar="FLOW", help="The flow's id (its @loom.flow(id=...)).")
    ],
    input_: Annotated[
        str | None,
        typer.Option(
            "--input",
            "-i",
            metavar="JSON|@FILE|-",
            help="The flow's input as JSON, @FILE, or - for stdin. Default: {} or null.",
            show_default=False,
        ),
    ] = None,
    execution_id: Annotated[
        str | None,
        typer.Option(
            "--id", metavar="ID", help="The execution id (default: a new time-ordered id)."
        ),
    ] = None,
    attach: Annotated[
        bool,
        typer.Option(
            "--attach",
            help="If --id exists already, attach to it instead of refusing (started once).",
        ),
    ] = False,
    flows_app: AppOption = None,
    store: StoreOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start an execution and run it here until it suspends (gate or sleep) or ends. May
    create the database."""
    recorded: list[str] = []

    async def go() -> ExecutionState:
        payload = read_data(input_, "--input")
        async with command_runtime(
            store=store,
            db=db,
            app_spec=flows_app,
            mode="create",
            command="start",
            need_flows=True,
        ) as (rt, _):
            flow = rt.get_flow(flow_id)
            if payload is _MISSING:
                payload = _default_payload(flow.input) if flow.takes_input else None
            try:
                handle = await rt.start(
                    flow,
                    payload,
                    execution_id=execution_id,
                    if_exists="attach" if attach else "error",
                )
            except ExecutionAlreadyExistsError as exc:
                raise _amend(exc, "Pass --attach to attach to it, or pick another --id") from None
            recorded.append(handle.execution_id)
            return await handle.settled()

    def on_interrupt() -> str | None:
        if not recorded:
            return None
        return _recorded_hint(recorded[0], flows_app).replace("The decision", "The start")

    state = run(go, as_json, on_interrupt=on_interrupt)
    _emit_state(state, as_json)


def resume(
    execution_id: ExecutionIdArg,
    event: Annotated[
        str,
        typer.Argument(metavar="EVENT", help="The gate's event type, e.g. ApprovalGranted."),
    ],
    data: DataOption = None,
    position: Annotated[
        int | None,
        typer.Option(
            "--position",
            metavar="N",
            help="The gate position the decision is for (see `loom show`); refused if the "
            "execution waits at another gate.",
            show_default=False,
        ),
    ] = None,
    flows_app: AppOption = None,
    store: StoreOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Deliver a gate's decision and run the execution here until it suspends again or ends."""
    recorded: list[bool] = []

    async def go() -> ExecutionState:
        payload = read_data(data, "--data")
        async with command_runtime(
            store=store, db=db, app_spec=None, mode="read", command="resume"
        ) as (rt, where):
            # Refusals that need no flow code are given before anything opens for writing.
            state = await _require_state(rt, execution_id, where)
            rt._waiting_gate(state, event)
        async with command_runtime(
            store=store,
            db=db,
            app_spec=flows_app,
            mode="write",
            command="resume",
            need_flows=True,
        ) as (rt, _):
            if payload is _MISSING:
                state = await _require_state(rt, execution_id, where)
                flow = rt.get_flow(state.flow_id, state.flow_version)
                payload = _default_payload(flow.resume_schemas.get(event))
            handle = await rt.resume(execution_id, event, payload, position=position)
            recorded.append(True)
            try:
                return await handle.settled()
            except LoomError as exc:
                raise _amend(exc, _recorded_hint(execution_id, flows_app)) from None

    state = run(
        go,
        as_json,
        on_interrupt=lambda: _recorded_hint(execution_id, flows_app) if recorded else None,
    )
    _emit_state(state, as_json)


def _amend(exc: LoomError, hint: str) -> LoomError:
    """The same error, its hint replaced (what to do next has changed)."""
    exc.hint = hint
    text = exc.message
    if exc.execution_id is not None and exc.execution_id not in text:
        text = f"{text} (execution {exc.execution_id!r})"
    exc.args = (f"{text}. {hint}",)
    return exc


def cancel(
    execution_id: ExecutionIdArg,
    reason: Annotated[
        str | None, typer.Option("--reason", metavar="TEXT", help="Recorded with the cancellation.")
    ] = None,
    store: StoreOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel an execution (its holder is fenced out; no later step runs)."""

    async def go() -> tuple[ExecutionState, str | None]:
        async with command_runtime(
            store=store, db=db, app_spec=None, mode="read", command="cancel"
        ) as (rt, where):
            state = await _require_state(rt, execution_id, where)
        if state.status is ExecutionStatus.CANCELLED:
            why = f" (reason: {state.cancel_reason})" if state.cancel_reason else ""
            return state, f"already cancelled{why}; nothing changed"
        if state.is_terminal:
            raise NotWaitingError(
                f"execution {execution_id!r} is {state.status.value}; there is nothing to cancel",
                execution_id=execution_id,
                hint="Nothing was changed",
                status=state.status.value,
            )
        async with command_runtime(
            store=store, db=db, app_spec=None, mode="write", command="cancel"
        ) as (rt, _):
            return await rt.cancel(execution_id, reason=reason), None

    state, notice = run(go, as_json)
    _emit_state(state, as_json, notice)


def recover(
    execution_id: ExecutionIdArg,
    flows_app: AppOption = None,
    store: StoreOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Continue an execution left running by a dead process, or wake its overdue sleep or
    gate timeout; run it here until it suspends or ends."""

    async def go() -> tuple[ExecutionState, str | None]:
        async with command_runtime(
            store=store, db=db, app_spec=None, mode="read", command="recover"
        ) as (rt, where):
            state = await _require_state(rt, execution_id, where)
            now = rt.clock.now()
        waiting = state.waiting
        overdue = (
            state.status is ExecutionStatus.SUSPENDED
            and waiting is not None
            and waiting.timeout_at is not None
            and waiting.timeout_at <= now
        )
        if state.is_terminal or (state.status is ExecutionStatus.SUSPENDED and not overdue):
            what = "it has ended"
            if waiting is not None and waiting.event_type == TIMER_EVENT:
                what = f"it sleeps until {when_iso(waiting.timeout_at)}"
            elif waiting is not None:
                what = f"it waits for {waiting.event_type!r}"
            return state, f"nothing to recover: {what}"
        async with command_runtime(
            store=store,
            db=db,
            app_spec=flows_app,
            mode="write",
            command="recover",
            need_flows=True,
        ) as (rt, _):
            if overdue:
                assert waiting is not None
                _, handle = await rt.fire_timer(execution_id, waiting.position)
                if handle is None:  # someone else woke it meanwhile
                    return await _require_state(rt, execution_id, ""), "woken elsewhere"
                return await handle.settled(), None
            return await (await rt.recover(execution_id)).settled(), None

    state, notice = run(go, as_json)
    _emit_state(state, as_json, notice)


def register(app: typer.Typer) -> None:
    for fn in (executions, show, start, resume, cancel, recover):
        app.command()(fn)
