"""A worker process for the examples' crash acts: given an app, an execution id and (to start
it) a flow and input, it starts the execution or, when it exists, continues it through a
LocalDispatcher over a LocalWorkerRuntime, prints the status and exits when it suspends or
ends. Armed with ``LOOM_FAULTS`` it SIGKILLs itself at that fault point instead.

    python -m examples._worker --app examples.db_command_center.app:make_runtime --id X \
        [--flow db-command-center --input '{"text": "..."}']
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json

from examples._support import local_placement


async def run(app: str, execution_id: str, flow: str | None, input: str | None) -> str:
    module, _, attr = app.partition(":")
    runtime = getattr(importlib.import_module(module), attr)()
    async with local_placement(runtime) as placement:
        if await placement.runtime.load_state(execution_id) is None:
            if flow is None:
                raise SystemExit(f"{execution_id} does not exist; give --flow and --input")
            result = await placement.start(flow, json.loads(input or "null"), execution_id)
        else:
            result = await placement.proceed(execution_id)
    return str(result.status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--app", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--flow")
    parser.add_argument("--input")
    args = parser.parse_args()
    print(asyncio.run(run(args.app, args.id, args.flow, args.input)))


if __name__ == "__main__":
    main()
