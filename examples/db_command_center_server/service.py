"""Running the service: the store, the sample database, the placement (two HTTP worker
processes, or in-process), requests a dead predecessor left running, and uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import tempfile
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from starlette.applications import Starlette

from examples._support import (
    LEDGER_ENV,
    STORE_ENV,
    Placement,
    http_placement,
    index_of,
    local_placement,
    open_store,
)
from examples.db_command_center.app import FLOW_ID, SAMPLE_DB_ENV, create_sample_db, make_runtime
from examples.db_command_center_server.server import CommandCenterService
from loom.model import ExecutionStatus
from loom.storage import ExecutionQuery

APP = "examples.db_command_center.app:make_runtime"


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--placement", choices=["http", "local"], default="http")
    parser.add_argument("--workers", type=int, default=2, help="HTTP worker processes")
    parser.add_argument(
        "--store", help="sqlite:<path> or postgres:<schema>:<dsn> (default: SQLite in --workdir)"
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path, default=None)
    parser.add_argument(
        "--first-worker-faults", default=None, help="LOOM_FAULTS for the first worker (demo)"
    )


def prepare(args: argparse.Namespace) -> Path:
    """Point this process (and the workers it starts) at the store, ledger and sample shop."""
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="loom-command-center-"))
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ[STORE_ENV] = (
        args.store or os.environ.get(STORE_ENV) or f"sqlite:{workdir / 'loom.db'}"
    )
    os.environ.setdefault(LEDGER_ENV, str(workdir / "effects.db"))
    os.environ.setdefault(SAMPLE_DB_ENV, str(workdir / "shop.db"))
    if not Path(os.environ[SAMPLE_DB_ENV]).exists():
        create_sample_db(os.environ[SAMPLE_DB_ENV])
    return workdir


async def continue_abandoned(placement: Placement) -> list[str]:
    """Requests left running when this service last stopped (it is the only node driving
    them): continue each from the store, in the background."""
    page = await index_of(placement.runtime.store).list_executions(
        ExecutionQuery(flow_id=FLOW_ID, statuses=[ExecutionStatus.RUNNING], limit=500)
    )
    ids = [s.execution_id for s in page.items]
    for eid in ids:
        task = asyncio.create_task(placement.proceed(eid))
        _background.add(task)
        task.add_done_callback(_background.discard)
    return ids


_background: set[asyncio.Task[object]] = set()


async def serve(
    args: argparse.Namespace,
    workdir: Path,
    build: Callable[[CommandCenterService], Starlette],
    ready: Callable[[str], None] | None = None,
    until: asyncio.Event | None = None,
) -> None:
    """Serve until cancelled (or until ``until`` is set)."""
    import uvicorn

    store = open_store()
    await store.last_sequence("__open__")  # create the schema before any worker races to
    await store.close()
    runtime = make_runtime()
    placement: AbstractAsyncContextManager[Placement] = (
        http_placement(
            runtime,
            APP,
            workers=args.workers,
            workdir=workdir,
            max_attempts=2,
            first_worker_faults=args.first_worker_faults,
        )
        if args.placement == "http"
        else local_placement(runtime)
    )
    async with placement as p:
        resumed = await continue_abandoned(p)
        if resumed:
            print(f"continuing {len(resumed)} request(s) left running: {', '.join(resumed)}")
        service = CommandCenterService(p)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", args.port))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(build(service), log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        if args.port_file is not None:
            args.port_file.write_text(url)
        if ready is not None:
            ready(url)
        try:
            if until is not None:
                await until.wait()
                server.should_exit = True
            await task
        finally:
            server.should_exit = True
            sock.close()
