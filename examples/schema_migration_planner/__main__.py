"""Run the schema-migration planner's story:

    python -m examples.schema_migration_planner                 # every act
    python -m examples.schema_migration_planner --act crash     # one act
    python -m examples.schema_migration_planner --placement http   # on HTTP worker processes

Each run uses a fresh folder (``--workdir`` to choose) for its SQLite store and effect ledger.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from examples._support import Placement, http_placement, local_placement, set_env

ACTS = ["gate", "crash", "branches", "propensity"]


def placement_for(kind: str, workdir: Path) -> AbstractAsyncContextManager[Placement]:
    from examples.schema_migration_planner.app import make_runtime
    from examples.schema_migration_planner.story import APP

    if kind == "http":
        return http_placement(make_runtime(), APP, workers=2, workdir=workdir)
    return local_placement(make_runtime())


async def main(acts: list[str], kind: str, workdir: Path) -> None:
    from examples.schema_migration_planner import story

    async with placement_for(kind, workdir) as placement:
        for act in acts:
            if act == "gate":
                await story.act_gate(placement)
            elif act == "crash":
                await story.act_crash(placement, workdir)
            elif act == "branches":
                await story.act_branches(placement)
            elif act == "propensity":
                await story.act_propensity(placement)


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.schema_migration_planner")
    parser.add_argument("--act", choices=[*ACTS, "all"], default="all")
    parser.add_argument("--placement", choices=["local", "http"], default="local")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="loom-migrations-"))
    workdir.mkdir(parents=True, exist_ok=True)
    # Before the app is imported: its model and every worker process read these.
    set_env(f"sqlite:{workdir / 'loom.db'}", str(workdir / "effects.db"))
    print(f"store {workdir / 'loom.db'}, effect ledger {workdir / 'effects.db'}")
    acts = ACTS if args.act == "all" else [args.act]
    asyncio.run(main(acts, args.placement, workdir))


if __name__ == "__main__":
    cli()
