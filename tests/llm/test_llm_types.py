"""loom.llm types round-trip through JSON; errors are classified; the scripted provider."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from loom.errors import PayloadError
from loom.llm import (
    CompletionRequest,
    CompletionResponse,
    MediaPart,
    Message,
    ProviderError,
    ReasoningPart,
    ScriptedProvider,
    ScriptExhaustedError,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    ToolSpec,
    Usage,
    classify_status,
    reply,
    retry_after_from_headers,
    tool_calls,
)

EVERY_PART = (
    TextPart("hé \u2603", {"gemini": {"thought_signature": "c2ln"}}),
    MediaPart(bytes(range(256)), "image/png"),
    ToolCallPart("c1", "search", {"q": "x", "n": [1, 2.5, None]}, {"openai": {"id": "fc_1"}}),
    ToolResultPart("c1", {"hits": []}, is_error=True, name="search"),
    ToolResultPart("c2", "plain text"),
    ReasoningPart("anthropic", "thinking...", {"type": "thinking", "signature": "s/+="}),
    ReasoningPart("openai"),
)


def test_every_part_and_message_round_trips_through_json_text() -> None:
    message = Message("assistant", EVERY_PART)
    text = json.dumps(message.to_dict())
    again = Message.from_dict(json.loads(text))
    assert again == message
    assert again.digest() == message.digest()
    assert again.parts[1].data == bytes(range(256))  # type: ignore[union-attr]


def test_request_and_response_round_trip() -> None:
    request = CompletionRequest(
        "m",
        (Message.user("hi"), Message("assistant", EVERY_PART)),
        system="sys",
        tools=(ToolSpec("search", "find", {"type": "object"}),),
        tool_choice="required",
        max_tokens=10,
        temperature=0.0,
        response_schema={"type": "object"},
        options={"thinking": {"type": "enabled", "budget_tokens": 1024}},
    )
    assert CompletionRequest.from_dict(json.loads(json.dumps(request.to_dict()))) == request
    response = CompletionResponse(
        Message.assistant("ok"), "end_turn", Usage(1, 2, 3, 4, 5), "m", "p", "r1"
    )
    assert CompletionResponse.from_dict(json.loads(json.dumps(response.to_dict()))) == response
    assert (Usage(1, 2) + Usage(3, 4, reasoning_tokens=1)).to_dict()["reasoning_tokens"] == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "video", "data": ""},
        {"type": "media", "media_type": "image/png", "data": "not base64!"},
        {"type": "tool_call", "id": "x", "name": "n", "args": [1]},
        {"type": "text"},
    ],
)
def test_malformed_parts_are_typed_errors(bad: dict[str, object]) -> None:
    with pytest.raises(PayloadError):
        Message.from_dict({"role": "user", "parts": [bad]})


def test_bad_roles_and_stop_reasons_are_refused() -> None:
    with pytest.raises(PayloadError):
        Message("system", ())  # type: ignore[arg-type]
    with pytest.raises(PayloadError):
        CompletionResponse(Message.assistant("x"), "stopped")  # type: ignore[arg-type]
    with pytest.raises(PayloadError):
        CompletionResponse(Message.user("x"), "end_turn")


@pytest.mark.parametrize(
    ("status", "headers", "retryable", "delay"),
    [
        (429, {"Retry-After": "12"}, True, 12.0),
        (429, {"retry-after-ms": "250", "retry-after": "9"}, True, 0.25),
        (503, {}, True, None),
        (500, {"retry-after": "garbage"}, True, None),
        (408, {}, True, None),
        (409, {}, True, None),
        (None, {}, True, None),
        (400, {"retry-after": "5"}, False, None),
        (401, {}, False, None),
        (404, {}, False, None),
        (413, {}, False, None),
        (422, {}, False, None),
    ],
)
def test_status_classification(
    status: int | None, headers: dict[str, str], retryable: bool, delay: float | None
) -> None:
    verdict = classify_status(status, headers)
    assert verdict.retryable is retryable
    assert verdict.retry_after == delay


def test_retry_after_as_an_http_date() -> None:
    delay = retry_after_from_headers(
        {"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"}, now=1445412500.0
    )
    assert delay == pytest.approx(10.0)
    assert retry_after_from_headers({"retry-after": "-3"}) is None


def test_provider_error_round_trips_through_its_json_record() -> None:
    err = ProviderError("x", provider="p", retryable=True, status=429, retry_after=2.0)
    record = err.to_dict()
    assert record["details"]["retryable"] is True and record["details"]["retry_after"] == 2.0
    json.dumps(record)


async def test_scripted_provider_answers_in_order_records_requests_and_fails_loudly() -> None:
    seen: list[str] = []
    provider = ScriptedProvider(
        [
            tool_calls(("search", {"q": "a"})),
            "done",
            ProviderError("slow", provider="s", retryable=True),
        ],
        on_call=lambda r: seen.append(r.messages[-1].text),
    )
    request = CompletionRequest("m", (Message.user("go"),))
    first = await provider.complete(request)
    assert first.stop_reason == "tool_use" and first.message.tool_calls[0].name == "search"
    assert first.provider == "scripted" and first.model == "scripted-model"
    second = await provider.complete(request)
    assert second.message.text == "done" and second.stop_reason == "end_turn"
    with pytest.raises(ProviderError):
        await provider.complete(request)
    with pytest.raises(ScriptExhaustedError) as exhausted:
        await provider.complete(request)
    assert exhausted.value.retryable is False
    assert provider.calls == 4 and seen == ["go"] * 4
    assert provider.requests[0] is request


async def test_scripted_provider_streams_the_answer_in_chunks() -> None:
    provider = ScriptedProvider([reply("abcdefg")], stream_chunk=3)
    chunks: list[str] = []
    response = await provider.complete_streaming(
        CompletionRequest("m", (Message.user("x"),)), chunks.append
    )
    assert chunks == ["abc", "def", "g"] and response.message.text == "abcdefg"


def test_importing_loom_llm_pulls_in_no_provider_sdk() -> None:
    code = (
        "import sys, loom, loom.llm, loom.testing\n"
        "bad = [m for m in ('anthropic', 'openai', 'google.genai') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
