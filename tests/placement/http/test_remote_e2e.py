"""Remote compute end to end: real worker processes (``loom worker serve``) on 127.0.0.1, a real
dispatcher process, one shared store (a SQLite file, and PostgreSQL when reachable), SIGKILL.

The effect ledger (its own SQLite file, one durable row per effect, with the pid that ran it)
is the oracle for "ran N times" and tells the test which process is inside which step, so
every wait is on an observed fact, with a deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from loom.errors import ExecutionSupersededError, ResumeValidationError
from loom.model import EventType, ExecutionStatus
from loom.placement import ExecutionPackage, LocalDispatcher, ResumeEvent, is_superseded_refusal
from loom.placement.http import (
    CloudRunWorkerRuntime,
    FailoverWorkerRuntime,
    RemoteWorkerError,
    RemoteWorkerRuntime,
)
from tests.support.http_cluster import TOKEN, Cluster, Proc, read_jsonl
from tests.support.http_flows import open_store
from tests.support.http_keys import AUDIENCE, kit
from tests.support.poll import until


@asynccontextmanager
async def _cluster(tmp_path: Path, kind: str) -> AsyncIterator[Cluster]:
    if kind == "sqlite":
        spec = f"sqlite:{tmp_path / 'e2e.db'}"
        store = await open_store(spec)
        cluster = Cluster(tmp_path, spec, store)
        try:
            yield cluster
        finally:
            cluster.close()
            await store.close()
        return
    from tests.support.pg import require_pg, temp_schema

    dsn = require_pg()
    async with temp_schema(dsn) as schema:
        spec = f"postgres:{schema}:{dsn}"
        store = await open_store(spec)
        cluster = Cluster(tmp_path, spec, store)
        try:
            yield cluster
        finally:
            cluster.close()  # every process is gone before the schema is dropped
            await store.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with _cluster(tmp_path, request.param) as c:
        yield c


@pytest.fixture
async def sqlite_cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with _cluster(tmp_path, "sqlite") as c:
        yield c


async def _completed(cluster: Cluster, execution_id: str) -> bool:
    log = await cluster.store.read(execution_id)
    return bool(log) and log[-1].type is EventType.EXECUTION_COMPLETED


def _alive(proc: Proc) -> None:
    if proc.popen.poll() is not None:
        raise AssertionError(f"{proc.name} exited early:\n{proc.tail()}")


# --------------------------------------------------------------------------- a worker dies


@pytest.mark.parametrize("n", [1, 20])
async def test_a_worker_killed_mid_step_fails_over_and_nothing_is_lost_or_duplicated(
    cluster: Cluster, n: int
) -> None:
    a, b = await cluster.workers(True, False)  # A's `hold` step never returns: it will die there
    ids = [f"kill-{n}-{i:02d}" for i in range(n)]
    dispatcher, out = cluster.dispatcher([a.url, b.url], ids, max_attempts=2)

    async def everyone_placed() -> bool:
        _alive(dispatcher)
        settled = {line["execution_id"] for line in read_jsonl(out) if "status" in line}
        return set(ids) <= cluster.held_by(a) | settled

    await until(
        everyone_placed, "every execution done on B or inside A's step", timeout=60, every=0.05
    )
    killed = cluster.held_by(a)
    # Round robin placed every other execution on A, and each of those is inside the step.
    assert len(killed) == (n + 1) // 2, killed
    a.kill()  # SIGKILL in the middle of the `hold` step

    assert await dispatcher.exited(90) == 0, dispatcher.tail()
    lines = read_jsonl(out)
    results = {line["execution_id"]: line for line in lines if "execution_id" in line}
    assert sorted(results) == ids, "an execution was lost"
    for index, eid in enumerate(ids):
        assert results[eid].get("status") == "completed", results[eid]
        assert results[eid]["output"] == index + 3
        types = await cluster.check_log(eid)
        assert types[-1] is EventType.EXECUTION_COMPLETED
        if eid in killed:
            # first committed before the kill: never again. hold was in flight: once more.
            assert cluster.counts(eid) == {"first": 1, "hold": 2, "last": 1}
            assert types.count(EventType.EXECUTION_RECOVERED) == 1
        else:
            assert cluster.counts(eid) == {"first": 1, "hold": 1, "last": 1}
            assert EventType.EXECUTION_RECOVERED not in types
    # Each killed execution cost exactly one extra attempt; nothing else was retried.
    assert lines[-1] == {"done": True, "attempts": n + len(killed)}


# --------------------------------------------------------------------------- the dispatcher dies


async def test_a_killed_dispatcher_leaves_nothing_behind_after_a_recovery_pass(
    cluster: Cluster,
) -> None:
    a, b = await cluster.workers(True, True)
    ids = [f"orphan-{i}" for i in range(6)]
    dispatcher, _ = cluster.dispatcher([a.url, b.url], ids)

    async def all_in_flight() -> bool:
        _alive(dispatcher)
        return set(ids) <= cluster.held_by(a) | cluster.held_by(b)

    await until(all_in_flight, "every execution inside a worker's step", timeout=60, every=0.05)
    # The host running the dispatcher and worker A is lost: both SIGKILLed, executions in flight.
    dispatcher.kill()
    a.kill()
    on_a, on_b = cluster.held_by(a), cluster.held_by(b)
    assert on_a and on_b and on_a | on_b == set(ids)

    # A fresh process: recover what no live worker holds. B is alive and holds its share.
    recovery, report_path = cluster.recovery([a.url, b.url])
    assert await recovery.exited(60) == 0, recovery.tail()
    report = json.loads(report_path.read_text())
    assert report["recovered"] == sorted(on_a)
    assert report["not_claimed"] == sorted(on_b)
    assert report["left"] == {} and report["settled"] == []
    assert report["outcomes"] == dict.fromkeys(sorted(on_a), "completed")

    cluster.release()  # B's steps finish; B completes its executions with no caller left

    async def all_completed() -> bool:
        return all([await _completed(cluster, eid) for eid in ids])

    await until(all_completed, "B to finish its executions", timeout=60, every=0.05)
    for eid in ids:
        types = await cluster.check_log(eid)
        if eid in on_a:
            assert cluster.counts(eid) == {"first": 1, "hold": 2, "last": 1}
            assert types.count(EventType.EXECUTION_RECOVERED) == 1
        else:  # never touched by the recovery pass
            assert cluster.counts(eid) == {"first": 1, "hold": 1, "last": 1}
            assert EventType.EXECUTION_RECOVERED not in types


# --------------------------------------------------------------------------- gates


async def test_an_approval_gate_suspends_on_one_worker_and_resumes_on_another(
    cluster: Cluster,
) -> None:
    a, b = await cluster.workers(False, False)
    start = ExecutionPackage(execution_id="gate-1", flow_id="gated", input=21)
    async with (
        RemoteWorkerRuntime(a.url, token=TOKEN) as on_a,
        RemoteWorkerRuntime(b.url, token=TOKEN) as on_b,
    ):
        suspended = await LocalDispatcher(on_a).dispatch(start)
        assert suspended.status is ExecutionStatus.SUSPENDED
        before = await cluster.store.read("gate-1")

        # A wrongly shaped decision is refused with its type, across the wire; nothing stored.
        bad = dataclasses.replace(start, resume_event=ResumeEvent("Approve", {"approved": "?"}))
        with pytest.raises(ResumeValidationError):
            await LocalDispatcher(on_b).dispatch(bad)
        assert await cluster.store.read("gate-1") == before

        resume = dataclasses.replace(
            start, resume_event=ResumeEvent("Approve", {"approved": True, "by": "dba"})
        )
        done = await LocalDispatcher(on_b).dispatch(resume)
        assert done.status is ExecutionStatus.COMPLETED
        assert done.output == {"approved": True, "by": "dba", "value": 43}
        # A lost-response redispatch of the resume, to A this time: reports, re-runs nothing.
        again = await LocalDispatcher(on_a).dispatch(resume)
        assert again == done
    effects = cluster.effects()
    assert sorted((step, pid) for _, step, pid in effects) == sorted(
        [("pre", a.pid), ("post", b.pid)]
    )
    types = await cluster.check_log("gate-1")
    assert types.count(EventType.EXECUTION_RESUMED) == 1


# --------------------------------------------------------------------------- 409 across the wire


async def test_two_workers_racing_one_execution_the_loser_answers_409(cluster: Cluster) -> None:
    a, b = await cluster.workers(True, True)
    package = ExecutionPackage(execution_id="race-1", flow_id="held-three", input=0)
    async with (
        RemoteWorkerRuntime(a.url, token=TOKEN) as on_a,
        RemoteWorkerRuntime(b.url, token=TOKEN) as on_b,
    ):
        via_a = LocalDispatcher(on_a, max_attempts=3)
        via_b = LocalDispatcher(on_b, max_attempts=3)
        first = asyncio.ensure_future(via_a.dispatch(package))

        async def inside(proc: Proc) -> bool:
            return "race-1" in cluster.held_by(proc)

        await until(lambda: inside(a), "A inside the step", timeout=30, every=0.05)
        # A duplicate dispatch to B takes a newer fence and resumes the execution there.
        second = asyncio.ensure_future(via_b.dispatch(package))
        await until(lambda: inside(b), "B inside the step", timeout=30, every=0.05)
        # A finishes its step first: its write is refused (B holds the newer fence) while the
        # execution is still running, so A answers the superseded 409. (Had B already finished,
        # A would simply report the finished outcome; both are fine, neither is retried.)
        cluster.release("race-1", only=a)
        lost = (await asyncio.gather(first, return_exceptions=True))[0]
        cluster.release("race-1", only=b)
        won = (await asyncio.gather(second, return_exceptions=True))[0]
    assert isinstance(lost, ExecutionSupersededError), lost
    assert is_superseded_refusal(lost, "race-1")
    assert not isinstance(won, BaseException) and won.status is ExecutionStatus.COMPLETED
    assert won.output == 3
    # Neither dispatcher retried: the refusal is not a failed attempt.
    assert via_a.attempts == 1 and via_b.attempts == 1
    assert cluster.counts("race-1") == {"first": 1, "hold": 2, "last": 1}
    types = await cluster.check_log("race-1")
    assert types.count(EventType.EXECUTION_RECOVERED) == 1


# --------------------------------------------------------------------------- auth


async def test_unauthenticated_calls_get_401_and_run_nothing(sqlite_cluster: Cluster) -> None:
    cluster = sqlite_cluster
    (a,) = await cluster.workers(False)
    k, stranger = kit(), kit("stranger-key")
    refused = {
        "no-token": None,
        "wrong-token": "e2e-worker-token-0123456789abcdeX",
        "expired-id-token": k.mint(lifetime=-600),
        "wrong-audience-id-token": k.mint(audience="https://another-service.a.run.app"),
        "wrong-signer-id-token": stranger.mint(kid=k.kid),
    }
    async with httpx.AsyncClient(base_url=a.url) as client:
        for eid, token in refused.items():
            headers = {"content-type": "application/json"}
            if token is not None:
                headers["authorization"] = f"Bearer {token}"
            package = ExecutionPackage(execution_id=eid, flow_id="held-three", input=1)
            response = await client.post("/execute", content=package.to_json(), headers=headers)
            assert response.status_code == 401, (eid, response.text)
            assert response.json()["code"] == "unauthenticated"
            assert await cluster.store.last_sequence(eid) == -1
        assert (await client.get("/inflight")).status_code == 401
    # Through a dispatcher: a 401 is a failed attempt (retried), never an outcome.
    async with RemoteWorkerRuntime(a.url, token="not-the-worker-token-at-all") as wrong:
        dispatcher = LocalDispatcher(wrong, max_attempts=2)
        with pytest.raises(Exception) as info:
            await dispatcher.dispatch(ExecutionPackage(execution_id="wrong", flow_id="held-three"))
        assert isinstance(info.value.__cause__, RemoteWorkerError)
        assert info.value.__cause__.status == 401 and dispatcher.attempts == 2
    assert [eid async for eid in cluster.store.iterate_execution_ids()] == []
    assert cluster.effects() == []

    # Positive controls: a valid ID token (as Cloud Run callers send) and the shared secret.
    cloud = CloudRunWorkerRuntime(a.url, audience=AUDIENCE, token_source=lambda aud: k.mint())
    result = await LocalDispatcher(cloud).dispatch(
        ExecutionPackage(execution_id="id-token-ok", flow_id="held-three", input=1)
    )
    assert result.status is ExecutionStatus.COMPLETED
    await cloud.close()
    async with RemoteWorkerRuntime(a.url, token=TOKEN) as right:
        result = await LocalDispatcher(right).dispatch(
            ExecutionPackage(execution_id="bearer-ok", flow_id="held-three", input=1)
        )
    assert result.status is ExecutionStatus.COMPLETED
    assert sorted([eid async for eid in cluster.store.iterate_execution_ids()]) == [
        "bearer-ok",
        "id-token-ok",
    ]


# --------------------------------------------------------------------------- graceful shutdown


async def test_sigterm_drains_in_flight_work_and_leaves_the_rest_resumable(
    sqlite_cluster: Cluster,
) -> None:
    cluster = sqlite_cluster
    a, b = await cluster.workers(True, False)  # A runs with --drain-timeout 2
    async with (
        RemoteWorkerRuntime(a.url, token=TOKEN) as on_a,
        RemoteWorkerRuntime(b.url, token=TOKEN) as on_b,
    ):
        finishing = asyncio.ensure_future(
            LocalDispatcher(on_a).dispatch(
                ExecutionPackage(execution_id="drain-1", flow_id="held-three", input=0)
            )
        )
        # The first placement of a FailoverWorkerRuntime is its first worker: A.
        failover = LocalDispatcher(FailoverWorkerRuntime([on_a, on_b]), max_attempts=2)
        stuck = asyncio.ensure_future(
            failover.dispatch(
                ExecutionPackage(execution_id="drain-2", flow_id="held-three", input=0)
            )
        )

        async def both_inside() -> bool:
            return {"drain-1", "drain-2"} <= cluster.held_by(a)

        await until(both_inside, "both executions inside A's step", timeout=30, every=0.05)
        a.signal(signal.SIGTERM)  # what a platform does before it stops a container
        cluster.release("drain-1")  # finishes within the drain bound; drain-2 never does
        done = await finishing
        assert done.status is ExecutionStatus.COMPLETED  # answered although A was stopping
        assert await a.exited(30) in (0, -signal.SIGTERM), a.tail()
        # drain-2 outlived the bound: A stopped it, untouched since its last durable write,
        # and the dispatcher's retry resumed it on B.
        moved = await stuck
        assert moved.status is ExecutionStatus.COMPLETED and failover.attempts == 2
    assert cluster.counts("drain-1") == {"first": 1, "hold": 1, "last": 1}
    assert cluster.counts("drain-2") == {"first": 1, "hold": 2, "last": 1}
    assert EventType.EXECUTION_RECOVERED not in await cluster.check_log("drain-1")
    assert (await cluster.check_log("drain-2")).count(EventType.EXECUTION_RECOVERED) == 1
