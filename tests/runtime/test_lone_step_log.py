"""A flow's log is the same, byte for byte, whether its step records take SQLite's straight-through
lone append or the general write path; and a fenced-out holder's step record is refused on the
straight path as on the general one."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pydantic
import pytest

import loom
from loom import RetryPolicy
from loom.errors import LoomError
from loom.model import Envelope
from loom.storage import SQLiteStore
from loom.testing import SkippingClock
from tests.support.poll import until


class Item(pydantic.BaseModel):
    name: str
    qty: int


@loom.step(id="plain")
async def plain(x: Any) -> Any:
    return x


@loom.step(id="model")
async def model(name: str) -> Item:
    return Item(name=name, qty=len(name))


flaky_calls: list[int] = []


@loom.step(id="flaky", retry=RetryPolicy(max_attempts=3, initial_backoff=1.0))
async def flaky() -> str:
    flaky_calls.append(1)
    if len(flaky_calls) % 2:
        raise RuntimeError("first attempt fails")
    return "second attempt"


@loom.flow(id="mixed")
async def mixed(ctx: loom.WorkflowContext) -> list[Any]:
    out: list[Any] = [await ctx.run(plain, None), await ctx.run(plain, 7)]
    out.append(await ctx.run(plain, "é\u2028"))
    out.append(await ctx.run(plain, {"a": [1.5, None]}))
    out.append((await ctx.run(model, "widget")).qty)
    out.append(await ctx.run(flaky))
    out.append(await ctx.decide("pick", lambda: 3))
    ctx.ui.set("progress", 0.5)  # carried by the next record (the general path's batch)
    out.append(await ctx.run(plain, True))
    out.append(await ctx.run(plain, 2.25))
    return out


def _rows(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT * FROM loom_events ORDER BY execution_id, sequence").fetchall()


async def _run(path: Path, *, lone: bool) -> tuple[list[Any], int]:
    """Run ``mixed`` on a store at ``path``; (its output, records committed straight through)."""
    store = SQLiteStore(path)
    taken = [0]
    append_lone = store._append_lone

    def counting(env: Envelope) -> Any:
        if not lone:
            return False  # the general write path, for every record
        done = append_lone(env)
        taken[0] += done is True
        return done

    store._append_lone = counting  # type: ignore[method-assign]
    rt = loom.WorkflowRuntime(store, clock=SkippingClock())
    flaky_calls.clear()
    handle = await rt.start(mixed, execution_id="m1")
    result = await handle.result(timeout=10)
    await rt.close()
    return result, taken[0]


async def test_the_log_is_the_same_on_the_lone_and_the_general_path(tmp_path: Path) -> None:
    lone_out, lone_taken = await _run(tmp_path / "lone.db", lone=True)
    general_out, general_taken = await _run(tmp_path / "general.db", lone=False)
    expected = [None, 7, "é\u2028", {"a": [1.5, None]}, 6, "second attempt", 3, True, 2.25]
    assert lone_out == general_out == expected
    assert lone_taken >= 7 and general_taken == 0  # the plain records went straight through
    lone_rows, general_rows = _rows(tmp_path / "lone.db"), _rows(tmp_path / "general.db")
    assert len(lone_rows) > 10
    # The start's envelope id is random (a take-over's, see Driver.take_over), so its id and
    # checksum differ; every other column of it, and every column of every later record
    # (recorded times, fences, JSON text, checksums), is the same byte for byte.
    assert _without_id(lone_rows[0]) == _without_id(general_rows[0])
    assert lone_rows[1:] == general_rows[1:]


def _without_id(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return row[:2] + row[3:7]


zombie_ran: list[int] = []


@loom.step(id="zombie-effect")
async def zombie_effect(i: int) -> int:
    zombie_ran.append(i)
    return i


@loom.flow(id="zombie")
async def zombie(ctx: loom.WorkflowContext) -> int:
    await ctx.run(zombie_effect, 1)
    await ctx.run(zombie_effect, 2)
    return 0


async def test_a_fenced_out_holder_is_refused_on_the_lone_path(tmp_path: Path) -> None:
    zombie_ran.clear()
    store = SQLiteStore(tmp_path / "z.db")
    refused: list[BaseException] = []
    append_lone = store._append_lone
    other = SQLiteStore(tmp_path / "z.db")  # another process's view of the file

    def taking_over(env: Envelope) -> Any:
        if env.sequence == 2:  # the second step's record: another holder moved first
            with sqlite3.connect(tmp_path / "z.db") as conn:
                conn.execute("UPDATE loom_heads SET fence = fence + 1 WHERE execution_id = 'z'")
        try:
            return append_lone(env)
        except LoomError as exc:
            refused.append(exc)
            raise

    store._append_lone = taking_over  # type: ignore[method-assign]
    rt = loom.WorkflowRuntime(store)
    handle = await rt.start(zombie, execution_id="z")
    with pytest.raises(LoomError):
        await handle.result(timeout=10)
    await until(lambda: bool(refused), "the refusal", timeout=10)
    assert [type(e).__name__ for e in refused] == ["StaleFenceError"]
    assert zombie_ran == [1, 2]
    # Nothing of the zombie's was written after the take-over.
    assert [e.sequence for e in await other.read("z")] == [0, 1]
    await other.close()
    await rt.close()
