"""decode_json decodes with one prebuilt decoder; it must answer exactly as
``json.loads(text, parse_constant=refuse)`` did: the same value, or a refusal of the same kind
(PayloadError for what json.loads refused with ValueError, the same TypeError otherwise)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loom.errors import PayloadError
from loom.model import decode_json


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


DOC = '{"a": [1, 2.5, "é", null, true], "b": {"c": "\\ud83d\\ude00"}}'
INPUTS: list[Any] = [
    DOC,
    "\ufeff" + DOC,  # a BOM in text: refused
    DOC.encode(),
    b"\xef\xbb\xbf" + DOC.encode(),  # a BOM in UTF-8 bytes: json.loads takes it
    DOC.encode("utf-16"),
    DOC.encode("utf-16-le"),
    DOC.encode("utf-16-be"),
    DOC.encode("utf-32"),
    DOC.encode("utf-32-le"),
    bytearray(DOC.encode()),
    '"\\udc80"',  # a lone surrogate escape
    '"\udc80"',  # a lone surrogate in the text itself
    "NaN",
    "[Infinity]",
    "[-Infinity]",
    '{"a": 1} x',
    "",
    "  ",
    "[" * 50 + "]" * 50,
    b"\xff\xfe",
    b'"\xed\xa0\x80"',  # a surrogate encoded in UTF-8 bytes
    memoryview(b"[]"),
    12,
    None,
]


def _old(text: Any) -> tuple[str, Any]:
    try:
        return "value", json.loads(text, parse_constant=_refuse)
    except (ValueError, RecursionError):
        return "refused", None
    except Exception as exc:
        return type(exc).__name__, None


def _new(text: Any) -> tuple[str, Any]:
    try:
        return "value", decode_json(text)
    except PayloadError:
        return "refused", None
    except Exception as exc:
        return type(exc).__name__, None


@pytest.mark.parametrize("text", INPUTS, ids=range(len(INPUTS)))
def test_decode_json_answers_as_json_loads(text: Any) -> None:
    assert _new(text) == _old(text)


def test_the_inputs_cover_values_refusals_and_type_errors() -> None:
    kinds = {_old(t)[0] for t in INPUTS}
    assert kinds == {"value", "refused", "TypeError"}
