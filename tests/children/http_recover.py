"""A recovery pass from a fresh process: ``python -m tests.children.http_recover --out F --urls U``.

Runs ``recover_abandoned`` over the shared store with the predicate "no live HTTP worker holds
it" and writes the report as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

import loom
from loom.placement.http import RemoteWorkerRuntime, no_live_holder
from tests.support.http_flows import make_runtime


async def main(args: argparse.Namespace) -> None:
    token = os.environ["LOOM_TEST_WORKER_TOKEN"]
    remotes = [RemoteWorkerRuntime(url, token=token) for url in args.urls.split(",")]
    runtime = make_runtime()
    report = await loom.recover_abandoned(
        runtime, is_abandoned=no_live_holder(remotes, unreachable_is_dead=True), timeout=60
    )
    with open(args.out, "w") as out:
        json.dump(
            {
                "recovered": sorted(report.recovered),
                "not_claimed": sorted(report.not_claimed),
                "settled": sorted(report.settled),
                "left": {k: repr(v) for k, v in report.left.items()},
                "outcomes": {k: s.status.value for k, s in report.outcomes.items()},
            },
            out,
        )
    for remote in remotes:
        await remote.close()
    await runtime.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--urls", required=True)
    asyncio.run(main(parser.parse_args()))
