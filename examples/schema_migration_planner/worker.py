"""A worker process of the crash act: given only the store and an execution id, it starts the
migration (``--change``) or, when the execution exists, continues it, through a LocalDispatcher
over a LocalWorkerRuntime, and exits when the execution suspends or ends. Armed with
``LOOM_FAULTS`` it SIGKILLs itself at that fault point instead.

    python -m examples.schema_migration_planner.worker --id mig-orders [--change backfill]
"""

from __future__ import annotations

import argparse
import asyncio

from examples._support import Placement, local_placement
from examples.schema_migration_planner.app import FLOW_ID, MigrationJob, make_runtime


async def run(execution_id: str, change: str | None) -> str:
    async with local_placement(make_runtime()) as placement:
        return await drive(placement, execution_id, change)


async def drive(placement: Placement, execution_id: str, change: str | None) -> str:
    if await placement.runtime.load_state(execution_id) is None:
        if change is None:
            raise SystemExit(f"{execution_id} does not exist; give --change to start it")
        job = MigrationJob(change=change).model_dump()
        result = await placement.start(FLOW_ID, job, execution_id)
    else:
        result = await placement.proceed(execution_id)
    return str(result.status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--id", required=True)
    parser.add_argument("--change")
    args = parser.parse_args()
    print(asyncio.run(run(args.id, args.change)))


if __name__ == "__main__":
    main()
