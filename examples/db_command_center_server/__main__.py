"""The DB command center as an HTTP service.

    python -m examples.db_command_center_server            # the story: a client drives it
    python -m examples.db_command_center_server --serve    # serve until Ctrl-C

By default requests run on two HTTP worker processes (``--placement local``: in-process); the
store is SQLite in a fresh folder unless ``--store postgres:<schema>:<dsn>`` (or
``LOOM_EXAMPLE_STORE``) names PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio

from examples.db_command_center_server import service, story


async def _story(args: argparse.Namespace) -> None:
    workdir = service.prepare(args)
    urls: list[str] = []
    stop = asyncio.Event()
    server = asyncio.create_task(
        service.serve(args, workdir, lambda s: s.app(), ready=urls.append, until=stop)
    )
    while not urls:
        if server.done():
            server.result()
        await asyncio.sleep(0.02)
    print(f"service at {urls[0]} ({args.placement} placement), folder {workdir}")
    try:
        await story.run_client(urls[0])
    finally:
        stop.set()
        await server


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.db_command_center_server")
    service.add_options(parser)
    parser.add_argument("--serve", action="store_true", help="serve until interrupted")
    args = parser.parse_args()
    if args.serve:
        workdir = service.prepare(args)
        asyncio.run(
            service.serve(args, workdir, lambda s: s.app(), ready=lambda u: print(f"serving {u}"))
        )
    else:
        asyncio.run(_story(args))


if __name__ == "__main__":
    cli()
