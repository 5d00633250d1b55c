"""An A2A server process for the edge's tests: ``python -m tests.children.a2a_server
--port-file F --agent NAME``, over the SQLite store ``LOOM_TEST_DB``.

Serves the scenario's agents plus ``slow`` (before -> hold -> after; ``hold`` records its
effect, then waits for ``<LOOM_TEST_HOLD_DIR>/release``: the test kills the server inside it).
On start it continues the tasks a killed predecessor left running (it is their only driver).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from pathlib import Path

import uvicorn

import loom
from loom.orchestration import InProcessA2ABus
from loom.orchestration.a2a import create_a2a_app
from loom.storage import SQLiteStore
from tests.support import orchestration as scenario


@loom.step(id="before")
async def before(text: str) -> str:
    scenario.record("before")
    return text.upper()


@loom.step(id="hold")
async def hold(text: str) -> str:
    scenario.record("hold")
    release = Path(os.environ["LOOM_TEST_HOLD_DIR"]) / "release"
    while not release.exists():
        await asyncio.sleep(0.02)  # a test fixture's gate: the parent kills or releases us
    return text + "!"


@loom.step(id="after")
async def after(text: str) -> str:
    scenario.record("after")
    return f"done: {text}"


@loom.flow(id="slow", version="1")
async def slow(ctx: loom.WorkflowContext, text: str) -> str:
    """Three steps; the middle one holds until released."""
    return await ctx.run(after, await ctx.run(hold, await ctx.run(before, text)))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--agent", required=True)
    args = parser.parse_args()
    runtime = loom.WorkflowRuntime(SQLiteStore(os.environ["LOOM_TEST_DB"]))
    bus = InProcessA2ABus(runtime)
    for agent in [*scenario.AGENTS, slow]:
        bus.register(agent)
    app = create_a2a_app(bus, agent=args.agent, max_body_bytes=64 << 10, recover=lambda s: True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    tmp = Path(args.port_file + ".tmp")
    tmp.write_text(str(sock.getsockname()[1]))
    tmp.rename(args.port_file)
    await server.serve(sockets=[sock])


if __name__ == "__main__":
    asyncio.run(main())
