"""The provider SPI (:class:`LlmProvider`) and what the SDK-backed providers share."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from loom.llm._errors import ProviderError, UnsupportedContentError, classify_status
from loom.llm._types import CompletionRequest, CompletionResponse, MediaPart

__all__ = ["LlmProvider", "StreamingProvider", "check_media", "error_from_http", "parse_args"]


@runtime_checkable
class LlmProvider(Protocol):
    """A model behind one method.

    ``complete`` sends one request and returns the whole response. It raises
    :class:`~loom.llm.ProviderError` for every failure, classified: ``retryable`` (with
    ``retry_after`` seconds when the service said how long to wait) or terminal. It never
    retries on its own: the step's :class:`~loom.RetryPolicy` is the one retry layer, and each
    attempt is recorded. Content the provider cannot take is refused with
    :class:`~loom.llm.UnsupportedContentError` before any network call. ``name`` identifies
    the provider in recorded responses and in provider-specific parts (``"anthropic"``).
    """

    name: str

    async def complete(self, request: CompletionRequest) -> CompletionResponse: ...


@runtime_checkable
class StreamingProvider(LlmProvider, Protocol):
    """A provider that can also report text as it is generated. ``on_text`` receives each
    chunk; the returned response is the same as :meth:`complete` would return."""

    async def complete_streaming(
        self, request: CompletionRequest, on_text: Callable[[str], None]
    ) -> CompletionResponse: ...


def check_media(request: CompletionRequest, provider: str, accepts: Callable[[str], bool]) -> None:
    """Refuse, before anything is sent, media parts the provider cannot take."""
    for index, message in enumerate(request.messages):
        for part in message.parts:
            if not isinstance(part, MediaPart):
                continue
            if message.role != "user":
                raise UnsupportedContentError(
                    f"message {index}: {provider} takes media only in user messages",
                    provider=provider,
                    media_type=part.media_type,
                )
            if not accepts(part.media_type):
                raise UnsupportedContentError(
                    f"message {index}: {provider} does not accept media of type "
                    f"{part.media_type!r}",
                    provider=provider,
                    media_type=part.media_type,
                )


def parse_args(text: str | None, provider: str, name: str) -> dict[str, Any]:
    """A tool call's JSON argument text as an object (a model that emits broken JSON is a
    terminal failure of that call, reported with the text it sent)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ProviderError(
            f"{provider} returned arguments for tool {name!r} that are not JSON: {text[:200]!r}",
            provider=provider,
            retryable=True,
        ) from exc
    if not isinstance(value, dict):
        raise ProviderError(
            f"{provider} returned arguments for tool {name!r} that are not an object",
            provider=provider,
            retryable=True,
        )
    return value


def error_from_http(
    provider: str,
    status: int | None,
    headers: Mapping[str, str] | None,
    message: str,
    cause: BaseException | None = None,
) -> ProviderError:
    """A classified :class:`ProviderError` for an HTTP answer (``status`` None: no answer)."""
    verdict = classify_status(status, headers)
    what = "no answer" if status is None else f"HTTP {status}"
    hint = None if verdict.retryable else "The request was refused; retrying it cannot succeed"
    return ProviderError(
        f"{provider} call failed ({what}): {message}",
        provider=provider,
        retryable=verdict.retryable,
        status=status,
        retry_after=verdict.retry_after,
        hint=hint,
    )
