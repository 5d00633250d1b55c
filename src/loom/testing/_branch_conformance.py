"""The BranchRegistry conformance kit: ``await run_branch_registry_conformance(make_store)``.

``make_store`` returns a fresh store that is a :class:`~loom.storage.BranchRegistry`, an
``EventStore`` and an ``ExecutionIndex`` (lineage is read from the index). Every check runs on
its own store; the first failure raises ``AssertionError`` naming the check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from loom.errors import (
    ConfigurationError,
    InvalidRefMoveError,
    InvalidRefNameError,
    PromotionConflictError,
    RefConflictError,
    RefExistsError,
    RefNotFoundError,
)
from loom.model import EventType
from loom.storage import BranchRegistry
from loom.testing._store_conformance import env

__all__ = ["BRANCH_CHECKS", "run_branch_registry_conformance"]

MakeRegistry = Callable[[], Awaitable[Any]]
BranchCheck = Callable[[Any], Awaitable[None]]
BRANCH_CHECKS: dict[str, BranchCheck] = {}


def _check(fn: BranchCheck) -> BranchCheck:
    BRANCH_CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


async def _refused(exc_type: type[BaseException], aw: Awaitable[Any]) -> BaseException:
    try:
        await aw
    except exc_type as exc:
        return exc
    raise AssertionError(f"expected {exc_type.__name__}")


async def _execution(store: Any, execution_id: str, parent: str | None = None, at: int = 0) -> None:
    """An execution of two events; with ``parent``, a fork of it (its EXECUTION_FORKED)."""
    fence = await store.acquire_fence(execution_id)
    second = (
        env(execution_id, 1, fence)
        if parent is None
        else env(
            execution_id,
            1,
            fence,
            EventType.EXECUTION_FORKED,
            {"parent_id": parent, "at_sequence": at},
        )
    )
    await store.append([env(execution_id, 0, fence), second])


async def _log(store: Any, execution_id: str, events: int) -> None:
    """An execution whose log holds sequences ``0..events-1`` (tips move within them)."""
    fence = await store.acquire_fence(execution_id)
    await store.append([env(execution_id, i, fence) for i in range(events)])


@_check
async def check_put_get_and_list(store: BranchRegistry) -> None:
    assert await store.get_ref("main") is None
    assert await store.list_refs() == []
    main = await store.put_ref("main", "p", 3)
    assert (main.name, main.execution_id, main.tip, main.version) == ("main", "p", 3, 1)
    assert main.forked_from is None and main.fork_sequence is None
    sim = await store.put_ref("sim/a", "b1", 5, forked_from="p", fork_sequence=3)
    await store.put_ref("sim/b", "b2", 5, forked_from="p", fork_sequence=3)
    assert await store.get_ref("main") == main
    assert await store.get_ref("sim/a") == sim
    assert (sim.forked_from, sim.fork_sequence) == ("p", 3)
    assert [r.name for r in await store.list_refs()] == ["main", "sim/a", "sim/b"]
    assert [r.name for r in await store.list_refs("sim/")] == ["sim/a", "sim/b"]
    assert await store.list_refs("nothing") == []


@_check
async def check_put_is_idempotent_and_never_overwrites(store: BranchRegistry) -> None:
    first = await store.put_ref("main", "p", 3)
    assert await store.put_ref("main", "p", 3) == first  # a retried put
    err = await _refused(RefExistsError, store.put_ref("main", "q", 3))
    assert getattr(err, "ref", None) == "main", err
    await _refused(RefExistsError, store.put_ref("main", "p", 4))
    assert await store.get_ref("main") == first
    results = await asyncio.gather(
        *(store.put_ref("race", f"e{i}", 1) for i in range(6)), return_exceptions=True
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1, results
    assert all(isinstance(r, RefExistsError) for r in results if r not in winners), results


@_check
async def check_names_are_validated(store: BranchRegistry) -> None:
    for bad in (
        "",
        "/main",
        "main/",
        "a//b",
        "a/../b",
        "..",
        ".hidden",
        "-x",
        "a b",
        "a\nb",
        "x" * 201,
        "naïve",
        "a\\b",
        "a;b",
    ):
        await _refused(InvalidRefNameError, store.put_ref(bad, "p", 0))
        await _refused(InvalidRefNameError, store.get_ref(bad))
        await _refused(InvalidRefNameError, store.move_tip(bad, 1, expected=0))
    await _refused(ConfigurationError, store.put_ref("ok", "p", -1))
    await _refused(ConfigurationError, store.put_ref("ok", "", 0))
    assert await store.list_refs() == [], "a refused put stored something"
    for good in ("main", "sim/cautious-1", "v1.2_x", "a/b/c"):
        await store.put_ref(good, "p", 0)
    assert len(await store.list_refs()) == 4


@_check
async def check_move_tip_is_compare_and_swap(store: BranchRegistry) -> None:
    await _refused(RefNotFoundError, store.move_tip("ghost", 1, expected=0))
    await _log(store, "e", 30)
    await store.put_ref("b", "e", 4)
    moved = await store.move_tip("b", 9, expected=4)
    assert (moved.tip, moved.version, moved.execution_id) == (9, 2, "e")
    err = await _refused(RefConflictError, store.move_tip("b", 12, expected=4))
    assert (getattr(err, "expected", None), getattr(err, "actual", None)) == (4, 9), err
    assert await store.get_ref("b") == moved, "a lost compare-and-swap changed the ref"
    results = await asyncio.gather(
        *(store.move_tip("b", 20 + i, expected=9) for i in range(8)), return_exceptions=True
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1, results
    assert all(isinstance(r, RefConflictError) for r in results if r not in winners), results
    final = await store.get_ref("b")
    assert final is not None and final == winners[0] and final.version == 3


@_check
async def check_move_tip_only_moves_forward_within_the_head(store: BranchRegistry) -> None:
    await _log(store, "e", 10)  # sequences 0..9
    await store.put_ref("b", "e", 4)
    before = await store.get_ref("b")
    back = await _refused(InvalidRefMoveError, store.move_tip("b", 3, expected=4))
    assert (getattr(back, "tip", None), getattr(back, "sequence", None)) == (4, 3), back
    past = await _refused(InvalidRefMoveError, store.move_tip("b", 10, expected=4))
    assert getattr(past, "head", None) == 9, past
    assert await store.get_ref("b") == before, "a refused move changed the ref"
    assert (await store.move_tip("b", 9, expected=4)).tip == 9  # up to the head is fine
    await store.put_ref("nothing", "never-ran", 0)
    await _refused(InvalidRefMoveError, store.move_tip("nothing", 1, expected=0))


@_check
async def check_promote_is_a_fast_forward(store: BranchRegistry) -> None:
    await store.put_ref("main", "p", 5)
    await store.put_ref("sim/a", "b1", 7, forked_from="p", fork_sequence=5)
    await store.put_ref("sim/b", "b2", 8, forked_from="p", fork_sequence=5)
    await _refused(RefNotFoundError, store.promote("ghost", "main", by="ann"))
    await _refused(RefNotFoundError, store.promote("sim/a", "ghost", by="ann"))
    moved = await store.promote("sim/a", "main", by="ann", reason="cheapest")
    assert (moved.execution_id, moved.tip, moved.version) == ("b1", 7, 2)
    assert (moved.updated_by, moved.promoted_from, moved.reason) == ("ann", "sim/a", "cheapest")
    assert (moved.forked_from, moved.fork_sequence) == ("p", 5)
    err = await _refused(PromotionConflictError, store.promote("sim/b", "main", by="bob"))
    assert isinstance(err, RefConflictError)
    assert await store.get_ref("main") == moved, "a refused promotion moved the ref"
    # The promoted branch's own later tip is still a fast-forward of it.
    await _log(store, "b1", 12)
    await store.move_tip("sim/a", 11, expected=7)
    again = await store.promote("sim/a", "main", by="ann")
    assert (again.execution_id, again.tip) == ("b1", 11)
    # A target past the fork point (the parent moved on) is no ancestor of the branch.
    await store.put_ref("late", "p", 6)
    await _refused(PromotionConflictError, store.promote("sim/b", "late", by="bob"))
    # An earlier point of the parent is an ancestor.
    await store.put_ref("early", "p", 2)
    assert (await store.promote("sim/b", "early", by="bob")).execution_id == "b2"


@_check
async def check_racing_promotions_exactly_one_wins(store: BranchRegistry) -> None:
    await store.put_ref("main", "p", 5)
    names = [f"sim/{i}" for i in range(6)]
    for i, name in enumerate(names):
        await store.put_ref(name, f"b{i}", 9, forked_from="p", fork_sequence=5)
    results = await asyncio.gather(
        *(store.promote(n, "main", by=f"op{i}") for i, n in enumerate(names)),
        return_exceptions=True,
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1, results
    losers = [r for r in results if r not in winners]
    assert all(isinstance(r, PromotionConflictError) for r in losers), losers
    assert await store.get_ref("main") == winners[0]


@_check
async def check_children_is_the_recursive_lineage(store: Any) -> None:
    await _execution(store, "root")
    await _execution(store, "a", parent="root")
    await _execution(store, "b", parent="root")
    await _execution(store, "a1", parent="a")
    await _execution(store, "a1x", parent="a1")
    await _execution(store, "other")
    await _execution(store, "o1", parent="other")
    assert [s.execution_id for s in await store.children("root")] == ["a", "b", "a1", "a1x"]
    assert [s.forked_from for s in await store.children("root")] == ["root", "root", "a", "a1"]
    assert [s.execution_id for s in await store.children("a")] == ["a1", "a1x"]
    assert await store.children("a1x") == []
    assert await store.children("nobody") == []


async def run_branch_registry_conformance(make_store: MakeRegistry) -> None:
    """Run every check, each on a fresh store from ``make_store``; the first failure raises."""
    for name, check in BRANCH_CHECKS.items():
        store = await make_store()
        try:
            await check(store)
        except AssertionError as exc:
            raise AssertionError(f"branch registry check {name!r} failed: {exc}") from exc
        finally:
            close = getattr(store, "close", None)
            if close is not None:
                await close()
