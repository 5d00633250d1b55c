"""Golden logs, replayed on every change to the runtime, the fold or the serialisation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.cli._demo import (
    ApprovalDecision,
    MigrationInput,
    apply_migration,
    assess_risk,
    inspect,
    migration_guard,
)
from loom.errors import NonDeterminismError
from loom.testing import replay_flow

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def load(name: str) -> list[loom.Envelope]:
    return [loom.Envelope.from_dict(d) for d in json.loads((GOLDEN / name).read_text())]


def test_the_fold_of_a_golden_log_is_unchanged() -> None:
    state = loom.replay(load("migration_guard_completed.json"))
    expected = json.loads((GOLDEN / "migration_guard_completed.state.json").read_text())
    assert json.loads(json.dumps(state.to_dict(), sort_keys=True)) == expected


@pytest.mark.parametrize(
    "name", ["migration_guard_suspended.json", "migration_guard_completed.json"]
)
async def test_current_code_replays_the_golden_logs(name: str) -> None:
    state = await replay_flow(migration_guard, load(name))
    assert state.flow_id == "migration-guard"


def _variant(body: Any) -> loom.Flow[Any, Any]:
    return loom.flow(
        id="migration-guard", version="1.0.0", resume_schemas={"ApprovalGranted": ApprovalDecision}
    )(body)


async def _reordered(ctx: loom.WorkflowContext, inp: MigrationInput) -> Any:
    await ctx.run(assess_risk, None)  # type: ignore[arg-type]
    return None


@loom.step(id="inspect-v2")
async def inspect_renamed(table: Any) -> Any:
    return None


async def _renamed(ctx: loom.WorkflowContext, inp: MigrationInput) -> Any:
    await ctx.run(inspect_renamed, inp.table)
    return None


@loom.step(id="audit")
async def audit() -> None:
    return None


async def _inserted(ctx: loom.WorkflowContext, inp: MigrationInput) -> Any:
    from loom.cli._demo import TableRef

    stats = await ctx.run(inspect, TableRef(name=inp.table))
    await ctx.run(audit)
    await ctx.run(assess_risk, stats)
    return None


async def _truncated(ctx: loom.WorkflowContext, inp: MigrationInput) -> Any:
    from loom.cli._demo import TableRef

    await ctx.run(inspect, TableRef(name=inp.table))
    return {"outcome": "early"}


@pytest.mark.parametrize(
    ("body", "position", "recorded", "requested"),
    [
        (_reordered, 0, "step:inspect", "step:assess-risk"),
        (_renamed, 0, "step:inspect", "step:inspect-v2"),
        (_inserted, 1, "step:assess-risk", "step:audit"),
        (_truncated, 1, "step:assess-risk", "return"),
    ],
)
async def test_changed_code_fails_loudly(
    body: Any, position: int, recorded: str, requested: str
) -> None:
    with pytest.raises(NonDeterminismError) as info:
        await replay_flow(_variant(body), load("migration_guard_completed.json"))
    details = info.value.details
    assert (details["position"], details["recorded"], details["requested"]) == (
        position,
        recorded,
        requested,
    )


async def test_code_that_would_record_more_than_the_log_is_caught() -> None:
    async def extra_tail(ctx: loom.WorkflowContext, inp: MigrationInput) -> Any:
        await migration_guard.fn(ctx, inp)
        await ctx.run(apply_migration, "again")
        return None

    with pytest.raises(NonDeterminismError, match="beyond the recorded log"):
        await replay_flow(_variant(extra_tail), load("migration_guard_completed.json"))
