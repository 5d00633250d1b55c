"""no_live_holder (loom.placement.http._holders): with no live holder, every worker is asked."""

from __future__ import annotations

import asyncio
import socket

import loom
from loom.model import ExecutionStatus
from loom.placement.http import RemoteWorkerRuntime, no_live_holder
from tests.support.http_rig import SECRET, Rig, pkg

# ------------------------------------------------------------------------------ holders


async def test_no_live_holder_asks_every_worker(rig: Rig) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with RemoteWorkerRuntime(dead_url, token=SECRET) as dead:
            live = rig.remote()
            running = asyncio.ensure_future(rig.post(pkg("h-1", "slow").to_dict()))
            await rig.effects.reach("gated-step", 1)
            held = loom.ExecutionState("h-1", status=ExecutionStatus.RUNNING)
            orphan = loom.ExecutionState("o-1", status=ExecutionStatus.RUNNING)
            generous = no_live_holder([dead, live], unreachable_is_dead=True)
            cautious = no_live_holder([dead, live], unreachable_is_dead=False)
            assert await generous(held) is False  # the live worker holds it
            assert await generous(orphan) is True  # nobody alive holds it
            assert await cautious(orphan) is False  # an unreachable worker might
            wrong = no_live_holder(
                [rig.remote(token="wrong-token-wrong-token")], unreachable_is_dead=True
            )
            assert await wrong(orphan) is False  # a worker that refuses is not dead
            rig.gate.set()
            assert (await running).status_code == 200
