"""Record the stored bytes of every built-in event the runtime writes, on a virtual clock.

`python -m tests.support.wire_record` rewrites tests/golden/wire_format.json (only on a deliberate
change of the wire format); tests/model/test_wire_format.py compares today's bytes with that file.
Uses only the public API, so the same script runs against any version of Loom.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pydantic

import loom
from loom.testing import SkippingClock

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "wire_format.json"
_TRACEBACK = re.compile(r'"traceback":"(?:[^"\\]|\\.)*"')


class Approval(pydantic.BaseModel):
    approved: bool
    by: str = ""


_flaky_calls: dict[str, int] = {}


@loom.step(id="recorded", record_start=True)
async def recorded(x: int) -> int:
    return x + 1


@loom.step(id="flaky", retry=loom.RetryPolicy(max_attempts=3, initial_backoff=2.0))
async def flaky() -> str:
    _flaky_calls["n"] = _flaky_calls.get("n", 0) + 1
    if _flaky_calls["n"] < 2:
        raise RuntimeError("transient")
    return "ok"


@loom.step(id="broken")
async def broken() -> None:
    raise ValueError("for good")


@loom.flow(id="wire-all", version="3", resume_schemas={"Approve": Approval})
async def wire_all(ctx: loom.WorkflowContext, n: int) -> dict[str, Any]:
    a = await ctx.run(recorded, n)
    b = await ctx.run(flaky)
    try:
        await ctx.run(broken)
    except loom.StepFailedError:
        pass
    pick = await ctx.decide("pick", lambda: 7)
    ctx.ui.set("phase", "waiting")
    ctx.ui.merge("info", {"a": a})
    decision = await ctx.suspend("Approve", correlation_key="k1", timeout=timedelta(hours=1))
    await ctx.sleep(timedelta(minutes=5))
    try:
        await ctx.suspend("Late", timeout=30)
    except loom.GateTimedOutError:
        pass
    return {"a": a, "b": b, "pick": pick, "by": decision.by}


@loom.flow(id="wire-fail")
async def wire_fail(ctx: loom.WorkflowContext) -> None:
    raise KeyError("boom")


@loom.flow(id="wire-gate")
async def wire_gate(ctx: loom.WorkflowContext) -> None:
    await ctx.suspend("Never")


_entered = asyncio.Event()
_release = asyncio.Event()


@loom.step(id="held")
async def held() -> int:
    _entered.set()
    await _release.wait()
    return 1


@loom.flow(id="wire-recover")
async def wire_recover(ctx: loom.WorkflowContext) -> int:
    return await ctx.run(held)


def _rows(envelopes: list[loom.Envelope]) -> list[dict[str, Any]]:
    return [
        {
            "execution_id": e.execution_id,
            "sequence": e.sequence,
            "type": str(e.type),
            "payload_json": _TRACEBACK.sub('"traceback":"-"', e.payload_json),
        }
        for e in envelopes
    ]


async def record() -> list[dict[str, Any]]:
    """Run flows that write every built-in event type; return their stored records."""
    _flaky_calls.clear()
    _entered.clear()
    _release.clear()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "wire.db"
        clock = SkippingClock()
        rt = loom.WorkflowRuntime(loom.SQLiteStore(db), clock=clock, timers=False)
        rt.register(wire_all, wire_fail, wire_gate, wire_recover)
        handle = await rt.start(wire_all, 1, execution_id="all", metadata={"team": "db"})
        await handle.wait_for_suspend()
        await (
            await rt.resume("all", "Approve", {"approved": True, "by": "ann"})
        ).wait_for_suspend()
        assert rt.timers is not None
        clock.advance(301)
        await rt.timers.run_due()
        await rt.handle("all").wait_for_suspend()
        clock.advance(31)
        await rt.timers.run_due()
        await rt.handle("all").result(timeout=30)
        rows += _rows(await rt.store.read("all"))
        try:
            await (await rt.start(wire_fail, execution_id="fail")).result(timeout=30)
        except loom.LoomError:
            pass
        rows += _rows(await rt.store.read("fail"))
        await (await rt.start(wire_gate, execution_id="gate")).wait_for_suspend()
        await rt.cancel("gate", "no longer needed")
        rows += _rows(await rt.store.read("gate"))
        await rt.start(wire_recover, execution_id="rec")
        await _entered.wait()
        await rt.close()  # leaves "rec" running, as a crash would
        rt = loom.WorkflowRuntime(loom.SQLiteStore(db), clock=clock, timers=False)
        rt.register(wire_recover)
        _release.set()
        await (await rt.recover("rec")).result(timeout=30)
        rows += _rows(await rt.store.read("rec"))
        await rt.close()
    return rows


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(asyncio.run(record()), indent=1) + "\n")
