"""GeminiProvider: generateContent through the official ``google-genai`` SDK."""

from __future__ import annotations

import base64
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

__all__ = ["GeminiProvider"]

NAME = "gemini"
_REFUSALS = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"}
)


def _import_sdk() -> tuple[Any, Any, Any]:
    try:
        import httpx2
        from google import genai
        from google.genai import errors, types
    except ImportError as exc:
        raise ConfigurationError(
            "GeminiProvider needs the 'gemini' extra", hint="pip install 'loom-runtime[gemini]'"
        ) from exc
    return genai, types, (errors.APIError, httpx2.TransportError)


def _accepts(media_type: str) -> bool:
    major = media_type.split("/", 1)[0]
    return major in ("image", "audio", "video") or media_type in (
        "application/pdf",
        "text/plain",
    )


class GeminiProvider:
    """Gemini models through ``generateContent``.

    Tools are passed as function declarations only, with automatic function calling disabled
    (Loom runs each tool call as a durable step). The SDK's retries are off (one attempt).
    Thought signatures come back in the ``extra`` of the part that carried them and are sent
    back byte-for-byte; thought summaries are :class:`ReasoningPart`.
    """

    name = NAME

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: Any = None,
        timeout: float | None = 600.0,
    ) -> None:
        genai, types, errors = _import_sdk()
        self._types = types
        self._errors = errors
        if client is None:
            options = types.HttpOptions(
                base_url=base_url,
                retry_options=types.HttpRetryOptions(attempts=1),
                timeout=None if timeout is None else int(timeout * 1000),
            )
            client = genai.Client(api_key=api_key, http_options=options)
        self._client = client

    def build_request(self, request: CompletionRequest) -> tuple[list[dict[str, Any]], Any]:
        """The SDK's ``contents`` and ``config`` for ``request`` (no network)."""
        check_media(request, NAME, _accepts)
        calls: dict[str, tuple[str, bool]] = {}
        contents = []
        for message in request.messages:
            parts = [p for part in message.parts if (p := _part(part, calls)) is not None]
            if parts:
                contents.append(
                    {"role": "user" if message.role == "user" else "model", "parts": parts}
                )
        config: dict[str, Any] = {
            "automatic_function_calling": {"disable": True},
        }
        if request.system:
            config["system_instruction"] = request.system
        if request.tools:
            config["tools"] = [
                {
                    "function_declarations": [
                        {
                            "name": t.name,
                            "description": t.description,
                            "parameters_json_schema": dict(t.parameters),
                        }
                        for t in request.tools
                    ]
                }
            ]
        if request.tool_choice is not None:
            config["tool_config"] = {"function_calling_config": _tool_choice(request.tool_choice)}
        if request.max_tokens is not None:
            config["max_output_tokens"] = request.max_tokens
        if request.temperature is not None:
            config["temperature"] = request.temperature
        if request.response_schema is not None:
            config["response_mime_type"] = "application/json"
            config["response_json_schema"] = dict(request.response_schema)
        config.update(request.options)
        return contents, self._types.GenerateContentConfig(**config)

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        contents, config = self.build_request(request)
        api_error, transport_error = self._errors
        try:
            response = await self._client.aio.models.generate_content(
                model=request.model, contents=contents, config=config
            )
        except api_error as exc:
            headers = dict(getattr(exc.response, "headers", None) or {})
            raise error_from_http(NAME, int(exc.code), headers, str(exc.message)) from exc
        except transport_error as exc:
            raise error_from_http(NAME, None, None, repr(exc)) from exc
        return parse_response(response)

    async def aclose(self) -> None:
        """Close the SDK client's connections."""
        await self._client.aio.aclose()

    async def __aenter__(self) -> GeminiProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _tool_choice(choice: str) -> dict[str, Any]:
    if choice == "auto":
        return {"mode": "AUTO"}
    if choice == "none":
        return {"mode": "NONE"}
    if choice == "required":
        return {"mode": "ANY"}
    return {"mode": "ANY", "allowed_function_names": [choice]}


def _signature(part: TextPart | ToolCallPart) -> dict[str, Any]:
    extra = (part.extra or {}).get(NAME) or {}
    sig = extra.get("thought_signature")
    return {"thought_signature": base64.b64decode(sig)} if sig else {}


def _part(part: Part, calls: dict[str, tuple[str, bool]]) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"text": part.text, **_signature(part)}
    if isinstance(part, MediaPart):
        return {"inline_data": {"mime_type": part.media_type, "data": part.data}}
    if isinstance(part, ToolCallPart):
        synthetic = bool(((part.extra or {}).get(NAME) or {}).get("synthetic_id"))
        calls[part.id] = (part.name, synthetic)
        call: dict[str, Any] = {"name": part.name, "args": dict(part.args)}
        if not synthetic:
            call["id"] = part.id
        return {"function_call": call, **_signature(part)}
    if isinstance(part, ToolResultPart):
        name, synthetic = calls.get(part.call_id, (part.name or "", True))
        key = "error" if part.is_error else "result"
        result: dict[str, Any] = {"name": part.name or name, "response": {key: part.content}}
        if not synthetic:
            result["id"] = part.call_id
        return {"function_response": result}
    if isinstance(part, ReasoningPart):
        if part.provider != NAME or part.data is None:
            return None
        data = dict(part.data)
        sig = data.pop("thought_signature", None)
        if sig:
            data["thought_signature"] = base64.b64decode(sig)
        return data
    raise TypeError(f"unknown part {part!r}")  # pragma: no cover


def parse_response(response: Any) -> CompletionResponse:
    """An SDK ``GenerateContentResponse`` as a :class:`CompletionResponse`."""
    candidates = getattr(response, "candidates", None) or []
    parts: list[Part] = []
    finish = None
    if candidates:
        candidate = candidates[0]
        finish = getattr(candidate.finish_reason, "value", candidate.finish_reason)
        content = candidate.content
        for index, p in enumerate((content.parts if content else None) or []):
            sig = (
                {"thought_signature": base64.b64encode(p.thought_signature).decode("ascii")}
                if p.thought_signature
                else {}
            )
            if p.function_call is not None:
                fc = p.function_call
                extra: dict[str, Any] = dict(sig)
                call_id = fc.id
                if not call_id:
                    call_id = f"call_{index}"
                    extra["synthetic_id"] = True
                parts.append(
                    ToolCallPart(
                        str(call_id),
                        str(fc.name),
                        dict(fc.args or {}),
                        {NAME: extra} if extra else None,
                    )
                )
            elif p.thought:
                parts.append(
                    ReasoningPart(
                        NAME, p.text or "", {"text": p.text or "", "thought": True, **sig}
                    )
                )
            elif p.text is not None:
                parts.append(TextPart(p.text, {NAME: sig} if sig else None))
    elif response is None:
        raise ProviderError("gemini returned no response", provider=NAME, retryable=False)
    stop: StopReason
    if any(isinstance(p, ToolCallPart) for p in parts):
        stop = "tool_use"
    elif finish == "MAX_TOKENS":
        stop = "max_tokens"
    elif finish in _REFUSALS or not candidates:
        stop = "refusal"
    elif finish in ("STOP", None):
        stop = "end_turn"
    else:
        stop = "other"
    usage = getattr(response, "usage_metadata", None)
    return CompletionResponse(
        message=Message("assistant", tuple(parts)),
        stop_reason=stop,
        usage=Usage(
            input_tokens=int(getattr(usage, "prompt_token_count", 0) or 0),
            output_tokens=int(getattr(usage, "candidates_token_count", 0) or 0),
            cache_read_tokens=int(getattr(usage, "cached_content_token_count", 0) or 0),
            reasoning_tokens=int(getattr(usage, "thoughts_token_count", 0) or 0),
        ),
        model=str(getattr(response, "model_version", "") or ""),
        provider=NAME,
        response_id=getattr(response, "response_id", None),
    )
