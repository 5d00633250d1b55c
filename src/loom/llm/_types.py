"""Provider-neutral conversation types, each round-tripping through JSON (``to_dict`` /
``from_dict``) so that a model call can be recorded in the log and replayed byte-for-byte.

A :class:`Message` is a role and an ordered tuple of parts. Provider-specific data that must be
sent back unchanged (Anthropic thinking blocks and their signatures, OpenAI reasoning items,
Gemini thought signatures) lives in :class:`ReasoningPart` or in a part's ``extra`` mapping,
keyed by the provider that produced it; the other providers leave it out of their requests.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from loom.errors import PayloadError

__all__ = [
    "CompletionRequest",
    "CompletionResponse",
    "MediaPart",
    "Message",
    "Part",
    "ReasoningPart",
    "Role",
    "StopReason",
    "TextPart",
    "ToolCallPart",
    "ToolChoice",
    "ToolResultPart",
    "ToolSpec",
    "Usage",
    "canonical_json",
    "part_from_dict",
]

Role: TypeAlias = Literal["user", "assistant"]
StopReason: TypeAlias = Literal["end_turn", "tool_use", "max_tokens", "refusal", "other"]
#: ``"auto"``, ``"none"``, ``"required"`` (some tool), or the name of the one tool to call.
ToolChoice: TypeAlias = str

_STOP_REASONS = ("end_turn", "tool_use", "max_tokens", "refusal", "other")


def canonical_json(value: Any) -> str:
    """Sorted-key, compact JSON: the one text hashes and fingerprints are computed over."""
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"value is not JSON: {exc}") from exc


def _extra(d: Mapping[str, Any]) -> dict[str, Any] | None:
    extra = d.get("extra")
    return dict(extra) if extra else None


@dataclass(frozen=True, slots=True)
class TextPart:
    """Plain text. ``extra`` holds provider fields to send back verbatim (a Gemini
    ``thoughtSignature``), keyed by provider name."""

    text: str
    extra: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": "text", "text": self.text}
        if self.extra:
            d["extra"] = dict(self.extra)
        return d


@dataclass(frozen=True, slots=True)
class MediaPart:
    """Bytes of an image, document or audio clip with their media type (``image/png``)."""

    data: bytes
    media_type: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "media",
            "media_type": self.media_type,
            "data": base64.b64encode(self.data).decode("ascii"),
        }

    @property
    def base64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")


@dataclass(frozen=True, slots=True)
class ToolCallPart:
    """The model asks for tool ``name`` with JSON ``args``; ``id`` pairs it with its result."""

    id: str
    name: str
    args: Mapping[str, Any]
    extra: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "type": "tool_call",
            "id": self.id,
            "name": self.name,
            "args": dict(self.args),
        }
        if self.extra:
            d["extra"] = dict(self.extra)
        return d


@dataclass(frozen=True, slots=True)
class ToolResultPart:
    """The result of tool call ``call_id``: JSON ``content`` (text or a JSON value);
    ``is_error`` marks an observation of a failure the model may correct."""

    call_id: str
    content: Any
    is_error: bool = False
    #: The tool's name (Gemini pairs results with calls by name; the others ignore it).
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "type": "tool_result",
            "call_id": self.call_id,
            "content": self.content,
            "is_error": self.is_error,
        }
        if self.name is not None:
            d["name"] = self.name
        return d

    def content_text(self) -> str:
        """The content as text: strings unchanged, other JSON values encoded."""
        return self.content if isinstance(self.content, str) else canonical_json(self.content)


@dataclass(frozen=True, slots=True)
class ReasoningPart:
    """A provider's reasoning (thinking) block. ``data`` is the provider's own record of it
    (with signatures or encrypted content) and is sent back to that provider byte-for-byte:
    dropping or altering it makes the next call fail. Other providers omit it."""

    provider: str
    text: str = ""
    data: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": "reasoning", "provider": self.provider, "text": self.text}
        if self.data is not None:
            d["data"] = dict(self.data)
        return d


Part: TypeAlias = TextPart | MediaPart | ToolCallPart | ToolResultPart | ReasoningPart


def part_from_dict(d: Mapping[str, Any]) -> Part:
    """Rebuild a part from its ``to_dict`` output; an unknown shape raises PayloadError."""
    try:
        kind = d["type"]
        if kind == "text":
            return TextPart(str(d["text"]), _extra(d))
        if kind == "media":
            return MediaPart(base64.b64decode(d["data"], validate=True), str(d["media_type"]))
        if kind == "tool_call":
            args = d["args"]
            if not isinstance(args, Mapping):
                raise TypeError("args must be an object")
            return ToolCallPart(str(d["id"]), str(d["name"]), dict(args), _extra(d))
        if kind == "tool_result":
            name = d.get("name")
            return ToolResultPart(
                str(d["call_id"]),
                d.get("content"),
                bool(d.get("is_error", False)),
                None if name is None else str(name),
            )
        if kind == "reasoning":
            data = d.get("data")
            return ReasoningPart(
                str(d["provider"]), str(d.get("text", "")), None if data is None else dict(data)
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise PayloadError(f"malformed message part {dict(d)!r}: {exc!r}") from exc
    raise PayloadError(f"unknown message part type {d.get('type')!r}")


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of a conversation: ``user`` (text, media, tool results) or ``assistant``."""

    role: Role
    parts: tuple[Part, ...]

    def __post_init__(self) -> None:
        if self.role not in ("user", "assistant"):
            raise PayloadError(f"message role must be 'user' or 'assistant', not {self.role!r}")
        if not isinstance(self.parts, tuple):
            object.__setattr__(self, "parts", tuple(self.parts))

    @classmethod
    def user(cls, *parts: Part | str) -> Message:
        return cls("user", tuple(TextPart(p) if isinstance(p, str) else p for p in parts))

    @classmethod
    def assistant(cls, *parts: Part | str) -> Message:
        return cls("assistant", tuple(TextPart(p) if isinstance(p, str) else p for p in parts))

    @property
    def text(self) -> str:
        """The concatenated text parts (reasoning excluded)."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> list[ToolCallPart]:
        return [p for p in self.parts if isinstance(p, ToolCallPart)]

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "parts": [p.to_dict() for p in self.parts]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Message:
        parts = d.get("parts")
        if not isinstance(parts, list):
            raise PayloadError(f"malformed message {dict(d)!r}: parts must be a list")
        return cls(d.get("role"), tuple(part_from_dict(p) for p in parts))  # type: ignore[arg-type]

    def digest(self) -> str:
        """The sha256 of the message's canonical JSON: its content address."""
        return hashlib.sha256(canonical_json(self.to_dict()).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: its name, description and JSON schema of arguments."""

    name: str
    description: str
    parameters: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolSpec:
        return cls(str(d["name"]), str(d.get("description", "")), dict(d["parameters"]))


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one call consumed, as the provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        """The non-zero counts (a missing count reads back as 0): recorded on every turn."""
        counts = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }
        return {k: v for k, v in counts.items() if v}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Usage:
        return cls(
            int(d.get("input_tokens", 0)),
            int(d.get("output_tokens", 0)),
            int(d.get("cache_read_tokens", 0)),
            int(d.get("cache_write_tokens", 0)),
            int(d.get("reasoning_tokens", 0)),
        )


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """One model call. ``options`` passes provider-specific parameters through unchanged
    (``{"thinking": {...}}`` for Anthropic, ``{"reasoning": {...}}`` for OpenAI)."""

    model: str
    messages: tuple[Message, ...]
    system: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    response_schema: Mapping[str, Any] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.messages, tuple):
            object.__setattr__(self, "messages", tuple(self.messages))
        if not isinstance(self.tools, tuple):
            object.__setattr__(self, "tools", tuple(self.tools))

    def parameters(self) -> dict[str, Any]:
        """Everything but the history and tools: what a fingerprint calls "parameters"."""
        return {
            "model": self.model,
            "tool_choice": self.tool_choice,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "response_schema": dict(self.response_schema) if self.response_schema else None,
            "options": dict(self.options),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "messages": [m.to_dict() for m in self.messages],
            "tools": [t.to_dict() for t in self.tools],
            **self.parameters(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompletionRequest:
        schema = d.get("response_schema")
        return cls(
            model=str(d["model"]),
            messages=tuple(Message.from_dict(m) for m in d.get("messages", [])),
            system=d.get("system"),
            tools=tuple(ToolSpec.from_dict(t) for t in d.get("tools", [])),
            tool_choice=d.get("tool_choice"),
            max_tokens=d.get("max_tokens"),
            temperature=d.get("temperature"),
            response_schema=dict(schema) if schema else None,
            options=dict(d.get("options") or {}),
        )


@dataclass(frozen=True, slots=True)
class CompletionResponse:
    """What a model call returned: the assistant message and why it stopped."""

    message: Message
    stop_reason: StopReason
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    provider: str = ""
    response_id: str | None = None

    def __post_init__(self) -> None:
        if self.stop_reason not in _STOP_REASONS:
            raise PayloadError(f"unknown stop reason {self.stop_reason!r}")
        if self.message.role != "assistant":
            raise PayloadError("a completion's message must have the 'assistant' role")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"message": self.message.to_dict(), "stop_reason": self.stop_reason}
        usage = self.usage.to_dict()
        if usage:
            d["usage"] = usage
        d["model"] = self.model
        d["provider"] = self.provider
        if self.response_id is not None:
            d["response_id"] = self.response_id
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompletionResponse:
        try:
            return cls(
                message=Message.from_dict(d["message"]),
                stop_reason=d["stop_reason"],
                usage=Usage.from_dict(d.get("usage") or {}),
                model=str(d.get("model", "")),
                provider=str(d.get("provider", "")),
                response_id=d.get("response_id"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PayloadError(f"malformed completion response: {exc!r}") from exc


def messages_from(items: Sequence[Message | str]) -> tuple[Message, ...]:
    """Messages from a mix of messages and plain strings (user text)."""
    return tuple(Message.user(m) if isinstance(m, str) else m for m in items)
