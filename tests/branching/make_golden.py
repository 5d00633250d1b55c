"""Regenerate tests/golden/fork_*.json: `python -m tests.branching.make_golden` (only on a
deliberate change): a branch of the migration guard forked at its gate and completed, and the
parent whose gate the branch's promotion superseded."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path

import loom
from loom.cli._demo import MigrationInput, migration_guard

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


async def main() -> None:
    os.environ["LOOM_DEMO_LEDGER"] = str(Path(tempfile.mkdtemp()) / "ledger.db")
    rt = loom.WorkflowRuntime(loom.InMemoryStore())
    rt.register(migration_guard)
    inp = MigrationInput(table="orders", ddl="ALTER TABLE orders ADD COLUMN note text")
    parent = await (
        await rt.start(migration_guard, inp, execution_id="golden-p")
    ).wait_for_suspend()
    await rt.store.put_ref("main", "golden-p", parent.last_sequence)  # type: ignore[attr-defined]
    await rt.fork("golden-p", parent.last_sequence, branch="sim/b", execution_id="golden-b")
    done = await rt.resume("golden-b", "ApprovalGranted", {"approved": True, "approved_by": "dba"})
    await done.result()
    await rt.promote("sim/b", "main", by="dba")
    for eid, name in (
        ("golden-b", "fork_branch_completed"),
        ("golden-p", "fork_parent_superseded"),
    ):
        envelopes = await rt.store.read(eid)
        (GOLDEN / f"{name}.json").write_text(
            json.dumps([e.to_dict() for e in envelopes], indent=1) + "\n"
        )
        (GOLDEN / f"{name}.state.json").write_text(
            json.dumps(loom.replay(envelopes).to_dict(), indent=1, sort_keys=True) + "\n"
        )
    await rt.close()


if __name__ == "__main__":
    asyncio.run(main())
