"""Liveness leases (#11 gap): holders heartbeat a lease; lease_expired judges orphans."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

import loom
from loom.errors import ConfigurationError
from loom.model import EventType, ExecutionStatus
from loom.storage import InMemoryStore, LeaseStore, SQLiteStore, Store
from loom.testing import SkippingClock
from tests.conftest import WITH_TENANT, Backend
from tests.support.flows import EffectLedger
from tests.support.poll import until
from tests.support.proc import Child


@pytest.fixture
def lease_store(backend: Backend) -> Store:
    return backend.store()


# The lease contract holds on every store, the tenant view included.
on_every_store = pytest.mark.parametrize("backend", WITH_TENANT, indirect=True)


@on_every_store
async def test_the_lease_contract(lease_store: Store) -> None:
    assert isinstance(lease_store, LeaseStore)
    assert await lease_store.lease_expiry("e") is None
    assert await lease_store.renew_lease("e", holder="a", fence=1, expires_at=100.0)
    assert await lease_store.lease_expiry("e") == 100.0
    assert await lease_store.renew_lease("e", holder="a", fence=1, expires_at=130.0)
    assert await lease_store.lease_expiry("e") == 130.0
    # A newer holder takes it; the old one (older fence, a zombie) never takes it back.
    assert await lease_store.renew_lease("e", holder="b", fence=2, expires_at=140.0)
    assert not await lease_store.renew_lease("e", holder="a", fence=1, expires_at=999.0)
    assert await lease_store.lease_expiry("e") == 140.0
    await lease_store.release_lease("e", holder="a")  # not a's any more: no effect
    assert await lease_store.lease_expiry("e") == 140.0
    await lease_store.release_lease("e", holder="b")
    assert await lease_store.lease_expiry("e") is None
    assert await lease_store.lease_expiry("other") is None


GATE = asyncio.Event()


@loom.step(id="waits")
async def waits() -> int:
    await GATE.wait()
    return 1


@loom.flow(id="leased", version="1")
async def leased(ctx: loom.WorkflowContext) -> int:
    return await ctx.run(waits)


async def test_a_live_holder_is_not_judged_abandoned_and_a_stopped_one_is() -> None:
    global GATE
    GATE = asyncio.Event()
    clock = SkippingClock()
    store = InMemoryStore()
    holder = loom.WorkflowRuntime(store, clock=clock, lease_ttl=0.3)
    holder.register(leased)
    await holder.start(leased, execution_id="l-1")
    judge = loom.lease_expired(loom.WorkflowRuntime(store, clock=clock), grace=5)
    state = await holder.load_state("l-1")
    assert state is not None
    assert not await judge(state)  # no lease yet, but its log is fresh: within the grace

    async def lease_written() -> bool:
        return await store.lease_expiry("l-1") is not None

    await until(
        lease_written, "the first beat writing the lease"
    )  # the first beat writes the lease
    assert not await judge(state)  # live: its lease runs
    assert holder.heartbeat is not None
    await holder.heartbeat.stop()  # the holder freezes: nobody renews any more
    clock.advance(0.3 + 4)
    assert not await judge(state)  # within the grace
    clock.advance(2)
    assert await judge(state)  # its holder is gone
    # A holder that stops driving releases its lease; then the idle log decides.
    await holder.close()
    assert await store.lease_expiry("l-1") is None
    assert await judge(state)


async def test_lease_expired_needs_a_store_with_leases() -> None:
    runtime = loom.WorkflowRuntime(_Plain(InMemoryStore()))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        loom.lease_expired(runtime, grace=1)


class _Plain:
    """A Store without the LeaseStore side (delegates the rest)."""

    def __init__(self, inner: InMemoryStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        if name in ("renew_lease", "release_lease", "lease_expiry"):
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_a_frozen_holder_loses_its_lease_and_is_fenced_out_when_it_wakes(
    tmp_path: Path,
) -> None:
    """SIGSTOP a holder mid-step: its lease runs out, recover_abandoned(lease_expired) takes
    the execution over, and after SIGCONT the zombie's late write is refused."""
    db, ledger_path, release = tmp_path / "z.db", tmp_path / "effects.db", tmp_path / "release"
    env = {"LOOM_TEST_LEDGER": str(ledger_path)}
    with Child("lease", db, "zombie", release, env=env) as child:
        ledger = EffectLedger(ledger_path)
        store = SQLiteStore(db)
        observer = loom.WorkflowRuntime(store)
        judge = loom.lease_expired(observer, grace=0.3)
        await until(
            lambda: ledger.counts("zombie").get("hold", 0) >= 1, "the held step", timeout=60
        )
        state = await observer.load_state("zombie")
        assert state is not None and state.status is ExecutionStatus.RUNNING

        async def lease_written() -> bool:
            return await store.lease_expiry("zombie") is not None

        await until(lease_written, "the holder's first beat", timeout=60)
        first = await store.lease_expiry("zombie")
        assert first is not None

        # Alive: the holder keeps renewing, so its lease outlives its ttl and the grace many
        # times over, and the predicate never calls it abandoned meanwhile.
        async def renewed() -> bool:
            assert not await judge(state), "a live, renewing holder was judged abandoned"
            return (await store.lease_expiry("zombie") or 0) >= first + 3

        await until(renewed, "the holder renewing its lease", timeout=60, every=0.05)
        child.signal(signal.SIGSTOP)
        # The lease (0.6 s) runs out, plus the grace.
        await until(lambda: judge(state), "a frozen holder's lease expiring", timeout=60)
        release.touch()  # the recovered run finishes the held step at once

        import tests.children.lease as code

        code.RELEASE = release
        observer.register(code.frozen)
        os.environ["LOOM_TEST_LEDGER"] = str(ledger_path)
        report = await loom.recover_abandoned(observer, is_abandoned=judge, timeout=60)
        assert report.recovered == ["zombie"]
        assert report.outcomes["zombie"].status is ExecutionStatus.COMPLETED
        child.signal(signal.SIGCONT)
        assert child.finish()[0] == 3  # the zombie learned it was superseded
        log = await store.read("zombie")
        completed = [e for e in log if e.type is EventType.STEP_COMPLETED]
        assert [e.payload["step_id"] for e in completed] == ["before", "hold", "after"]
        assert {e.fence for e in completed[1:]} == {log[-1].fence} != {completed[0].fence}
        assert ledger.counts("zombie") == {"before": 1, "hold": 2, "after": 1}
        await observer.close()
