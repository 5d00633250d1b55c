"""The LLM provider conformance kit: ``await run_llm_provider_conformance(provider, model=...)``.

The kit sends a handful of requests through a provider and checks the answers are mapped into
Loom's types faithfully: a text answer, a tool call for the one tool the request forces, a
follow-up carrying the tool's result, the JSON round trip of every response, and the refusal
of content the provider cannot take before anything is sent. Point the provider at whatever
answers like the real service (the real service with a key, or a local server replaying its
wire format, as Loom's own tests do); :func:`conformance_responder` is the script that makes a
:class:`~loom.llm.ScriptedProvider` answer the kit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from loom.llm import (
    CompletionRequest,
    CompletionResponse,
    LlmProvider,
    MediaPart,
    Message,
    ProviderError,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    ToolSpec,
    UnsupportedContentError,
    reply,
    tool_calls,
)

__all__ = [
    "LLM_CHECKS",
    "WEATHER_TOOL",
    "conformance_responder",
    "run_llm_provider_conformance",
]

WEATHER_TOOL = ToolSpec(
    "get_weather",
    "The current weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)

LlmCheck = Callable[[LlmProvider, str, "str | None"], Awaitable[None]]
LLM_CHECKS: dict[str, LlmCheck] = {}


def _check(fn: LlmCheck) -> LlmCheck:
    LLM_CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def _round_trips(response: CompletionResponse, provider: LlmProvider) -> None:
    assert isinstance(response, CompletionResponse), response
    assert response.provider == provider.name, (response.provider, provider.name)
    assert response.message.role == "assistant"
    again = CompletionResponse.from_dict(response.to_dict())
    assert again == response, (again, response)
    usage = response.usage
    assert (
        min(
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            usage.reasoning_tokens,
        )
        >= 0
    ), usage


@_check
async def check_text_answer(provider: LlmProvider, model: str, _: str | None) -> None:
    request = CompletionRequest(
        model, (Message.user("Say hello."),), system="Be brief.", max_tokens=64
    )
    response = await provider.complete(request)
    _round_trips(response, provider)
    assert response.stop_reason == "end_turn", response.stop_reason
    assert response.message.text, response


@_check
async def check_forced_tool_call(provider: LlmProvider, model: str, _: str | None) -> None:
    request = CompletionRequest(
        model,
        (Message.user("What is the weather in Paris?"),),
        tools=(WEATHER_TOOL,),
        tool_choice=WEATHER_TOOL.name,
        max_tokens=256,
    )
    response = await provider.complete(request)
    _round_trips(response, provider)
    calls = response.message.tool_calls
    assert calls, response
    assert response.stop_reason == "tool_use", response.stop_reason
    for call in calls:
        assert call.name == WEATHER_TOOL.name, call
        assert call.id, call
        assert isinstance(call.args, dict), call


@_check
async def check_tool_result_follow_up(provider: LlmProvider, model: str, _: str | None) -> None:
    first = await provider.complete(
        CompletionRequest(
            model,
            (Message.user("What is the weather in Paris?"),),
            tools=(WEATHER_TOOL,),
            tool_choice=WEATHER_TOOL.name,
            max_tokens=256,
        )
    )
    results = tuple(
        ToolResultPart(call.id, {"city": "Paris", "sky": "clear"}, name=call.name)
        for call in first.message.tool_calls
    )
    assert results, first
    follow = await provider.complete(
        CompletionRequest(
            model,
            (
                Message.user("What is the weather in Paris?"),
                first.message,
                Message("user", results),
            ),
            tools=(WEATHER_TOOL,),
            max_tokens=256,
        )
    )
    _round_trips(follow, provider)
    assert follow.stop_reason == "end_turn", follow.stop_reason
    assert follow.message.text, follow


@_check
async def check_refuses_unsupported_media(
    provider: LlmProvider, model: str, unsupported: str | None
) -> None:
    if unsupported is None:
        return
    request = CompletionRequest(
        model, (Message("user", (TextPart("look"), MediaPart(b"\x00\x01", unsupported))),)
    )
    try:
        await provider.complete(request)
    except UnsupportedContentError as exc:
        assert exc.retryable is False
        assert exc.provider == provider.name
    except ProviderError as exc:  # pragma: no cover - a failure report
        raise AssertionError(f"expected UnsupportedContentError, got {exc!r}") from exc
    else:  # pragma: no cover - a failure report
        raise AssertionError(f"{provider.name} accepted media of type {unsupported!r}")


async def run_llm_provider_conformance(
    provider: LlmProvider,
    *,
    model: str,
    unsupported_media_type: str | None = "application/x-loom-unsupported",
) -> None:
    """Run every check against ``provider``; the first failure raises AssertionError.

    ``unsupported_media_type`` is a media type the provider must refuse before sending
    anything (None skips that check, for providers that take any media).
    """
    assert isinstance(provider, LlmProvider), f"{provider!r} is not an LlmProvider"
    for name, check in LLM_CHECKS.items():
        try:
            await check(provider, model, unsupported_media_type)
        except AssertionError as exc:
            raise AssertionError(f"LLM provider check {name!r} failed: {exc}") from exc


def conformance_responder(request: CompletionRequest) -> CompletionResponse:
    """What a well-behaved model answers to the kit's requests (a ScriptedProvider script)."""
    last = request.messages[-1] if request.messages else None
    if last is not None and any(isinstance(p, ToolResultPart) for p in last.parts):
        return reply("It is clear in Paris.")
    if request.tools and request.tool_choice not in (None, "none", "auto"):
        return tool_calls(ToolCallPart("call_0", request.tools[0].name, {"city": "Paris"}))
    return reply("Hello.")
