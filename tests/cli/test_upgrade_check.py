"""The upgrade check names exactly the in-flight executions new code would not replay."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import loom
from loom.cli import app
from loom.model import EventType
from loom.testing import upgrade_check
from tests.support import upgrade_flows as uf

runner = CliRunner()


async def _populate(db: Path) -> dict[str, list[str]]:
    """Suspended executions on both branches, one finished one, one left running."""
    ids: dict[str, list[str]] = {"a": [], "b": []}
    async with loom.WorkflowRuntime(loom.SQLiteStore(db)) as rt:
        rt.register(uf.orders_v1)
        for i in range(6):
            kind = "a" if i % 2 == 0 else "b"
            eid = f"o-{kind}-{i}"
            await (
                await rt.start(uf.orders_v1, uf.Order(kind=kind), execution_id=eid)
            ).wait_for_suspend()
            ids[kind].append(eid)
        done = await rt.start(uf.orders_v1, uf.Order(kind="a"), execution_id="done-a")
        await done.wait_for_suspend()
        await (
            await rt.resume("done-a", "Approval", {"approved": True, "approved_by": "x"})
        ).result()
    # A branch-"a" execution whose process died after its first step: still running.
    store = loom.SQLiteStore(db)
    try:
        fence = await store.acquire_fence("run-a")
        await store.append(
            [
                loom.Envelope.create(
                    "run-a",
                    0,
                    EventType.EXECUTION_STARTED,
                    {"flow_id": "orders", "flow_version": "1", "input": {"kind": "a"}},
                    fence=fence,
                    recorded_at=1.0,
                ),
                loom.Envelope.create(
                    "run-a",
                    1,
                    EventType.STEP_COMPLETED,
                    {"position": 0, "step_id": "reserve", "attempt": 1, "output": "reserved-a"},
                    fence=fence,
                    recorded_at=1.0,
                ),
            ]
        )
    finally:
        await store.close()
    ids["a"].append("run-a")
    return ids


async def test_names_exactly_the_reordered_branch_and_runs_no_effect(db_path: Path) -> None:
    ids = await _populate(db_path)
    uf.EFFECTS.clear()
    store = loom.SQLiteStore(db_path)
    try:
        same = await upgrade_check(store, uf.FLOWS_V1)
        report = await upgrade_check(store, uf.FLOWS_V2)
        assert (await store.last_sequence("run-a")) == 1  # nothing written
    finally:
        await store.close()
    assert same.ok and same.checked == 7  # the completed one is not in flight
    assert not report.ok and report.checked == 7
    assert sorted(i.execution_id for i in report.issues) == sorted(ids["a"])
    issue = next(i for i in report.issues if i.execution_id == "run-a")
    assert (issue.kind, issue.position) == ("non_determinism", 0)
    assert (issue.recorded, issue.requested) == ("step:reserve", "step:charge")
    assert issue.status == "running"
    assert uf.EFFECTS == []  # v1 replaying "run-a" stops before running "charge"


async def test_a_version_the_new_code_dropped_is_reported(db_path: Path) -> None:
    await _populate(db_path)
    other = loom.flow(id="orders", version="2")(uf._v2)
    store = loom.SQLiteStore(db_path)
    try:
        report = await upgrade_check(store, [other])
    finally:
        await store.close()
    assert {i.kind for i in report.issues} == {"flow_missing"} and len(report.issues) == 7


def test_cli_exit_codes_and_json(db_path: Path) -> None:
    import asyncio

    ids = asyncio.run(_populate(db_path))
    ok = runner.invoke(
        app,
        ["upgrade-check", "--app", "tests.support.upgrade_flows:FLOWS_V1", "--db", str(db_path)],
    )
    assert ok.exit_code == 0 and "7 in-flight" in ok.stdout, ok.stdout
    bad = runner.invoke(
        app,
        [
            "upgrade-check",
            "--app",
            "tests.support.upgrade_flows:FLOWS_V2",
            "--db",
            str(db_path),
            "--json",
        ],
    )
    assert bad.exit_code == 1
    named = sorted(i["execution_id"] for i in json.loads(bad.stdout)["issues"])
    assert named == sorted(ids["a"])
    missing = runner.invoke(app, ["upgrade-check", "--app", "nope:x", "--db", str(db_path)])
    assert missing.exit_code == 1 and "nope" in missing.output
