"""AnthropicProvider: the Messages API through the official ``anthropic`` SDK."""

from __future__ import annotations

from typing import Any

from loom.errors import ConfigurationError
from loom.llm._base import check_media, error_from_http
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

__all__ = ["AnthropicProvider"]

NAME = "anthropic"
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
DOCUMENT_TYPES = frozenset({"application/pdf"})
_STOP: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "stop_sequence": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "refusal": "refusal",
}


def _import_sdk() -> Any:
    try:
        import anthropic
    except ImportError as exc:
        raise ConfigurationError(
            "AnthropicProvider needs the 'anthropic' extra",
            hint="pip install 'loom-runtime[anthropic]'",
        ) from exc
    return anthropic


class AnthropicProvider:
    """Claude through the Messages API.

    The SDK's own retries are off (``max_retries=0``): Loom's retry policy is the one layer.
    Thinking and redacted-thinking blocks come back as :class:`ReasoningPart` holding the
    block exactly as received (signature included) and are sent back unchanged.
    ``default_max_tokens`` fills the API's required ``max_tokens`` when a request has none.
    """

    name = NAME

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: Any = None,
        default_max_tokens: int = 4096,
        timeout: float | None = 600.0,
    ) -> None:
        sdk = _import_sdk()
        self._sdk = sdk
        self._client = client or sdk.AsyncAnthropic(
            api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout
        )
        self.default_max_tokens = default_max_tokens

    def build_body(self, request: CompletionRequest) -> dict[str, Any]:
        """The Messages API request body for ``request`` (no network)."""
        check_media(request, NAME, lambda t: t in IMAGE_TYPES or t in DOCUMENT_TYPES)
        body: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens or self.default_max_tokens,
            "messages": [
                {"role": m.role, "content": [b for p in m.parts if (b := _block(p)) is not None]}
                for m in request.messages
            ],
        }
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
                for t in request.tools
            ]
        if request.tool_choice is not None:
            body["tool_choice"] = _tool_choice(request.tool_choice)
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.response_schema is not None:
            body["output_config"] = {
                "format": {"type": "json_schema", "schema": dict(request.response_schema)}
            }
        body.update(request.options)
        return body

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        body = self.build_body(request)
        required = {k: body.pop(k) for k in ("model", "max_tokens", "messages")}
        try:
            raw = await self._client.messages.with_raw_response.create(
                **required, extra_body=body or None
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

    async def __aenter__(self) -> AnthropicProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _json(raw: Any) -> Any:
    """The JSON body of an SDK raw response, exactly as the service sent it."""
    response = raw.http_response
    await response.aread()
    try:
        return response.json()
    except ValueError as exc:
        raise ProviderError(
            f"the service answered HTTP {response.status_code} with a body that is not JSON",
            provider=NAME,
            retryable=True,
        ) from exc


def _tool_choice(choice: str) -> dict[str, Any]:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice}


def _block(part: Part) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, MediaPart):
        kind = "image" if part.media_type in IMAGE_TYPES else "document"
        return {
            "type": kind,
            "source": {"type": "base64", "media_type": part.media_type, "data": part.base64},
        }
    if isinstance(part, ToolCallPart):
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": dict(part.args)}
    if isinstance(part, ToolResultPart):
        return {
            "type": "tool_result",
            "tool_use_id": part.call_id,
            "content": part.content_text(),
            "is_error": part.is_error,
        }
    if isinstance(part, ReasoningPart):
        # Another provider's reasoning means nothing here; ours goes back exactly as received.
        return dict(part.data) if part.provider == NAME and part.data is not None else None
    raise TypeError(f"unknown part {part!r}")  # pragma: no cover


def parse_response(data: Any) -> CompletionResponse:
    """A Messages API response body as a :class:`CompletionResponse`."""
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise ProviderError(
            "anthropic returned a body that is not a message", provider=NAME, retryable=False
        )
    parts: list[Part] = []
    for block in data["content"]:
        kind = block.get("type")
        if kind == "text":
            parts.append(TextPart(str(block.get("text", ""))))
        elif kind == "tool_use":
            parts.append(
                ToolCallPart(str(block["id"]), str(block["name"]), dict(block.get("input") or {}))
            )
        elif kind == "thinking":
            parts.append(ReasoningPart(NAME, str(block.get("thinking", "")), dict(block)))
        else:
            # redacted_thinking, server tool blocks and anything newer: opaque, sent back as is.
            parts.append(ReasoningPart(NAME, "", dict(block)))
    usage = data.get("usage") or {}
    return CompletionResponse(
        message=Message("assistant", tuple(parts)),
        stop_reason=_STOP.get(str(data.get("stop_reason")), "other"),
        usage=Usage(
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            cache_read_tokens=int(usage.get("cache_read_input_tokens") or 0),
            cache_write_tokens=int(usage.get("cache_creation_input_tokens") or 0),
        ),
        model=str(data.get("model", "")),
        provider=NAME,
        response_id=data.get("id"),
    )
