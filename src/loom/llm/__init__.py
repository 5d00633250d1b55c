"""LLM providers behind one small SPI, with provider-neutral, JSON round-trippable types.

``LlmProvider.complete(request) -> response`` is the whole seam. :class:`ScriptedProvider`
runs offline; :class:`AnthropicProvider`, :class:`OpenAIProvider` and :class:`GeminiProvider`
use the official SDKs, installed by the extras ``loom-runtime[anthropic]``, ``[openai]`` and
``[gemini]`` (imported only when a provider is constructed, so the core needs none of them).
"""

from typing import TYPE_CHECKING

from loom.llm._base import LlmProvider, StreamingProvider, check_media
from loom.llm._errors import (
    ErrorClass,
    ProviderError,
    RetryableProviderError,
    ScriptExhaustedError,
    TerminalProviderError,
    UnsupportedContentError,
    classify_status,
    retry_after_from_headers,
)
from loom.llm._scripted import ScriptedProvider, ScriptEntry, reply, tool_calls
from loom.llm._types import (
    CompletionRequest,
    CompletionResponse,
    MediaPart,
    Message,
    Part,
    ReasoningPart,
    Role,
    StopReason,
    TextPart,
    ToolCallPart,
    ToolChoice,
    ToolResultPart,
    ToolSpec,
    Usage,
    canonical_json,
    part_from_dict,
)

if TYPE_CHECKING:
    from loom.llm._anthropic import AnthropicProvider
    from loom.llm._gemini import GeminiProvider
    from loom.llm._openai import OpenAIProvider

__all__ = [
    "AnthropicProvider",
    "CompletionRequest",
    "CompletionResponse",
    "ErrorClass",
    "GeminiProvider",
    "LlmProvider",
    "MediaPart",
    "Message",
    "OpenAIProvider",
    "Part",
    "ProviderError",
    "ReasoningPart",
    "RetryableProviderError",
    "Role",
    "ScriptEntry",
    "ScriptExhaustedError",
    "ScriptedProvider",
    "StopReason",
    "StreamingProvider",
    "TerminalProviderError",
    "TextPart",
    "ToolCallPart",
    "ToolChoice",
    "ToolResultPart",
    "ToolSpec",
    "UnsupportedContentError",
    "Usage",
    "canonical_json",
    "check_media",
    "classify_status",
    "part_from_dict",
    "reply",
    "retry_after_from_headers",
    "tool_calls",
]

_LAZY = {
    "AnthropicProvider": "loom.llm._anthropic",
    "GeminiProvider": "loom.llm._gemini",
    "OpenAIProvider": "loom.llm._openai",
}


def __getattr__(name: str) -> object:
    # The provider modules import nothing heavy themselves (the SDK is imported when a
    # provider is constructed), but keep them out of `import loom.llm` all the same.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'loom.llm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
