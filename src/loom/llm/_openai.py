"""OpenAIProvider: the Responses API through the official ``openai`` SDK."""

from __future__ import annotations

import json
from typing import Any

from loom.errors import ConfigurationError
from loom.llm._anthropic import _json
from loom.llm._base import check_media, error_from_http, parse_args
from loom.llm._errors import ProviderError
from loom.llm._types import (
    CompletionRequest,
    CompletionResponse,
    MediaPart,
    Message,
    Part,
    ReasoningPart,
    StopReason,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
)

__all__ = ["OpenAIProvider"]

NAME = "openai"
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
FILE_TYPES = frozenset({"application/pdf"})


def _import_sdk() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise ConfigurationError(
            "OpenAIProvider needs the 'openai' extra", hint="pip install 'loom-runtime[openai]'"
        ) from exc
    return openai


class OpenAIProvider:
    """OpenAI models through the Responses API.

    Stateless by default (``store=False``) and asking for reasoning items' encrypted content,
    so a reasoning model's reasoning comes back as a :class:`ReasoningPart` holding the item
    exactly as received, and is sent back unchanged on the next call. The SDK's own retries
    are off (``max_retries=0``).
    """

    name = NAME

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: Any = None,
        timeout: float | None = 600.0,
        stateless: bool = True,
    ) -> None:
        sdk = _import_sdk()
        self._sdk = sdk
        self._client = client or sdk.AsyncOpenAI(
            api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout
        )
        self.stateless = stateless

    def build_body(self, request: CompletionRequest) -> dict[str, Any]:
        """The Responses API request body for ``request`` (no network)."""
        check_media(request, NAME, lambda t: t in IMAGE_TYPES or t in FILE_TYPES)
        items: list[dict[str, Any]] = []
        for message in request.messages:
            items.extend(_items(message))
        body: dict[str, Any] = {"model": request.model, "input": items}
        if request.system:
            body["instructions"] = request.system
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": dict(t.parameters),
                    "strict": False,
                }
                for t in request.tools
            ]
        if request.tool_choice is not None:
            choice = request.tool_choice
            body["tool_choice"] = (
                choice
                if choice in ("auto", "none", "required")
                else {"type": "function", "name": choice}
            )
        if request.max_tokens is not None:
            body["max_output_tokens"] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.response_schema is not None:
            body["text"] = {
                "format": {
                    "type": "json_schema",
                    "name": "output",
                    "schema": dict(request.response_schema),
                    "strict": False,
                }
            }
        if self.stateless:
            body["store"] = False
            body["include"] = ["reasoning.encrypted_content"]
        body.update(request.options)
        return body

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        body = self.build_body(request)
        model, items = body.pop("model"), body.pop("input")
        try:
            raw = await self._client.responses.with_raw_response.create(
                model=model, input=items, extra_body=body or None
            )
            data = await _json(raw)
        except self._sdk.APIStatusError as exc:
            raise error_from_http(
                NAME, exc.status_code, dict(exc.response.headers), str(exc.message)
            ) from exc
        except self._sdk.APIConnectionError as exc:
            raise error_from_http(NAME, None, None, repr(exc)) from exc
        return parse_response(data)

    async def aclose(self) -> None:
        """Close the SDK client's connections."""
        await self._client.close()

    async def __aenter__(self) -> OpenAIProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _items(message: Message) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []

    def flush() -> None:
        if content:
            if message.role == "user":
                items.append({"role": "user", "content": list(content)})
            else:
                items.append({"type": "message", "role": "assistant", "content": list(content)})
            content.clear()

    for part in message.parts:
        if isinstance(part, TextPart):
            kind = "input_text" if message.role == "user" else "output_text"
            content.append({"type": kind, "text": part.text})
        elif isinstance(part, MediaPart):
            url = f"data:{part.media_type};base64,{part.base64}"
            if part.media_type in IMAGE_TYPES:
                content.append({"type": "input_image", "image_url": url})
            else:
                content.append({"type": "input_file", "filename": "document", "file_data": url})
        elif isinstance(part, ToolCallPart):
            flush()
            item: dict[str, Any] = {
                "type": "function_call",
                "call_id": part.id,
                "name": part.name,
                "arguments": json.dumps(dict(part.args), separators=(",", ":")),
            }
            item.update((part.extra or {}).get(NAME) or {})
            items.append(item)
        elif isinstance(part, ToolResultPart):
            flush()
            items.append(
                {"type": "function_call_output", "call_id": part.call_id, "output": _output(part)}
            )
        elif isinstance(part, ReasoningPart):
            flush()
            if part.provider == NAME and part.data is not None:
                items.append(dict(part.data))
    flush()
    return items


def _output(part: ToolResultPart) -> str:
    text = part.content_text()
    # The Responses API has no error flag on a function output: say it in the text.
    return f"ERROR: {text}" if part.is_error else text


def parse_response(data: Any) -> CompletionResponse:
    """A Responses API response body as a :class:`CompletionResponse`."""
    if not isinstance(data, dict) or not isinstance(data.get("output"), list):
        raise ProviderError(
            "openai returned a body that is not a response", provider=NAME, retryable=False
        )
    parts: list[Part] = []
    refused = False
    for item in data["output"]:
        kind = item.get("type")
        if kind == "message":
            for c in item.get("content") or []:
                if c.get("type") == "output_text":
                    parts.append(TextPart(str(c.get("text", ""))))
                elif c.get("type") == "refusal":
                    refused = True
                    parts.append(TextPart(str(c.get("refusal", ""))))
        elif kind == "function_call":
            name = str(item["name"])
            extra = {NAME: {"id": item["id"]}} if item.get("id") else None
            parts.append(
                ToolCallPart(
                    str(item["call_id"]), name, parse_args(item.get("arguments"), NAME, name), extra
                )
            )
        elif kind == "reasoning":
            summary = "".join(
                str(s.get("text", "")) for s in item.get("summary") or [] if isinstance(s, dict)
            )
            parts.append(ReasoningPart(NAME, summary, dict(item)))
        else:
            parts.append(ReasoningPart(NAME, "", dict(item)))
    stop: StopReason
    incomplete = (data.get("incomplete_details") or {}).get("reason")
    if data.get("status") == "incomplete" and incomplete == "max_output_tokens":
        stop = "max_tokens"
    elif refused or incomplete == "content_filter":
        stop = "refusal"
    elif any(isinstance(p, ToolCallPart) for p in parts):
        stop = "tool_use"
    elif data.get("status") in (None, "completed"):
        stop = "end_turn"
    else:
        stop = "other"
    usage = data.get("usage") or {}
    return CompletionResponse(
        message=Message("assistant", tuple(parts)),
        stop_reason=stop,
        usage=Usage(
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            cache_read_tokens=int(
                (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
            ),
            reasoning_tokens=int(
                (usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0
            ),
        ),
        model=str(data.get("model", "")),
        provider=NAME,
        response_id=data.get("id"),
    )
