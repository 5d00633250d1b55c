"""The DB command center's web page over the service: open the printed URL in a browser.

python -m examples.db_command_center_web                      # two HTTP workers, SQLite
python -m examples.db_command_center_web --placement local --port 8080
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from examples.db_command_center_server import service
from examples.db_command_center_server.server import CommandCenterService

PAGE = Path(__file__).with_name("page.html")


def build(svc: CommandCenterService) -> Starlette:
    """The service's API plus the page (which follows each request over server-sent events)."""

    async def index(request: Request) -> Response:
        return HTMLResponse(PAGE.read_text(), headers={"Cache-Control": "no-store"})

    return Starlette(routes=[Route("/", index), *svc.routes()])


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.db_command_center_web")
    service.add_options(parser)
    args = parser.parse_args()
    workdir = service.prepare(args)
    asyncio.run(
        service.serve(args, workdir, build, ready=lambda u: print(f"open {u}/ in a browser"))
    )


if __name__ == "__main__":
    cli()
