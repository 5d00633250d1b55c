"""Recorded wire-format answers of the three model APIs, for the local WireServer.

Shapes follow each API's documented JSON: Anthropic Messages (``content`` blocks with
``thinking`` + ``signature`` and ``tool_use``), OpenAI Responses (``output`` items with
``reasoning`` + ``encrypted_content`` and ``function_call``), Gemini ``generateContent``
(``candidates[].content.parts`` with ``functionCall`` + ``thoughtSignature``).
"""

from __future__ import annotations

import base64
from typing import Any

from tests.support.llm_wire import Answer, Seen

ANTHROPIC_SIGNATURE = "EqQBCkgIARABGAIiQL+sig/with+slashes=="
OPENAI_ENCRYPTED = "gAAAAABoENCRYPTED-reasoning_blob=="
GEMINI_SIGNATURE = base64.b64encode(b"\x00\x01opaque-thought-signature\xff").decode()

ANTHROPIC_THINKING = {
    "type": "thinking",
    "thinking": "The user wants the weather; call the tool.",
    "signature": ANTHROPIC_SIGNATURE,
}
OPENAI_REASONING = {
    "type": "reasoning",
    "id": "rs_0a1b2c",
    "summary": [{"type": "summary_text", "text": "Need the weather tool."}],
    "encrypted_content": OPENAI_ENCRYPTED,
}


def _anthropic_message(content: list[dict[str, Any]], stop: str) -> dict[str, Any]:
    return {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-loom-test",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 412,
            "output_tokens": 57,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 128,
        },
    }


def anthropic(seen: Seen) -> Answer:
    body = seen.body
    last = body["messages"][-1]["content"]
    if any(block.get("type") == "tool_result" for block in last):
        return 200, {}, _anthropic_message([{"type": "text", "text": "It is clear."}], "end_turn")
    if (body.get("tool_choice") or {}).get("type") in ("tool", "any"):
        name = body["tools"][0]["name"]
        content = [
            ANTHROPIC_THINKING,
            {
                "type": "tool_use",
                "id": "toolu_01A09q90qw90lq917835lq9",
                "name": name,
                "input": {"city": "Paris"},
            },
        ]
        return 200, {}, _anthropic_message(content, "tool_use")
    return 200, {}, _anthropic_message([{"type": "text", "text": "Hello!"}], "end_turn")


def _openai_response(output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "resp_67ccd2bed1ec8190b14f964abc054267",
        "object": "response",
        "created_at": 1741476542,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": "gpt-5-2025-08-07",
        "output": output,
        "parallel_tool_calls": True,
        "store": False,
        "usage": {
            "input_tokens": 328,
            "input_tokens_details": {"cached_tokens": 64},
            "output_tokens": 148,
            "output_tokens_details": {"reasoning_tokens": 128},
            "total_tokens": 476,
        },
    }


def _openai_text(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_67ccd2bf17f0819081ff3bb2cf6508e6",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def openai(seen: Seen) -> Answer:
    body = seen.body
    items = body["input"]
    if items and items[-1].get("type") == "function_call_output":
        return 200, {}, _openai_response([_openai_text("It is clear.")])
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        name = body["tools"][0]["name"]
        call = {
            "type": "function_call",
            "id": "fc_12345xyz",
            "call_id": "call_12345xyz",
            "name": name,
            "arguments": '{"city":"Paris"}',
            "status": "completed",
        }
        return 200, {}, _openai_response([OPENAI_REASONING, call])
    return 200, {}, _openai_response([_openai_text("Hello!")])


def _gemini(parts: list[dict[str, Any]], finish: str = "STOP") -> dict[str, Any]:
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": parts},
                "finishReason": finish,
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 211,
            "candidatesTokenCount": 19,
            "totalTokenCount": 290,
            "thoughtsTokenCount": 60,
            "cachedContentTokenCount": 32,
        },
        "modelVersion": "gemini-2.5-flash",
        "responseId": "mL3DaPuAJ5GfmtkPgs2kyQk",
    }


def gemini(seen: Seen) -> Answer:
    body = seen.body
    last = body["contents"][-1]["parts"]
    if any("functionResponse" in p for p in last):
        return 200, {}, _gemini([{"text": "It is clear."}])
    mode = ((body.get("toolConfig") or {}).get("functionCallingConfig") or {}).get("mode")
    if mode == "ANY":
        name = body["tools"][0]["functionDeclarations"][0]["name"]
        parts = [
            {"text": "Weighing which tool to use.", "thought": True},
            {
                "functionCall": {"name": name, "args": {"city": "Paris"}},
                "thoughtSignature": GEMINI_SIGNATURE,
            },
        ]
        return 200, {}, _gemini(parts)
    return 200, {}, _gemini([{"text": "Hello!"}])


ANTHROPIC_429 = (
    429,
    {"retry-after": "7", "request-id": "req_011"},
    {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "Number of requests has exceeded your rate limit",
        },
    },
)
ANTHROPIC_400 = (
    400,
    {},
    {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "messages: roles must alternate"},
    },
)
OPENAI_429 = (
    429,
    {"retry-after-ms": "1500", "x-request-id": "req_abc"},
    {
        "error": {
            "message": "Rate limit reached for requests",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    },
)
OPENAI_400 = (
    400,
    {},
    {
        "error": {
            "message": "Invalid value for 'input'.",
            "type": "invalid_request_error",
            "param": "input",
            "code": None,
        }
    },
)
GEMINI_429 = (
    429,
    {"retry-after": "3"},
    {
        "error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
        }
    },
)
GEMINI_400 = (
    400,
    {},
    {
        "error": {
            "code": 400,
            "message": "Request contains an invalid argument.",
            "status": "INVALID_ARGUMENT",
        }
    },
)
