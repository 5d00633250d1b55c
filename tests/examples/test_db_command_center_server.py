"""The DB command center service as a real process, driven over HTTP: in-process placement on
SQLite (its crash act: the service itself SIGKILLed mid-request and restarted, continuing the
request from the store) and two HTTP worker processes on PostgreSQL (the first worker
SIGKILLed mid-request, the request redispatched to the second). The effect ledger is the
oracle: the planner is paid once either way, and only the approved write runs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import psycopg
import pytest

from examples._support import LEDGER_ENV, STORE_ENV, Ledger
from examples.db_command_center.app import SAMPLE_DB_ENV
from examples.db_command_center.story import REQUESTS
from examples.db_command_center_server.story import run_client, settled
from tests.support.pg import drop_test_schema
from tests.support.proc import Child, run_child

PG_DSN = os.environ.get("LOOM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
CRASH = "agents.after_model_recorded=kill@1"


def _pg_or_skip() -> str:
    try:
        with psycopg.connect(PG_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        if os.environ.get("LOOM_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL unreachable at {PG_DSN}: {exc}", pytrace=False)
        pytest.skip(f"PostgreSQL unreachable at {PG_DSN}: {exc}")
    return PG_DSN


@asynccontextmanager
async def service(
    tmp_path: Path, *args: str, faults: str | None = None
) -> AsyncIterator[tuple[Child, str]]:
    """The service process (``--serve``), its URL once it answers; SIGKILLed on exit."""
    name = f"service-{secrets.token_hex(3)}"
    port_file = tmp_path / f"{name}.url"
    proc = Child(
        "examples.db_command_center_server", "--serve",
        "--workdir", tmp_path, "--port-file", port_file, *args,
        env={"LOOM_FAULTS": faults} if faults else None, log=tmp_path / f"{name}.log",
    )  # fmt: skip
    try:
        yield proc, await proc.serving(port_file, health=None, timeout=60)
    finally:
        if proc.alive():
            proc.signal(signal.SIGTERM)  # a clean stop: the service stops its worker processes
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(proc.popen.wait, 20)
        proc.kill()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "effects.db"))
    monkeypatch.setenv(SAMPLE_DB_ENV, str(tmp_path / "shop.db"))
    monkeypatch.delenv(STORE_ENV, raising=False)
    return tmp_path


def _check_story(facts: dict[str, object]) -> None:
    ids = facts["ids"]
    assert isinstance(ids, dict)
    assert facts["why.first"] == "completed"
    assert facts["approvals"] == {ids["archive"]: 1460, ids["cleanup"]: 88, ids["regions"]: 10}
    assert facts["archive.approve"] == 200 and facts["archive.again"] == 409
    assert facts["cleanup.nobody"] == 400
    assert (facts["archive.status"], facts["cleanup.status"], facts["regions.status"]) == (
        "completed",
        "completed",
        "cancelled",
    )
    assert "26 of 30 card payments failed" in str(facts["why.answer"])
    assert facts["listed"] == sorted(ids.values())
    ledger = Ledger()
    assert ledger.counts(ids["why"])["model:planner"] == 1
    assert ledger.counts(ids["archive"])["write"] == 1
    assert ledger.counts(ids["cleanup"])["write"] == 0
    assert ledger.counts(ids["regions"])["write"] == 0
    # What the story prints: every request's effects, from the ledger.
    assert facts["executed"] == {
        "why": ["EXECUTED model:planner x1", "EXECUTED query x2", "EXECUTED model:analyst x1"],
        "archive": [
            "EXECUTED model:planner x1",
            "EXECUTED query x1",
            "EXECUTED preview x1",
            "EXECUTED write x1",
            "EXECUTED model:analyst x1",
        ],
        "cleanup": [
            "EXECUTED model:planner x1",
            "EXECUTED preview x1",
            "EXECUTED model:analyst x1",
        ],
        "regions": ["EXECUTED model:planner x1", "EXECUTED preview x1"],
    }
    # Nothing ran outside a step (a model call there is filed under no execution).
    assert facts["unattributed"] == {}


async def test_service_in_process_on_sqlite(env: Path) -> None:
    async with service(env, "--placement", "local") as (_, url):
        facts = await run_client(url, lambda _: None)
    _check_story(facts)


def test_the_story_prints_what_ran(tmp_path: Path) -> None:
    done = run_child(
        "examples.db_command_center_server", "--placement", "local", "--workdir", tmp_path,
        drop=tuple(k for k in os.environ if k.startswith("LOOM_")), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = [" ".join(line.split()) for line in done.stdout.splitlines()]
    assert out.count("EXECUTED model:planner x1") == 4  # one plan per request
    assert out.count("EXECUTED write x1") == 1  # only the approved archive wrote
    assert out.count("EXECUTED model:analyst x1") == 3  # the cancelled request has no answer
    assert "EXECUTED query x2" in out


async def test_service_killed_mid_request_continues_after_restart(env: Path) -> None:
    crashing = service(env, "--placement", "local", faults=CRASH)
    async with crashing as (proc, url), httpx.AsyncClient() as client:
        sent = await client.post(f"{url}/api/requests", json={"text": REQUESTS["why"]})
        eid = sent.json()["id"]
        code = await asyncio.to_thread(proc.popen.wait, 60)
    assert code == -9  # the service itself, SIGKILLed right after the planner's answer
    async with service(env, "--placement", "local") as (_, url), httpx.AsyncClient() as client:
        view = await settled(client, url, eid)
    assert view["status"] == "completed"
    assert Ledger().counts(eid) == {"model:planner": 1, "query": 2, "model:analyst": 1}
    assert Ledger().counts() == Ledger().counts(eid)  # nothing filed outside the request


@pytest.mark.postgres
async def test_two_http_workers_on_postgres_one_killed(env: Path) -> None:
    dsn = _pg_or_skip()

    schema = f"loom_ex_{secrets.token_hex(4)}"
    try:
        async with service(
            env,
            "--placement", "http", "--workers", "2",
            "--store", f"postgres:{schema}:{dsn}",
            "--first-worker-faults", CRASH,
        ) as (_, url):  # fmt: skip
            facts = await run_client(url, lambda _: None)
    finally:
        await drop_test_schema(dsn, schema)
    _check_story(facts)
    workers = facts["health"]["workers"]  # type: ignore[index]
    assert [w["exit_code"] for w in workers] == [-9, None]
    ids = facts["ids"]
    assert isinstance(ids, dict)
    pids = {name: pid for eid, name, pid in Ledger().rows() if eid == ids["why"]}
    # The planner was paid in the first worker, which died; the second finished the request.
    assert pids["model:planner"] == workers[0]["pid"]
    assert pids["model:analyst"] == workers[1]["pid"]
