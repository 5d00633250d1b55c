"""ADR 0004's superseded case through the bus, execute_graph and dispatch_plan: the caller gets
the winner's outcome by id, and the effect count is the seed's (the sequence-0 race runs the
effect once; the duplicate dispatch after the bootstrap runs it twice, fences [1, 2]).
Deterministic: the arena drives timing with events, no timers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from loom.model import EventType
from loom.orchestration import (
    Graph,
    GraphDispatchError,
    InProcessA2ABus,
    Node,
    Plan,
    PlanStep,
    TaskState,
    card_for,
    dispatch_plan,
    execute_graph,
)
from loom.placement import (
    ExecutionPackage,
    ExecutionResult,
    LocalDispatcher,
    is_superseded_refusal,
)
from loom.storage import SQLiteStore
from tests.support.arena import Arena, ArenaWorker, DelayedBootstrap


class Counted:
    """A dispatcher whose dispatch counts as one of the arena's finished dispatches (the
    refused one must finish for the winner's effect to return), raising as usual."""

    def __init__(self, arena: Arena, inner: LocalDispatcher) -> None:
        self.arena, self.inner = arena, inner
        self.spi_version = inner.spi_version

    async def dispatch(self, package: ExecutionPackage) -> ExecutionResult:
        try:
            return await self.inner.dispatch(package)
        finally:
            async with self.arena.cond:
                self.arena.remaining -= 1
                self.arena.cond.notify_all()

    async def cancel(self, execution_id: str) -> None:
        await self.inner.cancel(execution_id)

    async def health(self) -> Any:
        return await self.inner.health()


@pytest.fixture
async def arena(tmp_path: Path) -> AsyncIterator[Arena]:
    a = Arena(SQLiteStore(tmp_path / "arena.db"), lambda s: s)
    yield a
    await a.close()


def _pair(arena: Arena) -> tuple[Any, LocalDispatcher, Any]:
    rt_a, rt_b = arena.runtime(), arena.runtime()
    disp_a = Counted(arena, LocalDispatcher(ArenaWorker(arena, rt_a), max_attempts=3))
    disp_b = LocalDispatcher(ArenaWorker(arena, rt_b), max_attempts=3)
    return disp_a, disp_b, rt_a


async def _duplicate_after_bootstrap(arena: Arena, first: Any, eid: str, disp_b: Any) -> Any:
    caller = asyncio.ensure_future(first)
    await arena.in_effect.wait()  # A wrote sequence 0 and is inside the effect
    other = await arena.run(disp_b, ExecutionPackage(execution_id=eid, flow_id="one-effect"))
    assert other.status.value == "completed"
    return await caller


async def test_bus_awaits_the_winner_by_id(arena: Arena) -> None:
    disp_a, disp_b, rt_a = _pair(arena)
    bus = InProcessA2ABus(rt_a, disp_a)
    bus.register(arena.flow, card_for(arena.flow, name="payer"))
    task = await _duplicate_after_bootstrap(
        arena, bus.send("payer", None, task_id="pay-7"), "pay-7", disp_b
    )
    assert task.state is TaskState.COMPLETED and task.output == "done"  # the winner's outcome
    assert arena.effect_fences == [1, 2]  # the seed's count for this race
    assert disp_a.inner.attempts == 1  # the refusal was not retried
    log = await rt_a.store.read("pay-7")
    assert sum(e.type is EventType.EXECUTION_STARTED for e in log) == 1


async def test_bus_awaits_a_colliding_task_id(arena: Arena) -> None:
    arena.remaining = 1
    disp_a, _, rt_a = _pair(arena)
    bus = InProcessA2ABus(rt_a, disp_a)
    bus.register(arena.flow, card_for(arena.flow, name="payer"))
    first = asyncio.ensure_future(bus.send("payer", None, task_id="pay-8"))
    await arena.in_effect.wait()
    second = await bus.send("payer", None, task_id="pay-8")  # the same id while it runs
    assert second.state is TaskState.COMPLETED and second.output == "done"
    assert (await first).state is TaskState.COMPLETED
    assert arena.effects == 1 and len(bus.dispatched) == 1


async def test_graph_awaits_the_winner_by_id(arena: Arena) -> None:
    disp_a, disp_b, rt_a = _pair(arena)
    graph = Graph([Node("pay", "one-effect")], id="g")
    run = await _duplicate_after_bootstrap(
        arena,
        execute_graph(disp_a, graph, None, store=rt_a.store, run_id="run-1"),
        "run-1.pay",
        disp_b,
    )
    assert run.status == "completed" and run.output == "done"
    assert arena.effect_fences == [1, 2]
    log = await rt_a.store.read("run-1.pay")
    assert sum(e.type is EventType.EXECUTION_STARTED for e in log) == 1


async def test_graph_without_a_store_says_it_cannot_await(arena: Arena) -> None:
    disp_a, disp_b, _ = _pair(arena)
    graph = Graph([Node("pay", "one-effect")], id="g")
    with pytest.raises(GraphDispatchError) as caught:
        await _duplicate_after_bootstrap(
            arena, execute_graph(disp_a, graph, None, run_id="run-2"), "run-2.pay", disp_b
        )
    assert caught.value.execution_id == "run-2.pay" and "store=" in str(caught.value)


async def test_reverting_the_await_by_id_reports_the_refusal_as_failure(
    arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutation check: without the bus's await-by-id, the caller sees the refusal."""
    import loom.orchestration._bus as bus_module

    monkeypatch.setattr(bus_module, "is_superseded_refusal", lambda err, eid: False)
    disp_a, disp_b, rt_a = _pair(arena)
    bus = InProcessA2ABus(rt_a, disp_a)
    bus.register(arena.flow, card_for(arena.flow, name="payer"))
    with pytest.raises(Exception) as caught:
        await _duplicate_after_bootstrap(
            arena, bus.send("payer", None, task_id="pay-9"), "pay-9", disp_b
        )
    assert is_superseded_refusal(caught.value, "pay-9")


# --------------------------------------------------------------------------- sequence-0 race
# The caller's dispatcher takes fence 1, then a second dispatcher takes fence 2 and writes
# sequence 0 first: the caller's start loses the race (ExecutionAlreadyExistsError, a
# superseded refusal). The seed: the effect runs once. The caller gets the winner's outcome.


def _seq0_pair(arena: Arena, eid: str) -> tuple[Any, LocalDispatcher, Any, asyncio.Event]:
    rt_a = arena.runtime(DelayedBootstrap(arena.shared, eid))  # type: ignore[arg-type]
    rt_b = arena.runtime()
    allocated = asyncio.Event()

    async def signal() -> None:
        allocated.set()

    worker_a = ArenaWorker(arena, rt_a, after_first_allocate=signal)
    disp_a = Counted(arena, LocalDispatcher(worker_a, max_attempts=3))
    disp_b = LocalDispatcher(ArenaWorker(arena, rt_b), max_attempts=3)
    return disp_a, disp_b, rt_a, allocated


async def _sequence_zero_race(
    arena: Arena, first: Any, eid: str, disp_b: Any, allocated: Any
) -> Any:
    async def second() -> Any:
        await allocated.wait()  # the caller holds fence 1 and has not written sequence 0
        return await arena.run(disp_b, ExecutionPackage(execution_id=eid, flow_id="one-effect"))

    mine, other = await asyncio.gather(first, second())
    assert other.status.value == "completed"
    return mine


async def _assert_seed_outcome(arena: Arena, disp_a: Any, rt: Any, eid: str) -> None:
    assert arena.effects == 1, arena.effect_fences  # the seed's count for this race
    assert disp_a.inner.attempts == 1  # the refusal was not retried
    log = await rt.store.read(eid)
    assert sum(e.type is EventType.EXECUTION_STARTED for e in log) == 1
    assert log[0].fence == 2  # the winner's start


async def test_bus_sequence_zero_race_runs_the_effect_once(arena: Arena) -> None:
    disp_a, disp_b, rt_a, allocated = _seq0_pair(arena, "pay-10")
    bus = InProcessA2ABus(rt_a, disp_a)
    bus.register(arena.flow, card_for(arena.flow, name="payer"))
    task = await _sequence_zero_race(
        arena, bus.send("payer", None, task_id="pay-10"), "pay-10", disp_b, allocated
    )
    assert task.state is TaskState.COMPLETED and task.output == "done"
    await _assert_seed_outcome(arena, disp_a, rt_a, "pay-10")


async def test_graph_sequence_zero_race_runs_the_effect_once(arena: Arena) -> None:
    disp_a, disp_b, rt_a, allocated = _seq0_pair(arena, "run-3.pay")
    graph = Graph([Node("pay", "one-effect")], id="g")
    run = await _sequence_zero_race(
        arena,
        execute_graph(disp_a, graph, None, store=rt_a.store, run_id="run-3"),
        "run-3.pay",
        disp_b,
        allocated,
    )
    assert run.status == "completed" and run.output == "done"
    assert run.nodes["pay"].state is TaskState.COMPLETED and run.nodes["pay"].dispatched
    await _assert_seed_outcome(arena, disp_a, rt_a, "run-3.pay")


async def test_plan_sequence_zero_race_runs_the_effect_once(arena: Arena) -> None:
    disp_a, disp_b, rt_a, allocated = _seq0_pair(arena, "plan-4.pay")
    bus = InProcessA2ABus(rt_a, disp_a)
    bus.register(arena.flow, card_for(arena.flow, name="payer"))
    seen: list[tuple[str, TaskState, Any]] = []
    plan = Plan(steps=[PlanStep(id="pay", agent="payer", input={})])
    run = await _sequence_zero_race(
        arena,
        dispatch_plan(
            plan, bus, run_id="plan-4", on_step=lambda s, r: seen.append((s.id, r.state, r.output))
        ),
        "plan-4.pay",
        disp_b,
        allocated,
    )
    assert run.status == "completed" and run.output == "done"
    assert seen == [("pay", TaskState.COMPLETED, "done")]  # on_step saw the winner's outcome
    await _assert_seed_outcome(arena, disp_a, rt_a, "plan-4.pay")


async def test_plan_duplicate_after_bootstrap_awaits_the_winner(arena: Arena) -> None:
    disp_a, disp_b, rt_a = _pair(arena)
    bus = InProcessA2ABus(rt_a, disp_a)
    bus.register(arena.flow, card_for(arena.flow, name="payer"))
    plan = Plan(steps=[PlanStep(id="pay", agent="payer", input={})])
    run = await _duplicate_after_bootstrap(
        arena, dispatch_plan(plan, bus, run_id="plan-5"), "plan-5.pay", disp_b
    )
    assert run.status == "completed" and run.output == "done"
    assert arena.effect_fences == [1, 2]
    assert disp_a.inner.attempts == 1


async def test_reverting_the_graph_await_by_id_fails_the_sequence_zero_race(
    arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutation check: without the graph's await-by-id the refusal is the caller's error."""
    import loom.orchestration._graph as graph_module

    monkeypatch.setattr(graph_module, "is_superseded_refusal", lambda err, eid: False)
    disp_a, disp_b, rt_a, allocated = _seq0_pair(arena, "run-6.pay")
    graph = Graph([Node("pay", "one-effect")], id="g")

    async def caller() -> Any:
        try:
            return await execute_graph(disp_a, graph, None, store=rt_a.store, run_id="run-6")
        except Exception as exc:
            return exc

    got = await _sequence_zero_race(arena, caller(), "run-6.pay", disp_b, allocated)
    assert is_superseded_refusal(got, "run-6.pay")
