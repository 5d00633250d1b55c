"""``loom serve --app module:flows``: run a node. Fires due timers (sleeps wake, gate timeouts
fire), recovers this node's interrupted executions on start, and runs until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from loom.cli import _common
from loom.cli._common import AppOption, DbOption, JsonOption, StoreOption, print_json, run
from loom.cli._load import load_app, require_app
from loom.cli._store import DEFAULT_DB, describe, open_store_url, resolve_url
from loom.errors import ConfigurationError
from loom.runtime import WorkflowRuntime
from loom.runtime.recovery import recover_abandoned

__all__ = ["register"]

log = logging.getLogger("loom.serve")


def serve(
    flows_app: AppOption = None,
    store: StoreOption = None,
    db: DbOption = None,
    recover: Annotated[
        bool,
        typer.Option(
            "--recover/--no-recover",
            help="On start, continue running executions of the flows served here (a single "
            "node's crash leftovers). With several nodes on one PostgreSQL store, pass "
            "--no-recover and use recover_abandoned with your own liveness check.",
        ),
    ] = True,
    max_recoveries: Annotated[
        int,
        typer.Option(
            "--max-recoveries",
            metavar="N",
            help="Park (leave for an operator) executions already recovered this many times.",
            min=1,
        ),
    ] = 10,
    ready_file: Annotated[
        Path | None,
        typer.Option(
            "--ready-file",
            metavar="PATH",
            help="Write the node's summary (JSON) here once serving.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Run a node: fire due timers and recover interrupted executions until stopped."""
    if not _common.log_level_chosen():
        # A long-running node says what it does: INFO unless --log-level chose otherwise.
        logging.getLogger("loom").setLevel(logging.INFO)

    async def go() -> None:
        spec = require_app(flows_app, "serve")
        flows, app_runtime = await load_app(spec)
        url = resolve_url(store, db)
        if url is None and app_runtime is not None:
            store_obj, where = app_runtime.store, repr(app_runtime.store)
        else:
            url = url or DEFAULT_DB
            store_obj, where = await open_store_url(url, "create"), describe(url)
        runtime = WorkflowRuntime(store_obj, timers=False)
        if runtime.timers is None:
            raise ConfigurationError(f"the store {where} keeps no timers; a node needs them")
        runtime.register(*flows)
        names = sorted({f.id for f in flows})
        async with runtime:
            runtime.start_timers()  # a node serves timers: explicitly, from the first moment
            summary: dict[str, Any] = {"store": where, "flows": names, "recovered": []}
            if recover:
                served = set(names)
                report = await recover_abandoned(
                    runtime,
                    is_abandoned=lambda state: state.flow_id in served,
                    wait=False,
                    max_recoveries=max_recoveries,
                )
                summary["recovered"] = report.recovered
                summary["parked"] = report.parked
                for eid in report.recovered:
                    log.info("recovered %s on start", eid)
            log.info(
                "serving flows %s on %s: timers on, %d execution(s) recovered",
                ", ".join(names),
                where,
                len(summary["recovered"]),
            )
            if as_json:
                print_json({"serving": summary})
            if ready_file is not None:
                import json

                tmp = ready_file.with_name(ready_file.name + ".tmp")
                tmp.write_text(json.dumps(summary))
                tmp.replace(ready_file)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            log.info("stopping: executions in flight stay resumable")

    run(go, as_json)


def register(app: typer.Typer) -> None:
    app.command()(serve)
