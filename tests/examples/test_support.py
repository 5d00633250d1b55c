"""The examples' shared pieces: the model they use comes from LOOM_EXAMPLE_PROVIDER (a real
service only with its key; refused clearly without it), and every call is counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples._support import LEDGER_ENV, PROVIDER_ENV, CountingProvider, Ledger, provider
from loom.llm import CompletionRequest, Message, reply


def _echo(request: CompletionRequest) -> object:
    return reply("ok")


async def test_scripted_by_default_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "effects.db"))
    monkeypatch.delenv(PROVIDER_ENV, raising=False)
    model, name = provider("probe", _echo)
    assert name == "scripted" and isinstance(model, CountingProvider)
    answer = await model.complete(CompletionRequest(model="m", messages=(Message.user("hi"),)))
    assert answer.message.text == "ok"
    assert Ledger().counts() == {"model:probe": 1}


@pytest.mark.parametrize(
    ("choice", "key", "cls"),
    [
        ("anthropic", "ANTHROPIC_API_KEY", "AnthropicProvider"),
        ("openai", "OPENAI_API_KEY", "OpenAIProvider"),
        ("gemini", "GEMINI_API_KEY", "GeminiProvider"),
    ],
)
def test_real_provider_needs_its_key(
    choice: str, key: str, cls: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROVIDER_ENV, choice)
    monkeypatch.delenv(key, raising=False)
    with pytest.raises(SystemExit, match=key):
        provider("probe", _echo)
    monkeypatch.setenv(key, "not-a-real-key")  # constructing calls nothing
    model, _ = provider("probe", _echo)
    assert isinstance(model, CountingProvider) and type(model.inner).__name__ == cls
