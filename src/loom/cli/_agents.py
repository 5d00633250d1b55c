"""``loom approve`` / ``loom reject``: vote on the tool call an agent waits to run."""

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
        db: DbOption = "loom.db",
        flows_app: AppOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Approve the tool call an agent waits on (one vote toward its quorum)."""
        edited = None
        if args is not None:
            try:
                edited = decode_json(args)
            except PayloadError as exc:
                _fail(
                    PayloadError(f"--args is not JSON: {exc.message}", hint="Nothing was recorded"),
                    as_json,
                )
        _vote(execution_id, by, True, reason, args_hash, edited, db, flows_app, as_json)

    @app.command()
    def reject(
        execution_id: str,
        by: ByOption,
        reason: ReasonOption = None,
        args_hash: HashOption = None,
        db: DbOption = "loom.db",
        flows_app: AppOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Reject the tool call an agent waits on (the model is told, with your reason)."""
        _vote(execution_id, by, False, reason, args_hash, None, db, flows_app, as_json)


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
) -> None:
    from loom.agents import pending_approval, vote
    from loom.cli._app import _runtime, load_flows

    async def go() -> dict[str, Any]:
        async with _runtime(db, load_flows(flows_app)) as rt:
            request = await pending_approval(rt, execution_id)
            if request is None:
                raise NotWaitingError(
                    f"execution {execution_id!r} waits on no approval",
                    execution_id=execution_id,
                    hint=f"See `loom show {execution_id}`",
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
