"""RELIABILITY scenario 17: a poison execution that kills its worker on every attempt is parked
after k recoveries while healthy executions carry on."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import loom
from loom.model import ExecutionStatus
from tests.children.poison import runtime
from tests.support.proc import run_child


def child(db: Path, mode: str) -> int:
    env = {"LOOM_POISON_DIR": str(db.parent), "LOOM_POISON_DB": str(db)}
    return run_child("poison", db, mode, env=env, timeout=90, capture=False).returncode


def test_a_poison_execution_is_parked_after_k_recoveries(tmp_path: Path) -> None:
    db = tmp_path / "poison.db"
    # The first process dies in the poison step with the healthy execution mid-step.
    assert child(db, "start") == -signal.SIGKILL
    # Each recovery pass claims both; the healthy one finishes, the poison kills the pass.
    for _ in range(3):
        assert child(db, "recover") == -signal.SIGKILL
    assert child(db, "recover") == 0  # the fourth pass parks the poison and survives

    async def check() -> None:
        rt = runtime(str(db))
        healthy = await rt.load_state("healthy")
        assert healthy is not None and healthy.status is ExecutionStatus.COMPLETED
        assert healthy.recoveries == 1  # finished by the first recovery pass
        poison = await rt.load_state("poison")
        assert poison is not None and poison.status is ExecutionStatus.RUNNING
        assert poison.recoveries == 3
        report = await loom.recover_abandoned(rt, is_abandoned=lambda s: True, max_recoveries=3)
        assert report.parked == ["poison"] and report.recovered == []
        await rt.cancel("poison", reason="parked poison execution")  # the operator's way out
        await rt.close()

    asyncio.run(check())
