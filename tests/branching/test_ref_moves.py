"""Ref moves a CLI user can follow: a tip never moves back or past its execution's head
(the kit checks every store; here the tenant view's refusal names only the tenant's ids), and
a taken name's hint names commands the CLI has."""

from __future__ import annotations

import pytest

from loom.errors import InvalidRefMoveError, RefExistsError
from loom.storage import InMemoryStore
from loom.storage.tenancy import TenantScopedEventStore
from loom.testing._store_conformance import env


def test_ref_exists_hint_names_cli_commands() -> None:
    hint = RefExistsError("taken", ref="main").hint or ""
    assert "move_tip" not in hint
    assert "loom branches" in hint and "loom promote" in hint


async def test_tenant_view_refuses_a_bad_move_in_its_own_terms() -> None:
    physical = InMemoryStore()
    acme = TenantScopedEventStore(physical, "acme")
    fence = await acme.acquire_fence("p")
    await acme.append([env("p", i, fence) for i in range(3)])
    await acme.put_ref("main", "p", 1)
    with pytest.raises(InvalidRefMoveError) as info:
        await acme.move_tip("main", 7, expected=1)
    err = info.value
    assert err.execution_id == "p" and err.head == 2
    assert "acme" not in str(err), str(err)
    assert (await acme.get_ref("main")).tip == 1  # type: ignore[union-attr]
