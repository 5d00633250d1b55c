"""Step interceptors: observe, annotate the record, substitute the result; resources reach
steps through the runtime, not globals."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

import loom
from loom.errors import ConfigurationError, StepFailedError
from loom.model import EventType
from loom.runtime import CallNext, StepCall, StepInterceptor

ran: list[str] = []


class Recorder:
    """Observes: notes entry, exit and failures around every attempt."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    async def invoke(self, call: StepCall, call_next: CallNext) -> Any:
        self.log.append(f"{self.name}>{call.info.step_id}#{call.info.attempt}")
        try:
            return await call_next(call)
        except Exception as exc:
            self.log.append(f"{self.name}!{type(exc).__name__}")
            raise
        finally:
            self.log.append(f"{self.name}<")


class Meter:
    """Annotates: what a model call cost, stored with the step's record."""

    async def invoke(self, call: StepCall, call_next: CallNext) -> Any:
        value = await call_next(call)
        call.annotate("tokens", len(str(value)))
        call.annotate("cost_usd", 0.25)
        return value


class DryRun:
    """Substitutes: steps named in ``fake`` are not run; their canned value is recorded."""

    def __init__(self, fake: dict[str, Any]) -> None:
        self.fake = fake

    async def invoke(self, call: StepCall, call_next: CallNext) -> Any:
        if call.info.step_id in self.fake:
            call.annotate("simulated", True)
            return self.fake[call.info.step_id]
        return await call_next(call)


class Shout:
    """Rewrites the step's arguments before it runs."""

    async def invoke(self, call: StepCall, call_next: CallNext) -> Any:
        return await call_next(dataclasses.replace(call, args=(call.args[0].upper(),)))


@loom.step(id="charge")
async def charge(amount: int) -> str:
    ran.append("charge")
    return f"charged {amount}"


@loom.step(id="echo")
async def echo(text: str) -> str:
    ran.append("echo")
    return text


@loom.step(id="flaky", retry=loom.RetryPolicy(max_attempts=2, initial_backoff=0))
async def flaky() -> str:
    info = loom.current_step()
    if info is not None and info.attempt == 1:
        raise RuntimeError("first attempt fails")
    return "ok"


@loom.flow(id="intercepted")
async def intercepted(ctx: loom.WorkflowContext) -> list[str]:
    out = [await ctx.run(charge, 5), await ctx.run(echo, "hi"), await ctx.run(flaky)]
    await ctx.suspend("Go")
    return out


async def run(interceptors: list[Any], eid: str = "i") -> tuple[Any, loom.WorkflowRuntime]:
    ran.clear()
    rt = loom.WorkflowRuntime(loom.InMemoryStore(), interceptors=interceptors)
    rt.register(intercepted)
    await (await rt.start(intercepted, execution_id=eid)).wait_for_suspend()
    return await (await rt.resume(eid, "Go", None)).result(), rt


async def test_interceptors_wrap_each_attempt_outermost_first_and_not_replays() -> None:
    log: list[str] = []
    out, rt = await run([Recorder("a", log), Recorder("b", log)])
    assert out == ["charged 5", "hi", "ok"]
    assert log == [
        "a>charge#1", "b>charge#1", "b<", "a<",
        "a>echo#1", "b>echo#1", "b<", "a<",
        "a>flaky#1", "b>flaky#1", "b!RuntimeError", "b<", "a!RuntimeError", "a<",
        "a>flaky#2", "b>flaky#2", "b<", "a<",
    ]  # fmt: skip
    # The resume replayed all three steps: no interceptor saw them again.
    assert len([x for x in log if ">" in x]) == 8
    await rt.close()


async def test_an_interceptor_annotates_the_record_and_old_records_have_none() -> None:
    _, rt = await run([Meter()])
    completed = [e for e in await rt.store.read("i") if e.type is EventType.STEP_COMPLETED]
    assert json.loads(completed[0].payload_json)["annotations"] == {"tokens": 9, "cost_usd": 0.25}
    state = await rt.load_state("i")
    assert state is not None and state.ops[0].annotations == {"tokens": 9, "cost_usd": 0.25}
    await rt.close()
    # Without interceptors the record keeps its old shape (no annotations key at all).
    _, plain = await run([])
    first = next(e for e in await plain.store.read("i") if e.type is EventType.STEP_COMPLETED)
    assert list(first.payload) == ["position", "step_id", "attempt", "output", "started_at"]
    state = await plain.load_state("i")
    assert state is not None and state.ops[0].annotations is None
    assert "annotations" not in state.to_dict()["ops"]["0"]
    await plain.close()


async def test_an_interceptor_substitutes_a_dry_run_result() -> None:
    out, rt = await run([DryRun({"charge": "pretend charged"})])
    assert out == ["pretend charged", "hi", "ok"]
    assert ran == ["echo"]  # the card was never charged
    state = await rt.load_state("i")
    assert state is not None and state.ops[0].annotations == {"simulated": True}
    await rt.close()


async def test_an_interceptor_may_change_the_arguments() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore(), interceptors=[Shout()])

    @loom.flow(id="shout")
    async def shout(ctx: loom.WorkflowContext) -> str:
        return await ctx.run(echo, "quiet")

    rt.register(shout)
    assert await (await rt.start(shout)).result() == "QUIET"
    await rt.close()


class Client:
    def __init__(self) -> None:
        self.calls = 0


@loom.step(id="uses-client")
async def uses_client() -> int:
    client = loom.resource("llm", Client)
    client.calls += 1
    return client.calls


@loom.step(id="uses-missing")
async def uses_missing() -> None:
    loom.resource("db")


@loom.flow(id="resourced")
async def resourced(ctx: loom.WorkflowContext) -> Any:
    first = await ctx.run(uses_client)
    try:
        await ctx.run(uses_missing)
    except StepFailedError as exc:
        return first, exc.error and exc.error["message"]
    return first, None


async def test_resources_reach_steps_through_the_runtime() -> None:
    client = Client()
    rt = loom.WorkflowRuntime(loom.InMemoryStore(), resources={"llm": client})
    rt.register(resourced)
    first, missing = await (await rt.start(resourced)).result()
    assert first == 1 and client.calls == 1
    assert "no resource 'db' was given to this runtime (given: llm)" in missing
    with pytest.raises(ConfigurationError, match="only available inside a step"):
        loom.resource("llm")
    await rt.close()


async def test_a_wrong_resource_type_and_a_non_interceptor_are_refused() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore(), resources={"llm": "not a client"})
    rt.register(resourced)
    with pytest.raises(loom.ExecutionFailedError, match="is a str, not a Client"):
        await (await rt.start(resourced)).result()
    await rt.close()
    with pytest.raises(ConfigurationError, match="not a step interceptor"):
        loom.WorkflowRuntime(loom.InMemoryStore(), interceptors=[object()])  # type: ignore[list-item]
    assert isinstance(Meter(), StepInterceptor)


class BadAnnotation:
    async def invoke(self, call: StepCall, call_next: CallNext) -> Any:
        call.annotate("seen", {1, 2})  # a set is not JSON
        return await call_next(call)


async def test_an_unstorable_annotation_fails_the_attempt_not_the_driver() -> None:
    rt = loom.WorkflowRuntime(loom.InMemoryStore(), interceptors=[BadAnnotation()])

    @loom.flow(id="bad-annotation")
    async def bad(ctx: loom.WorkflowContext) -> str:
        try:
            return await ctx.run(echo, "x")
        except StepFailedError as exc:
            return str(exc.error and exc.error["type"])

    rt.register(bad)
    assert await (await rt.start(bad)).result() == "PayloadError"
    await rt.close()
