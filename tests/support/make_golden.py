"""Regenerate tests/golden/*.json: `python -m tests.support.make_golden` (only on a deliberate change)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import loom
from loom.cli._demo import MigrationInput, migration_guard

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


async def main() -> None:
    import os
    import tempfile

    os.environ["LOOM_DEMO_LEDGER"] = str(Path(tempfile.mkdtemp()) / "ledger.db")
    rt = loom.WorkflowRuntime(loom.InMemoryStore())
    rt.register(migration_guard)
    inp = MigrationInput(table="orders", ddl="ALTER TABLE orders ADD COLUMN note text")
    await (await rt.start(migration_guard, inp, execution_id="golden-1")).wait_for_suspend()
    (GOLDEN / "migration_guard_suspended.json").write_text(
        json.dumps([e.to_dict() for e in await rt.store.read("golden-1")], indent=1) + "\n"
    )
    done = await rt.resume("golden-1", "ApprovalGranted", {"approved": True, "approved_by": "dba"})
    await done.result()
    envelopes = await rt.store.read("golden-1")
    (GOLDEN / "migration_guard_completed.json").write_text(
        json.dumps([e.to_dict() for e in envelopes], indent=1) + "\n"
    )
    (GOLDEN / "migration_guard_completed.state.json").write_text(
        json.dumps(loom.replay(envelopes).to_dict(), indent=1, sort_keys=True) + "\n"
    )
    await rt.close()


if __name__ == "__main__":
    asyncio.run(main())
