"""Tenant-view refusals name the tenant's own ids, and only the prefix is taken off (#11.12)."""

from __future__ import annotations

import pytest

import loom
from loom.errors import DuplicateEnvelopeIdError, ExecutionAlreadyExistsError, StaleFenceError
from loom.storage import InMemoryStore
from loom.storage.tenancy import TenantScopedEventStore
from loom.testing._store_conformance import env


@loom.flow(id="noop", version="1")
async def noop(ctx: loom.WorkflowContext) -> int:
    return 1


@pytest.mark.parametrize("eid", ["data:1", "a:b", "x a:y", "a:a:1", "it's a:1"])
async def test_a_duplicate_start_names_the_id_exactly_as_the_tenant_wrote_it(eid: str) -> None:
    view = TenantScopedEventStore(InMemoryStore(), "a", close_store=True)
    rt = loom.WorkflowRuntime(view)
    rt.register(noop)
    await (await rt.start(noop, execution_id=eid)).settled(10)
    with pytest.raises(ExecutionAlreadyExistsError) as caught:
        await rt.start(noop, execution_id=eid)
    assert caught.value.execution_id == eid
    assert repr(eid) in caught.value.message, caught.value.message
    await rt.close()


async def test_store_refusals_keep_every_other_occurrence_of_the_prefix() -> None:
    view = TenantScopedEventStore(InMemoryStore(), "a", close_store=True)
    eid = "data:1"
    old = await view.acquire_fence(eid)
    await view.append([env(eid, 0, old, envelope_id="ea:1")])
    with pytest.raises(DuplicateEnvelopeIdError) as dup:
        await view.append([env(eid, 1, old, envelope_id="ea:1")])
    assert "'data:1'" in dup.value.message or "'ea:1'" in dup.value.message
    assert "dat1" not in dup.value.message and "'e1'" not in dup.value.message
    await view.acquire_fence(eid)
    with pytest.raises(StaleFenceError) as stale:
        await view.append([env(eid, 1, old)])
    assert "'data:1'" in stale.value.message
    await view.close()
