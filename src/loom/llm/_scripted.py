"""ScriptedProvider: an offline, deterministic model for demos and tests."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from loom.llm._errors import ScriptExhaustedError
from loom.llm._types import (
    CompletionRequest,
    CompletionResponse,
    Message,
    Part,
    StopReason,
    TextPart,
    ToolCallPart,
    Usage,
)

__all__ = ["ScriptEntry", "ScriptedProvider", "reply", "tool_calls"]

#: One scripted answer: a response, a message, plain text, an exception to raise, or a
#: function of the request returning any of those (sync or async).
ScriptEntry: TypeAlias = (
    CompletionResponse | Message | str | BaseException | Callable[[CompletionRequest], Any]
)


def reply(text: str, *, usage: Usage | None = None) -> CompletionResponse:
    """A final text answer (``end_turn``)."""
    return CompletionResponse(
        Message("assistant", (TextPart(text),)), "end_turn", usage or Usage(), provider="scripted"
    )


def tool_calls(
    *calls: tuple[str, Mapping[str, Any]] | ToolCallPart,
    text: str | None = None,
    usage: Usage | None = None,
) -> CompletionResponse:
    """An answer asking for tools, each ``(name, args)``; ids are ``call_<n>`` in order."""
    parts: list[Part] = [TextPart(text)] if text else []
    for index, call in enumerate(calls):
        if isinstance(call, ToolCallPart):
            parts.append(call)
        else:
            parts.append(ToolCallPart(f"call_{index}", call[0], dict(call[1])))
    return CompletionResponse(
        Message("assistant", tuple(parts)), "tool_use", usage or Usage(), provider="scripted"
    )


class ScriptedProvider:
    """Answers from a script instead of a model: no network, no key, same answers every run.

    ``script`` is a sequence of entries, answered in order, one per call; or a single function
    of the request (called for every request). Every request is kept in ``requests``; a call
    beyond the end of the script raises :class:`ScriptExhaustedError` (terminal), so a test
    that makes more model calls than it planned fails loudly. ``on_call`` (if given) is called
    with the request before each answer, e.g. to count calls in a ledger that survives a crash.
    ``by_turn=True`` picks the entry by the conversation's turn (the number of assistant
    messages in the request) instead of by this process's call count, so a conversation that
    a crash moved to another process gets the same answers there.
    """

    name = "scripted"

    def __init__(
        self,
        script: Sequence[ScriptEntry] | Callable[[CompletionRequest], Any],
        *,
        model: str = "scripted-model",
        on_call: Callable[[CompletionRequest], None] | None = None,
        stream_chunk: int = 0,
        by_turn: bool = False,
    ) -> None:
        self._fn: Callable[[CompletionRequest], Any] | None = None
        self._script: list[ScriptEntry] = []
        if callable(script) and not isinstance(script, Sequence):
            self._fn = script
        else:
            self._script = list(script)
        self.model = model
        self.on_call = on_call
        self.stream_chunk = stream_chunk
        self.by_turn = by_turn
        self.requests: list[CompletionRequest] = []

    @property
    def calls(self) -> int:
        return len(self.requests)

    @property
    def remaining(self) -> int:
        """Entries not answered yet (0 for a function script)."""
        return max(0, len(self._script) - len(self.requests)) if self._fn is None else 0

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        index = len(self.requests)
        if self.by_turn:
            index = sum(1 for m in request.messages if m.role == "assistant")
        self.requests.append(request)
        if self.on_call is not None:
            self.on_call(request)
        if self._fn is not None:
            entry: Any = self._fn
        elif index < len(self._script):
            entry = self._script[index]
        else:
            raise ScriptExhaustedError(
                f"the script has {len(self._script)} response(s); call {index + 1} has none",
                calls=index + 1,
            )
        return await self._answer(entry, request)

    async def complete_streaming(
        self, request: CompletionRequest, on_text: Callable[[str], None]
    ) -> CompletionResponse:
        """As :meth:`complete`, reporting the answer's text in chunks of ``stream_chunk``
        characters (the whole text at once when 0)."""
        response = await self.complete(request)
        text = response.message.text
        size = self.stream_chunk or max(1, len(text))
        for start in range(0, len(text), size):
            on_text(text[start : start + size])
        return response

    async def _answer(self, entry: Any, request: CompletionRequest) -> CompletionResponse:
        if isinstance(entry, BaseException):
            raise entry
        if callable(entry) and not isinstance(entry, (CompletionResponse, Message, str)):
            entry = entry(request)
            if inspect.isawaitable(entry):
                entry = await entry
            if isinstance(entry, BaseException):
                raise entry
        if isinstance(entry, str):
            entry = reply(entry)
        if isinstance(entry, Message):
            stop: StopReason = "tool_use" if entry.tool_calls else "end_turn"
            entry = CompletionResponse(entry, stop, Usage(), provider=self.name)
        if not isinstance(entry, CompletionResponse):
            raise TypeError(f"a script entry must give a CompletionResponse, not {entry!r}")
        return CompletionResponse(
            entry.message,
            entry.stop_reason,
            entry.usage,
            entry.model or self.model,
            self.name,
            entry.response_id,
        )
