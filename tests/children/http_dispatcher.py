"""A dispatcher process over remote workers: ``python -m tests.children.http_dispatcher ...``.

Dispatches every id at once through ``LocalDispatcher(FailoverWorkerRuntime([Remote...]))``
and appends one JSON line per settled dispatch to ``--out`` (flushed at once, so a parent that
SIGKILLs this process still reads what had settled).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from loom.placement import ExecutionPackage, LocalDispatcher
from loom.placement.http import FailoverWorkerRuntime, RemoteWorkerRuntime


async def main(args: argparse.Namespace) -> None:
    token = os.environ["LOOM_TEST_WORKER_TOKEN"]
    remotes = [RemoteWorkerRuntime(url, token=token, timeout=None) for url in args.urls.split(",")]
    dispatcher = LocalDispatcher(
        FailoverWorkerRuntime(remotes),
        max_attempts=args.max_attempts,
        execute_timeout=args.execute_timeout,
    )
    with open(args.out, "a", buffering=1) as out:

        async def one(index: int, execution_id: str) -> None:
            package = ExecutionPackage(execution_id=execution_id, flow_id=args.flow, input=index)
            line: dict[str, Any] = {"execution_id": execution_id}
            try:
                result = await dispatcher.dispatch(package)
            except Exception as exc:
                line.update(error=type(exc).__name__, message=str(exc))
            else:
                line.update(status=result.status.value, output=result.output, error=result.error)
            out.write(json.dumps(line) + "\n")

        await asyncio.gather(*(one(i, eid) for i, eid in enumerate(args.ids.split(","))))
        out.write(json.dumps({"done": True, "attempts": dispatcher.attempts}) + "\n")
    for remote in remotes:
        await remote.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--urls", required=True)
    parser.add_argument("--flow", required=True)
    parser.add_argument("--ids", required=True)
    parser.add_argument("--max-attempts", type=int, default=2)
    parser.add_argument("--execute-timeout", type=float, default=45.0)
    asyncio.run(main(parser.parse_args()))
