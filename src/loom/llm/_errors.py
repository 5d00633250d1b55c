"""Provider errors and their classification: retryable after a delay, or terminal.

Loom's step :class:`~loom.RetryPolicy` is the one retry layer (the SDKs' own retries are
off), so a provider turns every failure into a :class:`ProviderError` that says whether a
retry can help and how long to wait first:

- ``retry-after-ms`` (milliseconds) or ``retry-after`` (seconds or an HTTP date) set the delay;
- 408, 409, 429 and 5xx answers, and failures with no answer (connection, timeout), are
  retryable;
- every other answer (400 bad request, 401, 403, 404, 413, 422, ...) is terminal: retrying
  the same request cannot succeed.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loom.errors import LoomError, RetryableError, TerminalError

__all__ = [
    "ErrorClass",
    "ProviderError",
    "RetryableProviderError",
    "ScriptExhaustedError",
    "TerminalProviderError",
    "UnsupportedContentError",
    "classify_status",
    "retry_after_from_headers",
]

RETRYABLE_STATUSES = frozenset({408, 409, 429})


class ProviderError(LoomError):
    """A model call failed. ``retryable`` says whether the same request may succeed later,
    ``retry_after`` how many seconds to wait first (None: the retry policy's backoff).

    The retry semantics live in the type too: constructing ``ProviderError(...)`` gives a
    :class:`RetryableProviderError` (a ``loom.RetryableError``: the step's retry policy waits
    ``retry_after`` before the next attempt) or a :class:`TerminalProviderError` (a
    ``loom.TerminalError``: the step fails at once), as ``retryable`` says.
    """

    code = "llm_provider"

    def __new__(cls, *args: Any, retryable: bool = False, **kwargs: Any) -> ProviderError:
        if cls is ProviderError:
            cls = RetryableProviderError if retryable else TerminalProviderError
        return super().__new__(cls)

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        retryable: bool,
        status: int | None = None,
        retry_after: float | None = None,
        execution_id: str | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(
            message,
            execution_id=execution_id,
            hint=hint,
            provider=provider,
            retryable=retryable,
            status=status,
            retry_after=retry_after,
            **details,
        )
        self.provider = provider
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after


class RetryableProviderError(ProviderError, RetryableError):
    """A provider failure a later attempt may not hit (429, 5xx, no answer)."""

    code = "llm_provider_retryable"


class TerminalProviderError(ProviderError, TerminalError):
    """A provider refusal no retry can fix (400, 401, 404, ...)."""

    code = "llm_provider_terminal"


class UnsupportedContentError(TerminalProviderError):
    """The request holds content the provider cannot take (a media type it refuses);
    nothing was sent."""

    code = "llm_unsupported_content"

    def __init__(self, message: str, *, provider: str, **details: Any) -> None:
        super().__init__(
            message,
            provider=provider,
            retryable=False,
            hint="Convert the content or send it to a provider that accepts it",
            **details,
        )


class ScriptExhaustedError(TerminalProviderError):
    """A :class:`~loom.llm.ScriptedProvider` was asked for more responses than its script has."""

    code = "llm_script_exhausted"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(
            message,
            provider="scripted",
            retryable=False,
            hint="Add a response to the script for every model call the test makes",
            **details,
        )


@dataclass(frozen=True, slots=True)
class ErrorClass:
    """The verdict on one failed call."""

    retryable: bool
    retry_after: float | None = None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def retry_after_from_headers(
    headers: Mapping[str, str], *, now: float | None = None
) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` or ``retry-after`` (seconds or HTTP date);
    None when neither is present or readable. Never negative."""
    ms = _header(headers, "retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000.0
            if value >= 0 and value == value:
                return value
        except ValueError:
            pass
    after = _header(headers, "retry-after")
    if after is None:
        return None
    try:
        value = float(after)
        return value if value >= 0 and value == value else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(after)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def classify_status(status: int | None, headers: Mapping[str, str] | None = None) -> ErrorClass:
    """Classify a failed call by its HTTP status (None: no answer) and response headers."""
    delay = retry_after_from_headers(headers or {})
    if status is None or status in RETRYABLE_STATUSES or status >= 500:
        return ErrorClass(True, delay)
    return ErrorClass(False, None)
