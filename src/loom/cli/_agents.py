"""``loom approve`` / ``loom reject``: vote on the tool call an agent waits to run, or decide
the plain gate (``ctx.suspend``) an execution waits on."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from rich.console import Console

from loom.errors import LoomError, NotWaitingError, PayloadError
from loom.model import decode_json

console = Console(highlight=False)

ByOption = Annotated[str, typer.Option("--by", help="Who votes (checked against the approvers).")]
ReasonOption = Annotated[str | None, typer.Option("--reason", help="Recorded with the vote.")]
HashOption = Annotated[
    str | None,
    typer.Option(
        "--hash",
        help="The arguments' hash you reviewed (shown by a vote); a vote for other arguments "
        "is refused. Default: the open request's.",
    ),
]


DbOption = Annotated[str, typer.Option("--db", envvar="LOOM_DB", help="SQLite file of the store.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
DataOption = Annotated[
    str | None,
    typer.Option(
        "--data", help="A plain gate only: more fields of the decision, as a JSON object."
    ),
]
AppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        envvar="LOOM_APP",
        help="module:attribute holding your flows and agents (they run on after the vote).",
    ),
]


def register(app: typer.Typer) -> None:
    """Add the agent commands to the ``loom`` app."""

    @app.command()
    def approve(
        execution_id: str,
        by: ByOption,
        reason: ReasonOption = None,
        args_hash: HashOption = None,
        args: Annotated[
            str | None,
            typer.Option("--args", help="Edited arguments as JSON (they need their own votes)."),
        ] = None,
        data: DataOption = None,
        db: DbOption = "loom.db",
        flows_app: AppOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Approve the tool call an agent waits on (one vote toward its quorum), or the plain
        gate an execution waits on (``approved``, the identity field of its schema)."""
        edited = _json_option("--args", args, as_json)
        extra = _json_option("--data", data, as_json)
        _vote(execution_id, by, True, reason, args_hash, edited, db, flows_app, as_json, extra)

    @app.command()
    def reject(
        execution_id: str,
        by: ByOption,
        reason: ReasonOption = None,
        args_hash: HashOption = None,
        data: DataOption = None,
        db: DbOption = "loom.db",
        flows_app: AppOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Reject the tool call an agent waits on (the model is told, with your reason), or
        the plain gate an execution waits on (its flow decides what a rejection does)."""
        extra = _json_option("--data", data, as_json)
        _vote(execution_id, by, False, reason, args_hash, None, db, flows_app, as_json, extra)


def _json_option(name: str, text: str | None, as_json: bool) -> Any:
    if text is None:
        return None
    try:
        return decode_json(text)
    except PayloadError as exc:
        _fail(
            PayloadError(f"{name} is not JSON: {exc.message}", hint="Nothing was recorded"), as_json
        )
    return None


def _fail(exc: LoomError, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"error": exc.to_dict()}))
    else:
        console.print(f"[red]error:[/] {exc}")
    raise typer.Exit(1)


def _vote(
    execution_id: str,
    by: str,
    approve: bool,
    reason: str | None,
    args_hash: str | None,
    edited: Any,
    db: str,
    flows_app: str | None,
    as_json: bool,
    data: Any = None,
) -> None:
    from loom.agents import pending_approval, vote
    from loom.cli._app import _runtime, load_flows
    from loom.cli._console import decide_gate

    async def go() -> dict[str, Any]:
        async with _runtime(db, load_flows(flows_app)) as rt:
            request = await pending_approval(rt, execution_id)
            if request is None:
                current = await rt.load_state(execution_id)
                if current is None or current.waiting is None:
                    raise NotWaitingError(
                        f"execution {execution_id!r} waits on no approval",
                        execution_id=execution_id,
                        hint=f"See `loom show {execution_id}`",
                    )
                # A plain gate (ctx.suspend): decide it through its resume schema.
                gate = current.waiting.event_type
                state = await decide_gate(
                    rt, execution_id, approve=approve, by=by, reason=reason, data=data
                )
                return {
                    "execution_id": execution_id,
                    "vote": "approve" if approve else "reject",
                    "by": by,
                    "gate": gate,
                    "status": state.status.value,
                    "state": state.to_dict(),
                }
            if data is not None:
                raise PayloadError(
                    "--data decides a plain gate; this execution waits on an agent's tool "
                    "call (edit its arguments with --args)",
                    execution_id=execution_id,
                    hint="Nothing was recorded",
                )
            handle = await vote(
                rt,
                execution_id,
                by=by,
                approve=approve,
                reason=reason,
                args=edited,
                args_hash=args_hash or request["args_hash"],
            )
            state = await handle.settled()
            after = await pending_approval(rt, execution_id)
            return {
                "execution_id": execution_id,
                "vote": "approve" if approve else "reject",
                "by": by,
                "tool": request["tool"],
                "args": request["args"],
                "args_hash": request["args_hash"],
                "status": state.status.value,
                "waiting_for": after,
            }

    try:
        summary = asyncio.run(go())
    except LoomError as exc:
        _fail(exc, as_json)
        return
    if as_json:
        print(json.dumps(summary))
        return
    verdict = "approved" if approve else "rejected"
    if "gate" in summary:
        console.print(
            f"{verdict} by {by}: gate {summary['gate']}; "
            f"execution {execution_id} is {summary['status']}"
        )
        return
    call = f"{summary['tool']}({json.dumps(summary['args'])})"
    console.print(f"{verdict} by {by}: {call} [dim]{summary['args_hash'][:16]}[/]")
    after = summary["waiting_for"]
    if after is not None:
        voted = ", ".join(after["voted"]) or "none"
        console.print(
            f"still waiting: {after['quorum']} approval(s) of {after['tool']} "
            f"[dim]{after['args_hash'][:16]}[/], voted so far: {voted}"
        )
    else:
        console.print(f"execution {execution_id} is {summary['status']}")
