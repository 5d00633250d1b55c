"""The incident commander as its own process: recover the runs a dead predecessor left
running (this process is their only driver: the commander's flow and its investigators),
then run the commander for the incident (its durable fan-out and plan) and dispatch the plan.
The run's id is the incident, so running it again for the same incident continues the
incident instead of starting it over. Armed with ``LOOM_FAULTS`` it SIGKILLs itself there.

    python -m examples.incident_war_room.commander --incident inc-42
"""

from __future__ import annotations

import argparse
import asyncio
import os

from examples._support import local_placement
from examples.incident_war_room.app import make_runtime
from examples.incident_war_room.story import ALERT, investigate_and_plan, make_bus


async def run(incident: str) -> None:
    print(f"pid {os.getpid()}", flush=True)
    async with local_placement(make_runtime()) as placement:
        bus = make_bus(placement)
        recovered = await bus.recover(is_abandoned=lambda state: True)
        if recovered:
            print(f"recovered {len(recovered)} task(s) left running: {', '.join(recovered)}")
        await investigate_and_plan(bus, incident, ALERT, print)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--incident", required=True)
    args = parser.parse_args()
    asyncio.run(run(args.incident))


if __name__ == "__main__":
    main()
