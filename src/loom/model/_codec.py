"""JSON encoding of stored values, with the size and depth limits every store enforces.

Stored data is data: JSON only, never pickle, so that write access to the database never
becomes code execution on a worker.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from loom.errors import PayloadError

__all__ = [
    "DEFAULT_LIMITS",
    "PayloadLimits",
    "checksum",
    "decode_json",
    "encode_json",
    "envelope_checksum",
]


@dataclass(frozen=True, slots=True)
class PayloadLimits:
    """Upper bounds for one stored JSON document (an event payload or a snapshot)."""

    max_bytes: int = 1_048_576
    max_depth: int = 64


DEFAULT_LIMITS = PayloadLimits()

_encoder = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The C encoder behind _encoder, built once: JSONEncoder.encode builds a new one (and a
# circular-reference table) on every call, which costs about half of encoding a step's record.
# Without the table a circular value ends in RecursionError, refused like any other.
_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_c_encode: Any = (
    None
    if _make_encoder is None
    else _make_encoder(
        None, _not_json, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
)


def _encode(value: Any) -> str:
    if _c_encode is None:
        return _encoder.encode(value)
    return "".join(_c_encode(value, 0))


def _depth_exceeds(value: Any, limit: int) -> bool:
    # Iterative so a hostile document cannot blow the interpreter stack while we measure it.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in item)
    return False


def encode_json(
    value: Any, *, limits: PayloadLimits = DEFAULT_LIMITS, what: str = "payload"
) -> str:
    """Encode ``value`` as compact JSON or raise :class:`PayloadError` saying why not."""
    try:
        text = _encode(value)
        if not text.isascii():
            text.encode()  # lone surrogates cannot be stored as UTF-8
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadError(f"{what} is not storable as JSON: {exc}") from exc
    return checked_json(text, value, limits, what)


def checked_json(text: str, value: Any, limits: PayloadLimits, what: str) -> str:
    """``text`` (``value`` encoded, known to be storable as UTF-8) once it is within
    ``limits``, else the :class:`PayloadError` saying why not."""
    if _may_be_too_deep(text, limits) and _depth_exceeds(value, limits.max_depth):
        raise PayloadError(f"{what} is nested deeper than {limits.max_depth} levels")
    if len(text) * 4 > limits.max_bytes and len(text.encode()) > limits.max_bytes:
        raise PayloadError(
            f"{what} is {len(text.encode())} bytes, over the {limits.max_bytes}-byte limit",
            hint="Store large blobs elsewhere and record a reference",
        )
    return text


def decode_json(text: str | bytes, *, limits: PayloadLimits = DEFAULT_LIMITS) -> Any:
    """Decode JSON text, refusing oversized, too-deep or non-standard (NaN) documents."""
    if len(text) > limits.max_bytes * 4:
        raise PayloadError(f"document is over the {limits.max_bytes}-byte limit")
    try:
        # What json.loads does before decoding: bytes in UTF-8, -16 or -32 by their leading
        # bytes; a str must not start with a BOM.
        if isinstance(text, str):
            if text.startswith("\ufeff"):
                raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        elif isinstance(text, (bytes, bytearray)):
            text = text.decode(json.detect_encoding(text), "surrogatepass")
        else:
            raise TypeError(
                f"the JSON object must be str, bytes or bytearray, not {type(text).__name__}"
            )
        value = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"not valid JSON: {exc}") from exc
    if _may_be_too_deep(text, limits) and _depth_exceeds(value, limits.max_depth):
        raise PayloadError(f"document is nested deeper than {limits.max_depth} levels")
    return value


#: Limits at or above this depth are left to the interpreter's own recursion guard, which the
#: C JSON encoder and decoder both hit near 1,000 levels (a RecursionError, refused as a
#: PayloadError). Walking a whole snapshot to re-prove a bound its events already met is waste.
_WALK_BELOW = 500


def _may_be_too_deep(text: str | bytes, limits: PayloadLimits) -> bool:
    """Nesting deeper than the limit needs at least that many opening brackets."""
    if limits.max_depth >= _WALK_BELOW or len(text) < 2 * limits.max_depth:
        return False
    if isinstance(text, bytes):
        return text.count(b"[") + text.count(b"{") >= limits.max_depth
    return text.count("[") + text.count("{") >= limits.max_depth


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: One decoder for every document: json.loads with a keyword builds a new decoder and scanner
#: per call, which cost more than decoding a typical event's payload.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


#: The hash every record checksum starts from, copied per record: cheaper than building one
#: (and parsing its keyword arguments) each time.
_CHECKSUM_BASE = hashlib.blake2b(digest_size=12)


def checksum(*parts: str) -> str:
    """The checksum stored beside each record; any change to a part changes it."""
    h = _CHECKSUM_BASE.copy()
    h.update("\x1f".join(parts).encode())
    return h.hexdigest()


def envelope_checksum(
    envelope_id: str,
    execution_id: str,
    sequence: int,
    type: str,
    payload_json: str,
    recorded_at: float,
    fence: int,
) -> str:
    """An envelope's checksum: ``checksum`` over its fields (numbers as ``str``, the time as
    ``repr``), built as one string and hashed once."""
    h = _CHECKSUM_BASE.copy()
    h.update(
        f"{envelope_id}\x1f{execution_id}\x1f{sequence}\x1f{type}\x1f{payload_json}\x1f"
        f"{recorded_at!r}\x1f{fence}".encode()
    )
    return h.hexdigest()
