"""Two processes promote two branches of one gate on PostgreSQL at once: exactly one wins, the
other gets PromotionConflictError, and the parent records one supersession."""

from __future__ import annotations

import asyncio
import json

import pytest

import loom
from loom.errors import GateSupersededError
from loom.model import ExecutionStatus
from tests.branching.flows import guarded
from tests.support.pg import require_pg, temp_schema
from tests.support.proc import Child


@pytest.mark.postgres
async def test_two_processes_promote_branches_of_one_gate_one_wins() -> None:
    dsn = require_pg()
    from loom.storage.postgres import PostgresStore

    async with temp_schema(dsn) as schema:
        rt = loom.WorkflowRuntime(await PostgresStore.open(dsn, schema=schema), timers=False)
        rt.register(guarded)
        try:
            state = await (await rt.start(guarded, 1, execution_id="p")).wait_for_suspend(30)
            await rt.store.put_ref("main", "p", state.last_sequence)  # type: ignore[attr-defined]
            for name in ("sim/a", "sim/b"):
                await rt.fork("p", state.last_sequence, branch=name)
            procs = [
                Child("promoter", "runtime", dsn, schema, ref, stdin=True)
                for ref in ("sim/a", "sim/b")
            ]
            try:
                for p in procs:
                    await asyncio.to_thread(p.ready, "ready", timeout=30)
                for p in procs:
                    p.send("go")
                ends = [await asyncio.to_thread(p.finish, timeout=60) for p in procs]
            finally:
                for p in procs:
                    p.kill()
            outs = [(out, err) for _, out, err in ends]
            assert [code for code, _, _ in ends] == [0, 0], outs
            results = [json.loads(out.splitlines()[-1]) for out, _ in outs]
            won = [r["won"] for r in results if "won" in r]
            assert len(won) == 1 and {"lost": "PromotionConflictError"} in results, results
            main = await rt.store.get_ref("main")  # type: ignore[attr-defined]
            assert main is not None and main.execution_id == won[0]
            log = await rt.store.read("p")
            superseded = [e for e in log if e.type == "branches.gate_superseded"]
            assert len(superseded) == 1 and superseded[0].payload["branch"] == won[0]
            parent = await rt.load_state("p")
            assert parent is not None and parent.status is ExecutionStatus.CANCELLED
            with pytest.raises(GateSupersededError):
                await rt.resume("p", "Approve", {"plan": "z"})
        finally:
            await rt.close()
