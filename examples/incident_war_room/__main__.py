"""Run the incident war room's story:

python -m examples.incident_war_room                     # every act
python -m examples.incident_war_room --act commander     # or incident, crash
python -m examples.incident_war_room --placement http    # on two HTTP worker processes
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

from examples._support import http_placement, local_placement, set_env

ACTS = ["incident", "crash", "commander"]


async def main(acts: list[str], kind: str, workdir: Path) -> None:
    from examples.incident_war_room import story
    from examples.incident_war_room.app import make_runtime

    runtime = make_runtime()
    placement = (
        http_placement(runtime, story.APP, workers=2, workdir=workdir)
        if kind == "http"
        else local_placement(runtime)
    )
    async with placement as p:
        for act in acts:
            if act == "incident":
                await story.act_incident(p, workdir)
            elif act == "crash":
                await story.act_crash(p, workdir)
            elif act == "commander":
                await story.act_commander_crash(workdir)


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.incident_war_room")
    parser.add_argument("--act", choices=[*ACTS, "all"], default="all")
    parser.add_argument("--placement", choices=["local", "http"], default="local")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="loom-war-room-"))
    workdir.mkdir(parents=True, exist_ok=True)
    set_env(f"sqlite:{workdir / 'loom.db'}", str(workdir / "effects.db"))
    from examples.incident_war_room.app import CLOCK_ENV

    os.environ[CLOCK_ENV] = str(workdir / "clock-offset")
    print(f"store {workdir / 'loom.db'}, effect ledger {workdir / 'effects.db'}")
    acts = ACTS if args.act == "all" else [args.act]
    asyncio.run(main(acts, args.placement, workdir))


if __name__ == "__main__":
    cli()
