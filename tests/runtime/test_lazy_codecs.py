"""A step's or flow's codec for an annotation made of JSON scalars and builtin containers builds
its pydantic TypeAdapter on first need, not where it is declared: the values it stores, loads
and validates are exactly the eager adapter's, and a process whose flows pass only such values
never loads pydantic's schema machinery (~70 ms of every worker's and recovery's start)."""

from __future__ import annotations

import enum
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import pytest

import loom
from loom.errors import ConfigurationError
from loom.runtime._sdk import _Codec


class Color(enum.IntEnum):
    RED = 1


class Name(enum.StrEnum):
    ADA = "ada"


ANNOTATIONS: list[Any] = [
    int,
    float,
    str,
    bool,
    int | None,
    int | str,
    dict[str, Any],
    list[int],
    dict[str, list[float]] | None,
    tuple[int, ...],
]

VALUES: list[Any] = [
    0,
    7,
    True,
    2.5,
    1.0,
    math.nan,
    math.inf,
    "5",
    "x",
    None,
    Color.RED,
    Name.ADA,
    {"a": [1, 2.5]},
    {"a": "b"},
    [1, 2],
    [1, "x"],
    (1, 2),
    b"raw",
]


def _outcome(call: Any, *args: Any) -> tuple[str, Any]:
    try:
        value = call(*args)
    except Exception as exc:  # the error's type and text are part of the behaviour
        return ("raised", (type(exc).__name__, str(exc)))
    return ("returned", (type(value).__name__, repr(value)))


def _prebuilt(annotation: Any) -> _Codec:
    """The codec with its adapter built where it was declared, and every value through it (no
    plain-value shortcut): what the shortcuts must agree with."""
    codec = _Codec(annotation)
    codec._adapter = pydantic.TypeAdapter(annotation)
    codec.as_is = frozenset()
    codec.exact = None
    return codec


def _use(codec: _Codec, use: str, value: Any) -> Any:
    return codec.dump(value, "out") if use == "dump" else codec.load(value)


@pytest.mark.parametrize("annotation", ANNOTATIONS, ids=repr)
def test_a_lazy_codec_stores_and_loads_what_the_eager_adapter_does(annotation: Any) -> None:
    for value in VALUES:
        for use in ("dump", "load"):
            lazy, eager = _Codec(annotation), _prebuilt(annotation)
            assert lazy._adapter is None  # a fresh one per value: the first need builds it
            got = _outcome(_use, lazy, use, value)
            assert got == _outcome(_use, eager, use, value), (use, value)


@pytest.mark.parametrize("annotation", ANNOTATIONS, ids=repr)
def test_a_flow_validates_its_input_as_the_eager_adapter_does(annotation: Any) -> None:
    async def body(ctx: loom.WorkflowContext, x: Any) -> None:
        return None

    body.__annotations__["x"] = annotation
    for value in VALUES:
        lazy = loom.flow(id="f")(body)
        eager = loom.flow(id="f")(body)
        eager.input = _prebuilt(annotation)
        assert lazy.input._adapter is None
        got = _outcome(lazy.encode_input, value, "x1")
        expected = _outcome(eager.encode_input, value, "x1")
        assert got == expected, value


class Opaque:
    """No pydantic schema can be built for it."""


def test_an_annotation_pydantic_cannot_handle_is_still_refused_where_it_is_declared() -> None:
    async def returns_opaque() -> Opaque:
        return Opaque()

    with pytest.raises(ConfigurationError, match="cannot store"):
        loom.step(id="opaque")(returns_opaque)
    # Shaped like JSON containers but not buildable: still refused where declared, as before.
    for broken in (tuple[..., int], list[...], dict[str]):  # type: ignore[misc]

        async def returns_broken() -> Any:
            return None

        returns_broken.__annotations__["return"] = broken
        with pytest.raises(ConfigurationError, match="cannot store"):
            loom.step(id="broken")(returns_broken)
    # An annotation that cannot be hashed (a dict in Annotated's metadata) is simply not JSON
    # shaped: its adapter is built where it is declared, and it works as before.
    unit = Annotated[int, {"unit": "ms"}]
    assert _Codec(unit)._adapter is not None and _Codec(unit).load("5") == 5
    assert _Codec(list[unit])._adapter is not None

    async def gated(ctx: loom.WorkflowContext) -> None:
        return None

    assert loom.flow(id="gated", resume_schemas={"go": unit})(gated).resume_schemas["go"]
    # Annotations beyond JSON shapes keep building their adapter at once.
    assert _Codec(Literal["a", "b"])._adapter is not None
    assert _Codec(list[Color])._adapter is not None
    assert _Codec(Any)._adapter is None and _Codec(Any).adapter is None


_PROCESS = """
import asyncio, json, sys
from typing import Any
import loom

@loom.step(id="inc")
async def inc(x: int) -> int:
    return x + 1

@loom.flow(id="count")
async def count(ctx: loom.WorkflowContext, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.run(inc, x)
    return x

@loom.flow(id="shaped")
async def shaped(ctx: loom.WorkflowContext, rows: list[int]) -> dict[str, Any]:
    return {"total": await ctx.run(inc, sum(rows))}

machinery = "pydantic._internal._generate_schema"
declared = machinery in sys.modules

async def main() -> tuple[int, bool]:
    async with loom.WorkflowRuntime(loom.SQLiteStore(sys.argv[1])) as rt:
        rt.register(count, shaped)
        out = await (await rt.start(count, 3, execution_id="c")).result(timeout=30)
        ran = machinery in sys.modules
        shaped_out = await (await rt.start(shaped, [1, 2], execution_id="s")).result(timeout=30)
    return out, ran, shaped_out

out, ran, shaped_out = asyncio.run(main())
print(json.dumps({"declared": declared, "ran": ran, "out": out, "shaped": shaped_out}))
"""


def test_flows_of_ints_and_dicts_never_load_the_schema_machinery(tmp_path: Path) -> None:
    script = tmp_path / "flows.py"
    script.write_text(textwrap.dedent(_PROCESS))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "loom.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["declared"] is False  # declaring the flows and steps built no adapter
    assert seen["ran"] is False  # nor did running a flow of ints to its end
    assert seen["out"] == 3
    assert seen["shaped"] == {"total": 4}  # a dict output built its adapter when it needed it
