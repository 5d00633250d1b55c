"""The three SDK-backed providers, each against a local server speaking its real wire format."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from loom.llm import (
    AnthropicProvider,
    CompletionRequest,
    GeminiProvider,
    LlmProvider,
    MediaPart,
    Message,
    OpenAIProvider,
    ProviderError,
    ReasoningPart,
    ScriptedProvider,
    TextPart,
    ToolResultPart,
    UnsupportedContentError,
)
from loom.testing import WEATHER_TOOL, conformance_responder, run_llm_provider_conformance
from tests.support import llm_fakes as fakes
from tests.support.llm_wire import Answer, Seen, WireServer

MODELS = {"anthropic": "claude-loom-test", "openai": "gpt-5", "gemini": "gemini-2.5-flash"}
RESPONDERS: dict[str, Callable[[Seen], Answer]] = {
    "anthropic": fakes.anthropic,
    "openai": fakes.openai,
    "gemini": fakes.gemini,
}


_OPEN: list[Any] = []


def make(name: str, base_url: str) -> LlmProvider:
    provider: Any
    if name == "anthropic":
        provider = AnthropicProvider(api_key="test-key", base_url=base_url)
    elif name == "openai":
        provider = OpenAIProvider(api_key="test-key", base_url=base_url + "/v1")
    else:
        provider = GeminiProvider(api_key="test-key", base_url=base_url)
    _OPEN.append(provider)
    return provider  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
async def _close_providers() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await _OPEN.pop().aclose()


@pytest.fixture
async def wire(request: pytest.FixtureRequest) -> AsyncIterator[WireServer]:
    async with WireServer(RESPONDERS[request.param]) as server:
        yield server


ALL = pytest.mark.parametrize("wire", list(RESPONDERS), indirect=True)


@ALL
async def test_conformance_kit_passes_against_the_wire_format(wire: WireServer) -> None:
    name = next(k for k, v in RESPONDERS.items() if v is wire.respond)
    provider = make(name, wire.base_url)
    await run_llm_provider_conformance(provider, model=MODELS[name])
    assert len(wire.requests) == 4  # text, tool call, tool call + follow-up; media never sent


async def test_conformance_kit_passes_on_the_scripted_provider() -> None:
    await run_llm_provider_conformance(
        ScriptedProvider(conformance_responder), model="m", unsupported_media_type=None
    )


def _tool_request(model: str) -> CompletionRequest:
    return CompletionRequest(
        model,
        (Message.user("Weather in Paris?"),),
        system="You are terse.",
        tools=(WEATHER_TOOL,),
        tool_choice=WEATHER_TOOL.name,
        max_tokens=300,
        temperature=0.25,
    )


async def _two_turns(provider: LlmProvider, model: str) -> tuple[Any, CompletionRequest]:
    first = await provider.complete(_tool_request(model))
    calls = first.message.tool_calls
    results = tuple(ToolResultPart(c.id, "sunny", name=c.name) for c in calls)
    follow = CompletionRequest(
        model,
        (Message.user("Weather in Paris?"), first.message, Message("user", results)),
        tools=(WEATHER_TOOL,),
    )
    await provider.complete(follow)
    return first, follow


async def test_anthropic_mapping_and_thinking_signature_sent_back_verbatim() -> None:
    async with WireServer(fakes.anthropic) as server:
        provider = make("anthropic", server.base_url)
        first, _ = await _two_turns(provider, "claude-loom-test")
    sent = server.requests[0]
    assert sent.method == "POST" and sent.path == "/v1/messages"
    assert "test-key" in sent.headers.get("x-api-key", sent.headers.get("authorization", ""))
    assert "anthropic-version" in sent.headers
    body = sent.body
    assert body["system"] == "You are terse."
    assert body["max_tokens"] == 300 and body["temperature"] == 0.25
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": WEATHER_TOOL.description,
            "input_schema": dict(WEATHER_TOOL.parameters),
        }
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "get_weather"}
    reasoning = [p for p in first.message.parts if isinstance(p, ReasoningPart)]
    assert reasoning[0].text == fakes.ANTHROPIC_THINKING["thinking"]
    assert first.usage.cache_read_tokens == 128 and first.usage.input_tokens == 412
    assert first.response_id == "msg_01XFDUDYJgAACzvnptvVoYEL"
    follow = server.requests[1].body["messages"]
    assert follow[1]["content"][0] == fakes.ANTHROPIC_THINKING  # byte-for-byte, signature too
    assert follow[1]["content"][1]["type"] == "tool_use"
    assert follow[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
            "content": "sunny",
            "is_error": False,
        }
    ]


async def test_openai_mapping_and_reasoning_item_sent_back_verbatim() -> None:
    async with WireServer(fakes.openai) as server:
        provider = make("openai", server.base_url)
        first, _ = await _two_turns(provider, "gpt-5")
    sent = server.requests[0]
    assert sent.path == "/v1/responses"
    assert sent.headers["authorization"] == "Bearer test-key"
    body = sent.body
    assert body["instructions"] == "You are terse."
    assert body["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}
    ]
    assert body["tools"][0]["type"] == "function" and body["tools"][0]["name"] == "get_weather"
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert body["max_output_tokens"] == 300
    assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
    call = first.message.tool_calls[0]
    assert (call.id, call.name, dict(call.args)) == (
        "call_12345xyz",
        "get_weather",
        {"city": "Paris"},
    )
    assert first.usage.reasoning_tokens == 128 and first.usage.cache_read_tokens == 64
    items = server.requests[1].body["input"]
    assert items[1] == fakes.OPENAI_REASONING  # encrypted reasoning back byte-for-byte
    assert items[2] == {
        "type": "function_call",
        "call_id": "call_12345xyz",
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
        "id": "fc_12345xyz",
    }
    assert items[3] == {
        "type": "function_call_output",
        "call_id": "call_12345xyz",
        "output": "sunny",
    }


async def test_gemini_mapping_thought_signature_and_no_automatic_function_calling() -> None:
    async with WireServer(fakes.gemini) as server:
        provider = make("gemini", server.base_url)
        first, _ = await _two_turns(provider, "gemini-2.5-flash")
    sent = server.requests[0]
    assert sent.path.endswith("/models/gemini-2.5-flash:generateContent"), sent.path
    assert sent.headers["x-goog-api-key"] == "test-key"
    body = sent.body
    assert body["systemInstruction"]["parts"] == [{"text": "You are terse."}]
    declarations = body["tools"][0]["functionDeclarations"]
    assert declarations[0]["name"] == "get_weather"
    # Proto JSON takes both spellings; this SDK version sends the field's snake_case name.
    schema = declarations[0].get(
        "parametersJsonSchema", declarations[0].get("parameters_json_schema")
    )
    assert schema == dict(WEATHER_TOOL.parameters)
    assert body["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    }
    assert body["generationConfig"]["maxOutputTokens"] == 300
    assert len(server.requests) == 2  # the SDK ran no function itself: one call per turn
    assert first.stop_reason == "tool_use"
    assert first.usage.reasoning_tokens == 60
    follow = server.requests[1].body["contents"]
    model_turn = follow[1]
    assert model_turn["role"] == "model"
    call_part = next(p for p in model_turn["parts"] if "functionCall" in p)
    # The signature's bytes go back unchanged (the SDK writes them in URL-safe base64).
    sent_signature = base64.urlsafe_b64decode(call_part["thoughtSignature"])
    assert sent_signature == base64.b64decode(fakes.GEMINI_SIGNATURE)
    assert call_part["functionCall"] == {"name": "get_weather", "args": {"city": "Paris"}}
    assert follow[2]["parts"] == [
        {"functionResponse": {"name": "get_weather", "response": {"result": "sunny"}}}
    ]


ERRORS = {
    "anthropic": (fakes.ANTHROPIC_429, 7.0, fakes.ANTHROPIC_400),
    "openai": (fakes.OPENAI_429, 1.5, fakes.OPENAI_400),
    "gemini": (fakes.GEMINI_429, 3.0, fakes.GEMINI_400),
}


@pytest.mark.parametrize("name", list(ERRORS))
async def test_429_is_retryable_with_its_delay_and_400_is_terminal(name: str) -> None:
    rate_limited, delay, bad = ERRORS[name]
    async with WireServer([rate_limited, bad]) as server:
        provider = make(name, server.base_url)
        with pytest.raises(ProviderError) as limited:
            await provider.complete(_tool_request(MODELS[name]))
        assert len(server.requests) == 1  # the SDK did not retry on its own
        with pytest.raises(ProviderError) as refused:
            await provider.complete(_tool_request(MODELS[name]))
        assert len(server.requests) == 2
    assert limited.value.retryable is True
    assert limited.value.status == 429
    assert limited.value.retry_after == pytest.approx(delay)
    assert refused.value.retryable is False
    assert refused.value.status == 400
    assert refused.value.provider == name


@pytest.mark.parametrize("name", list(ERRORS))
async def test_connection_refused_is_retryable(name: str) -> None:
    async with WireServer([]) as server:
        url = server.base_url
    provider = make(name, url)  # the server is gone: nothing listens on that port
    with pytest.raises(ProviderError) as failed:
        await provider.complete(_tool_request(MODELS[name]))
    assert failed.value.retryable is True and failed.value.status is None


@pytest.mark.parametrize(
    ("name", "refused", "accepted"),
    [
        ("anthropic", "audio/wav", "image/png"),
        ("openai", "audio/wav", "image/webp"),
        ("gemini", "application/zip", "audio/wav"),
    ],
)
async def test_media_a_provider_cannot_take_is_refused_before_any_call(
    name: str, refused: str, accepted: str
) -> None:
    async with WireServer(RESPONDERS[name]) as server:
        provider = make(name, server.base_url)
        bad = CompletionRequest(
            MODELS[name], (Message("user", (TextPart("hi"), MediaPart(b"RIFF....", refused))),)
        )
        with pytest.raises(UnsupportedContentError) as err:
            await provider.complete(bad)
        assert server.requests == []
        good = CompletionRequest(
            MODELS[name], (Message("user", (TextPart("hi"), MediaPart(b"\x89PNG", accepted))),)
        )
        await provider.complete(good)
        assert len(server.requests) == 1
    assert err.value.retryable is False and refused in str(err.value)
