"""Several real processes over one SQLite file or one PostgreSQL schema: the start race, a
stale fence holder, SIGKILL inside a coalesced batch, and PostgreSQL sessions terminated under
load. The long loops live in ``python -m tests.chaos_store``; this is a short slice of them."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.pg import drop_test_schema, new_schema_name, require_pg
from tests.support.store_harness import (
    Target,
    kill_in_batch,
    race_to_start,
    random_batch_shape,
    stale_holder,
    terminate_under_load,
)

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "sqlite":
        yield Target("sqlite", str(tmp_path / "shared.db"))
        return
    dsn = require_pg()
    schema = new_schema_name()
    try:
        yield Target("postgres", dsn, schema)
    finally:
        asyncio.run(drop_test_schema(dsn, schema))


def test_eight_processes_race_to_start_one_execution(target: Target) -> None:
    outcomes = race_to_start(target, "raced", n=8)
    assert sorted(o["outcome"] for o in outcomes) == ["exists"] * 7 + ["won"], outcomes
    log = target.log()
    winner = next(o for o in outcomes if o["outcome"] == "won")
    assert [(seq, fence) for seq, _, fence in log["raced"]] == [(0, winner["fence"])]


def test_a_stale_holder_in_another_process_is_fenced_out(target: Target) -> None:
    answer_a, answer_b = stale_holder(target, "held")
    assert answer_a["error"] == "StaleFenceError", answer_a
    assert answer_a["execution_id"] == "held"
    assert answer_b["written"] == 20, answer_b
    rows = target.log()["held"]
    assert [seq for seq, _, _ in rows] == list(range(len(rows)))  # dense
    fences = [fence for _, _, fence in rows]
    # single writer: A's events, then only B's, never interleaved
    assert set(fences) == {answer_b["fence_a"], answer_b["fence"]}
    assert fences == sorted(fences)
    assert fences.count(answer_b["fence"]) == 20


@pytest.mark.parametrize("point", ["before_commit", "after_append_before_ack"])
def test_sigkill_inside_a_coalesced_batch_is_all_or_nothing(target: Target, point: str) -> None:
    run = kill_in_batch(target, point, executions=12, count=2, run=f"k-{point}")
    assert run.killed
    assert not run.partial, run.partial
    if point == "before_commit":
        assert run.none == 12, run
    else:
        assert run.whole == 12, run


def test_short_chaos_slice(target: Target) -> None:
    rng = random.Random(20240607)
    for n in range(5):
        point, executions, count = random_batch_shape(rng)
        run = kill_in_batch(target, point, executions, count, run=f"chaos-{n}")
        assert run.killed and not run.partial, run
        assert (
            run.whole == executions
            if point == "after_append_before_ack"
            else run.none == executions
        )


@pytest.mark.postgres
def test_terminated_sessions_under_load_lose_nothing() -> None:
    dsn = require_pg()
    schema = new_schema_name()
    try:
        run = terminate_under_load(Target("postgres", dsn, schema), appends=40, every=30)
    finally:
        asyncio.run(drop_test_schema(dsn, schema))
    assert not run.violations, run.violations
    assert run.terminated >= 3, run
    assert run.failed > 0, "no append met a terminated session: the scenario tested nothing"
