"""Record tests/agents/golden/*.json: `python -m tests.agents.make_golden` (only on purpose).

`agent_v1_*` are logs of the first agents release (model calls as STEP_COMPLETED of
`agents.model:<id>`, votes as EXECUTION_RESUMED payloads): recorded with that Loom on
PYTHONPATH; they must keep loading and replaying after the vocabulary moved on.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path

import loom
import loom.agents
from loom.testing import SkippingClock
from tests.agents.golden_agent import make_agent

GOLDEN = Path(__file__).parent / "golden"


async def main(prefix: str) -> None:
    store = loom.InMemoryStore()
    rt = loom.WorkflowRuntime(store, clock=SkippingClock())
    agent = make_agent()
    rt.register(agent)
    eid = "golden-agent-1"
    await (
        await rt.start(agent, "Stock of A and B? Refund o-7.", execution_id=eid)
    ).wait_for_suspend()

    async def dump(name: str) -> None:
        events = await store.read(eid)
        names: set[str] = set()
        for e in events:
            names.update(_hashes(e.payload))
        blobs = await store.get_blobs(names)
        doc = {
            "events": [e.to_dict() for e in events],
            "blobs": {h: base64.b64encode(d).decode() for h, d in sorted(blobs.items())},
        }
        (GOLDEN / f"{prefix}_{name}.json").write_text(json.dumps(doc, indent=1) + "\n")

    await dump("suspended")
    await loom.agents.vote(rt, eid, by="alice")
    handle = await loom.agents.vote(rt, eid, by="bob")
    await handle.result()
    await dump("completed")
    await rt.close()


def _hashes(value: object) -> set[str]:
    if isinstance(value, str):
        return (
            {value} if len(value) == 64 and all(c in "0123456789abcdef" for c in value) else set()
        )
    if isinstance(value, dict):
        return set().union(*(_hashes(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_hashes(v) for v in value)) if value else set()
    return set()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "agent_v1"))
