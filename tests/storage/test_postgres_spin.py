"""``PostgresStore(spin_wait=...)``: a lone write spins on its socket for its answer before it
sleeps in ``poll()``. What it spins for and how it fails (that it never holds the loop up for
long: ``test_a_lone_write_held_up_by_a_lock_leaves_the_event_loop_running``)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from loom.errors import ConfigurationError, StaleFenceError, StorageError
from loom.storage.postgres import PostgresStore
from loom.testing._store_conformance import env
from tests.support.pg import on_lean_poll, tagged_dsn, terminate


@pytest.mark.parametrize("bad", [-0.001, math.nan, math.inf, 0.0021, "soon"])
def test_a_spin_wait_out_of_bounds_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="spin_wait"):
        PostgresStore("postgresql://nowhere/none", spin_wait=bad)


def test_spinning_is_off_unless_asked_for() -> None:
    assert PostgresStore("postgresql://nowhere/none").spin_wait == 0.0
    assert PostgresStore("postgresql://nowhere/none", spin_wait=0.002).spin_wait == 0.002


class _Sleeps:
    """Counts the lone writes' sleeps in ``poll()`` (the wait a spin takes the place of)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        on_lean_poll(monkeypatch, self._slept)

    def _slept(self) -> None:
        self.count += 1


@pytest.mark.postgres
@pytest.mark.parametrize("spin_wait", [0.0, 0.002])
async def test_a_spinning_lone_write_takes_its_answer_without_sleeping(
    pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch, spin_wait: float
) -> None:
    sleeps = _Sleeps(monkeypatch)
    store = await PostgresStore.open(pg_dsn, schema=schema, spin_wait=spin_wait)
    try:
        fence = await store.acquire_fence("spun")
        await store.append([env("spun", 0, fence)])
        await store.append([env("spun", 1, fence)])  # the plain step's statement is prepared
        before = sleeps.count
        for seq in range(2, 52):
            await store.append([env("spun", seq, fence)])
        slept = sleeps.count - before
        assert await store.last_sequence("spun") == 51
    finally:
        await store.close()
    if spin_wait:
        # A commit's answer comes in well under 2 ms: only a very slow one is slept for.
        assert slept <= 10, slept
    else:
        assert slept >= 45, slept  # the control: without a spin, nearly every answer is


@pytest.mark.postgres
async def test_a_spinning_write_refused_or_cut_off_fails_typed_and_the_next_one_lands(
    pg_dsn: str, schema: str
) -> None:
    tag = f"loom-spin-{schema}"
    store = await PostgresStore.open(tagged_dsn(pg_dsn, tag), schema=schema, spin_wait=0.002)
    try:
        fence = await store.acquire_fence("cut")
        await store.append([env("cut", 0, fence)])
        await store.append([env("cut", 1, fence)])
        assert terminate(pg_dsn, tag) >= 1  # the held connection among them
        try:
            await store.append([env("cut", 2, fence)])
        except StorageError as exc:  # the session was gone before the statement was sent
            assert exc.execution_id == "cut"
            assert await store.last_sequence("cut") == 1
            await store.append([env("cut", 2, fence)])
        assert await store.last_sequence("cut") == 2
        newer = await store.acquire_fence("cut")
        with pytest.raises(StaleFenceError):
            await store.append([env("cut", 3, fence)])
        await store.append([env("cut", 3, newer)])
        assert [e.sequence for e in await store.read("cut")] == [0, 1, 2, 3]
    finally:
        await store.close()
