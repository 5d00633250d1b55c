"""Run the DB command center's story:

    python -m examples.db_command_center                    # every act
    python -m examples.db_command_center --act plan         # or requests, crash
    python -m examples.db_command_center --placement http   # on two HTTP worker processes

Each run uses a fresh folder (``--workdir`` to choose) for the store, the effect ledger and
the sample shop database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

from examples._support import http_placement, local_placement, set_env

ACTS = ["requests", "crash", "plan"]


async def main(acts: list[str], kind: str, workdir: Path) -> None:
    from examples.db_command_center import story
    from examples.db_command_center.app import make_runtime

    runtime = make_runtime()
    placement = (
        http_placement(runtime, story.APP, workers=2, workdir=workdir)
        if kind == "http"
        else local_placement(runtime)
    )
    async with placement as p:
        for act in acts:
            if act == "requests":
                await story.act_requests(p)
            elif act == "crash":
                await story.act_crash(p, workdir)
            elif act == "plan":
                if len(acts) > 1:  # the first act archived rows: start from the same shop
                    from examples.db_command_center.app import create_sample_db, sample_db

                    create_sample_db(sample_db())
                await story.act_dispatch_plan(p)


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.db_command_center")
    parser.add_argument("--act", choices=[*ACTS, "all"], default="all")
    parser.add_argument("--placement", choices=["local", "http"], default="local")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="loom-command-center-"))
    workdir.mkdir(parents=True, exist_ok=True)
    set_env(f"sqlite:{workdir / 'loom.db'}", str(workdir / "effects.db"))
    from examples.db_command_center.app import SAMPLE_DB_ENV, create_sample_db

    os.environ[SAMPLE_DB_ENV] = str(workdir / "shop.db")
    made = create_sample_db(workdir / "shop.db")
    print(f"sample shop {workdir / 'shop.db'}: {made['orders']} orders; store {workdir}/loom.db")
    acts = ACTS if args.act == "all" else [args.act]
    asyncio.run(main(acts, args.placement, workdir))


if __name__ == "__main__":
    cli()
