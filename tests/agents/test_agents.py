"""loom.agent: the durable tool loop on ScriptedProvider, over memory and SQLite stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

import loom
from loom.agents import LIVE, AgentOutputError, Budget, FatalToolError, Price
from loom.errors import ExecutionFailedError, NonDeterminismError
from loom.llm import (
    CompletionRequest,
    Message,
    ProviderError,
    ScriptedProvider,
    ToolResultPart,
    Usage,
    reply,
    tool_calls,
)
from loom.model import ExecutionStatus, PayloadLimits
from loom.storage import InMemoryStore, SQLiteStore
from loom.testing import SkippingClock
from tests.support.pg import require_pg, temp_schema

EFFECTS: list[str] = []


@loom.tool
async def lookup(city: str, days: int = 1) -> dict[str, Any]:
    """Look up the forecast for a city.

    More text that is not part of the description."""
    EFFECTS.append(f"lookup:{city}:{days}")
    return {"city": city, "sky": "clear", "days": days}


@loom.tool
def flaky(n: int) -> str:
    """Fails for odd numbers."""
    EFFECTS.append(f"flaky:{n}")
    if n % 2:
        raise ValueError(f"{n} is odd")
    return "even"


class Broken(FatalToolError):
    pass


@loom.tool
def explode() -> str:
    """Always fails fatally."""
    raise Broken("the disk is on fire")


@pytest.fixture(autouse=True)
def _clear() -> None:
    EFFECTS.clear()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "postgres":
        dsn = require_pg()
        from loom.storage.postgres import PostgresStore

        async with temp_schema(dsn) as schema:
            rt = loom.WorkflowRuntime(
                await PostgresStore.open(dsn, schema=schema), clock=SkippingClock()
            )
            yield rt
            await rt.close()
        return
    store = InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "a.db")
    rt = loom.WorkflowRuntime(store, clock=SkippingClock())
    yield rt
    await rt.close()


def test_tool_schema_comes_from_type_hints() -> None:
    assert lookup.name == "lookup"
    assert lookup.description == "Look up the forecast for a city."
    assert lookup.parameters["properties"]["city"] == {"title": "City", "type": "string"}
    assert lookup.parameters["required"] == ["city"]
    assert lookup.parameters["additionalProperties"] is False


async def test_tool_loop_runs_each_call_in_order_and_records_it(runtime: Any) -> None:
    provider = ScriptedProvider(
        [
            tool_calls(("lookup", {"city": "Paris"}), ("lookup", {"city": "Oslo", "days": 2})),
            reply("Paris is clear; so is Oslo."),
        ]
    )
    weather = loom.agent(
        id="weather", provider=provider, model="m", instructions="Be brief.", tools=[lookup]
    )
    runtime.register(weather)
    handle = await runtime.start("weather", "Weather?", execution_id="w1")
    result = await handle.result()
    assert result["outcome"] == "completed" and result["output"] == "Paris is clear; so is Oslo."
    assert result["turns"] == 2
    assert EFFECTS == ["lookup:Paris:1", "lookup:Oslo:2"]
    second = provider.requests[1]
    assert second.system == "Be brief." and second.tools[0].name == "lookup"
    roles = [m.role for m in second.messages]
    assert roles == ["user", "assistant", "user", "user"]
    first_result = second.messages[2].parts[0]
    assert isinstance(first_result, ToolResultPart) and first_result.content["city"] == "Paris"
    state = await runtime.load_state("w1")
    steps = [op.name for op in sorted(state.ops.items()) for op in [op[1]] if op.kind == "step"]
    assert steps == [
        "agents.model:weather",
        "agents.tool:lookup",
        "agents.tool:lookup",
        "agents.model:weather",
    ]
    # Replaying the finished execution calls nothing again.
    again = await runtime.recover("w1")
    assert (await again.state()).status is ExecutionStatus.COMPLETED
    assert provider.calls == 2 and len(EFFECTS) == 2


async def test_inline_agent_in_a_flow_and_tool_errors_are_observations(runtime: Any) -> None:
    provider = ScriptedProvider(
        [
            tool_calls(("flaky", {"n": 3}), ("flaky", {"n": "x"}), ("nope", {})),
            tool_calls(("flaky", {"n": 4})),
            reply("done"),
        ]
    )
    helper = loom.agent(id="helper", provider=provider, model="m", tools=[flaky])

    @loom.flow(id="outer")
    async def outer(ctx: loom.WorkflowContext, text: str) -> dict[str, Any]:
        result = await ctx.agent(helper, text)
        return {"said": result.output, "turns": result.turns}

    runtime.register(outer)
    out = await (await runtime.start("outer", "go", execution_id="o1")).result()
    assert out == {"said": "done", "turns": 3}
    observations = [p for m in provider.requests[1].messages[2:] for p in m.parts]
    assert [(p.is_error, p.name) for p in observations] == [  # type: ignore[union-attr]
        (True, "flaky"),
        (True, "flaky"),
        (True, "nope"),
    ]
    texts = [p.content for p in observations]  # type: ignore[union-attr]
    assert "3 is odd" in texts[0] and "invalid arguments" in texts[1]
    assert "no tool 'nope'" in texts[2]
    assert EFFECTS == ["flaky:3", "flaky:4"]  # bad arguments never reached the tool


async def test_a_fatal_tool_error_fails_the_agent(runtime: Any) -> None:
    provider = ScriptedProvider([tool_calls(("explode", {}))])
    bomb = loom.agent(id="bomb", provider=provider, model="m", tools=[explode])
    runtime.register(bomb)
    handle = await runtime.start("bomb", "go", execution_id="b1")
    with pytest.raises(ExecutionFailedError, match="the disk is on fire"):
        await handle.result()


class Answer(pydantic.BaseModel):
    city: str
    degrees: int


async def test_output_type_feedback_then_success(runtime: Any) -> None:
    provider = ScriptedProvider(
        ['{"city": "Paris"}', "not json", '{"city": "Paris", "degrees": 21}']
    )
    typed = loom.agent(id="typed", provider=provider, model="m", output_type=Answer)
    runtime.register(typed)
    result = await (await runtime.start("typed", "go", execution_id="t1")).result()
    assert result["output"] == {"city": "Paris", "degrees": 21}
    assert provider.requests[0].response_schema is not None
    feedback = provider.requests[1].messages[-1].text
    assert "does not match" in feedback and "degrees" in feedback


async def test_output_type_gives_up_after_bounded_feedback(runtime: Any) -> None:
    provider = ScriptedProvider(["{}", "{}", "{}"])
    typed = loom.agent(
        id="typed2", provider=provider, model="m", output_type=Answer, output_retries=1
    )
    runtime.register(typed)
    handle = await runtime.start("typed2", "go", execution_id="t2")
    with pytest.raises(ExecutionFailedError) as failed:
        await handle.result()
    assert provider.calls == 2
    assert "AgentOutputError" in str(failed.value.details) or AgentOutputError.code in str(
        failed.value.details
    )


@pytest.mark.parametrize(
    ("budget", "exhausted", "calls"),
    [
        (Budget(max_turns=2), "turns", 2),
        (Budget(max_tokens=250), "tokens", 3),
        (Budget(max_cost=0.00039, prices={"m": Price(1.0, 10.0)}), "cost", 2),
    ],
)
async def test_budgets_end_the_loop_with_a_recorded_outcome(
    runtime: Any, budget: Budget, exhausted: str, calls: int
) -> None:
    looping = ScriptedProvider(
        lambda r: tool_calls(("lookup", {"city": "X"}), usage=Usage(100, 10))
    )
    spender = loom.agent(
        id="spender", provider=looping, model="m", tools=[lookup], budget=budget, max_turns=50
    )
    runtime.register(spender)
    result = await (await runtime.start("spender", "go", execution_id="s1")).result()
    assert result["outcome"] == "budget_exhausted" and result["exhausted"] == exhausted
    assert looping.calls == calls
    state = await runtime.load_state("s1")
    recorded = [op.output for op in state.ops.values() if op.name == "agents.outcome:spender"]
    assert recorded and recorded[0]["outcome"] == "budget_exhausted"


async def test_max_turns_is_an_outcome_not_a_crash(runtime: Any) -> None:
    provider = ScriptedProvider(lambda r: tool_calls(("lookup", {"city": "X"})))
    capped = loom.agent(id="capped", provider=provider, model="m", tools=[lookup], max_turns=3)
    runtime.register(capped)
    result = await (await runtime.start("capped", "go", execution_id="c1")).result()
    assert result["outcome"] == "max_turns" and provider.calls == 3 and len(EFFECTS) == 3


async def test_429_retried_after_its_delay_each_attempt_recorded_400_terminal(
    runtime: Any,
) -> None:
    limited = ProviderError("slow down", provider="x", retryable=True, status=429, retry_after=30)
    refused = ProviderError("bad request", provider="x", retryable=False, status=400)
    provider = ScriptedProvider([limited, limited, reply("ok"), refused])
    chat = loom.agent(id="chat", provider=provider, model="m")
    runtime.register(chat)
    before = runtime.clock.now()
    result = await (await runtime.start("chat", "hi", execution_id="r1")).result()
    assert result["output"] == "ok"
    assert runtime.clock.now() - before >= 60  # two waits of retry-after: 30 s (skipped time)
    events = await runtime.store.read("r1")
    failed = [e.payload for e in events if e.type == "STEP_FAILED"]
    assert [(f["attempt"], f["final"], f["error"]["details"]["status"]) for f in failed] == [
        (1, False, 429),
        (2, False, 429),
    ]
    handle = await runtime.start("chat", "again", execution_id="r2")
    with pytest.raises(ExecutionFailedError):
        await handle.result()
    events = await runtime.store.read("r2")
    failed = [e.payload for e in events if e.type == "STEP_FAILED"]
    assert len(failed) == 1 and failed[0]["final"] is True
    assert failed[0]["error"]["details"]["status"] == 400


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"instructions": "v2"}, ["instructions"]),
        ({"tools": [lookup, flaky]}, ["tools"]),
        ({"temperature": 0.9}, ["parameters"]),
        ({"model": "other"}, ["parameters"]),
    ],
)
async def test_a_changed_request_on_replay_is_non_determinism_naming_what_changed(
    tmp_path: Path, change: dict[str, Any], expected: list[str]
) -> None:
    path = tmp_path / "nd.db"
    rt = loom.WorkflowRuntime(SQLiteStore(path), clock=SkippingClock())
    script = [tool_calls(("lookup", {"city": "A"})), tool_calls(("lookup", {"city": "B"})), "x"]
    options: dict[str, Any] = {"tools": [lookup], "instructions": "v1", "model": "m"}
    provider = ScriptedProvider(script)
    rt.register(loom.agent(id="nd", provider=provider, **options))
    await (await rt.start("nd", "go", execution_id="n1")).result()
    await rt.close()
    events = await SQLiteStore(path).read("n1")
    model_events = [e for e in events if e.type == "agents.model_called"]
    assert list(model_events[1].payload["fp"]) == ["history"]  # the rest carried
    changed = loom.agent(id="nd", provider=provider, **{**options, **change})
    with pytest.raises(NonDeterminismError) as err:
        await loom.testing.replay_flow(changed, events)
    assert err.value.details["turn"] == 1 and err.value.details["changed"] == expected
    assert provider.calls == 3  # replay called the model no more
    same = loom.agent(id="nd", provider=provider, **options)
    await loom.testing.replay_flow(same, events)  # the unchanged code replays cleanly


async def test_streamed_text_reaches_live_subscribers_and_is_not_recorded(runtime: Any) -> None:
    provider = ScriptedProvider([reply("hello there")], stream_chunk=4)
    talker = loom.agent(id="talker", provider=provider, model="m", stream=True)
    runtime.register(talker)
    async with LIVE.subscribe("l1") as queue:
        await (await runtime.start("talker", "hi", execution_id="l1")).result()
        chunks = [queue.get_nowait() for _ in range(queue.qsize())]
    assert chunks == ["hell", "o th", "ere"]
    events = await runtime.store.read("l1")
    assert not any('hell"' in e.payload_json for e in events)


async def test_model_calls_store_only_the_messages_they_add(runtime: Any) -> None:
    big = "x" * 2048

    @loom.tool
    def fetch(i: int) -> str:
        """Fetch a page."""
        return f"{i}:{big}"

    turns = 30
    script: list[Any] = [tool_calls(("fetch", {"i": i})) for i in range(turns)] + [reply("end")]
    provider = ScriptedProvider(script)
    reader = loom.agent(id="reader", provider=provider, model="m", tools=[fetch], max_turns=99)
    runtime.register(reader)
    await (await runtime.start("reader", "read", execution_id="big1")).result()
    events = await runtime.store.read("big1")
    logged = sum(len(e.payload_json) for e in events)
    assert logged < turns * 1200  # no tool result (2 KiB each) is in the log itself
    history = sum(len(m.to_dict().__repr__()) for m in provider.requests[-1].messages)
    assert history > turns * 2048  # ...but the model saw all of them
    assert isinstance(provider.requests[-1], CompletionRequest)
    assert all(isinstance(m, Message) for m in provider.requests[-1].messages)


async def test_an_oversized_tool_result_is_refused_before_it_is_stored(tmp_path: Path) -> None:
    @loom.tool
    def dump() -> str:
        """Returns far too much."""
        return "z" * 50_000

    store = SQLiteStore(tmp_path / "big.db")
    rt = loom.WorkflowRuntime(store, clock=SkippingClock(), limits=PayloadLimits(max_bytes=20_000))
    provider = ScriptedProvider([tool_calls(("dump", {})), reply("ok")])
    rt.register(loom.agent(id="dumper", provider=provider, model="m", tools=[dump]))
    result = await (await rt.start("dumper", "go", execution_id="big")).result()
    assert result["output"] == "ok"
    observation = provider.requests[1].messages[-1].parts[0]
    assert isinstance(observation, ToolResultPart) and observation.is_error
    assert "PayloadError" in observation.content and "20000-byte limit" in observation.content
    events = await store.read("big")
    assert all(len(e.payload_json) < 20_000 for e in events)
    assert not any("zzzzzzzzzz" in e.payload_json for e in events)
    blobs = await store.get_blobs([])
    assert blobs == {}
    await rt.close()


async def test_an_oversized_model_response_fails_typed_and_is_not_stored(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "huge.db")
    rt = loom.WorkflowRuntime(store, clock=SkippingClock(), limits=PayloadLimits(max_bytes=20_000))
    provider = ScriptedProvider([reply("w" * 50_000)])
    rt.register(loom.agent(id="talker2", provider=provider, model="m"))
    handle = await rt.start("talker2", "go", execution_id="huge")
    with pytest.raises(ExecutionFailedError, match="PayloadError"):
        await handle.result()
    assert provider.calls == 1  # a payload error is not retried
    events = await store.read("huge")
    assert not any("wwwwwwwwww" in e.payload_json for e in events)
    await rt.close()
