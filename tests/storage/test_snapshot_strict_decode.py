"""A loaded snapshot is decoded in one pass that checks every field as it builds the state
(#13.3): no round trip through to_dict, yet anything that is not exactly what Loom writes is
refused, and the runtime folds from the log instead."""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import loom
from loom.errors import CorruptEventError
from loom.model import ExecutionState, Gate, OpKind, OpRecord, OpStatus, replay
from loom.model._events import ExecutionStatus
from loom.model._state import merge_stored_ops, state_from_stored
from loom.storage import Snapshot
from loom.storage._common import validate_snapshot

EID = "strict"


def _state() -> ExecutionState:
    """A state with every optional part filled: annotations, a waiting gate, errors, metadata."""
    return ExecutionState(
        EID,
        flow_id="f",
        flow_version="1",
        input={"a": [1, 2]},
        status=ExecutionStatus.SUSPENDED,
        last_sequence=7,
        started_at=1.5,
        updated_at=2,
        ops={
            0: OpRecord(OpKind.STEP, "s", OpStatus.COMPLETED, {"x": 1}, None, 1),
            1: OpRecord(
                OpKind.STEP, "t", OpStatus.COMPLETED, 3, None, 2, annotations={"tokens": 4}
            ),
            2: OpRecord("ext.custom", "c", OpStatus.FAILED, None, {"type": "E"}, 3),
            10: OpRecord(OpKind.GATE, "Go", OpStatus.WAITING),
        },
        waiting=Gate(10, "Go", "key", 99.5),
        ui={"k": "v"},
        error=None,
        cancel_reason=None,
        recoveries=1,
        fence=3,
        forked_from={"execution_id": "p", "sequence": 2},
        metadata={"m": 1},
    )


def test_what_loom_writes_loads_back_equal() -> None:
    for state in (_state(), ExecutionState(EID, last_sequence=0)):
        d = state.to_dict()
        before = copy.deepcopy(d)
        loaded = validate_snapshot(Snapshot(EID, state.last_sequence, d), EID)
        assert loaded == state
        assert loaded.to_dict() == d
        assert d == before  # the stored dict (maybe a cached decode) is never changed
    loaded = validate_snapshot(Snapshot(EID, 7, _state().to_dict()), EID)
    # Members, not bare strings: the fold compares statuses by identity.
    assert loaded.ops[0].status is OpStatus.COMPLETED and loaded.ops[0].kind is OpKind.STEP
    assert loaded.status is ExecutionStatus.SUSPENDED


def _op(pos: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        d["ops"][pos][key] = value

    return change


def _rename(old: str, new: Any) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        d["ops"][new] = d["ops"].pop(old)

    return change


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        d[key] = value

    return change


HOSTILE: dict[str, Callable[[dict[str, Any]], None]] = {
    # Positions other than the form str(int) writes could alias one another.
    "position with a leading zero": _rename("2", "02"),
    "position with a space": _rename("2", " 2"),
    "negative position": _rename("2", "-2"),
    "position not a number": _rename("2", "two"),
    "position 00": _rename("2", "00"),
    "position empty": _rename("2", ""),
    "position with a comma": _rename("2", "2,3"),
    "position with an underscore": _rename("10", "1_0"),
    "position an Arabic-Indic digit": _rename("2", "\u0662"),
    "position not a string": _rename("2", 2),
    # Equal under ==, so the old round trip let them through; the fold wants integers.
    "attempts true": _op("1", "attempts", True),
    "attempts 1.0": _op("1", "attempts", 1.0),
    "attempts a string": _op("1", "attempts", "1"),
    "annotations null": _op("0", "annotations", None),
    "annotations a list": _op("1", "annotations", [1]),
    "extra op field": _op("0", "extra", 1),
    "op status unknown": _op("0", "status", "done"),
    "op status unhashable": _op("0", "status", ["completed"]),
    "op kind not a string": _op("0", "kind", 1),
    "op name missing": lambda d: d["ops"]["0"].pop("name"),
    "op error a string": _op("0", "error", "boom"),
    "op record a list": lambda d: d["ops"].__setitem__("0", ["step", "s", "completed"]),
    "missing field": lambda d: d.pop("metadata"),
    "extra field": _set("extra", 1),
    "status unknown": _set("status", "paused"),
    "fence true": _set("fence", True),
    "recoveries 1.0": _set("recoveries", 1.0),
    "ui null": _set("ui", None),
    "metadata a list": _set("metadata", []),
    "started_at a string": _set("started_at", "now"),
    "updated_at true": _set("updated_at", True),
    "flow_id null": _set("flow_id", None),
    "cancel_reason a number": _set("cancel_reason", 3),
    "forked_from a list": _set("forked_from", []),
    "waiting empty": _set("waiting", {}),
    "waiting extra field": lambda d: d["waiting"].__setitem__("x", 1),
    "waiting position a string": lambda d: d["waiting"].__setitem__("position", "10"),
    "waiting timeout a string": lambda d: d["waiting"].__setitem__("timeout_at", "soon"),
    "waiting key a number": lambda d: d["waiting"].__setitem__("correlation_key", 5),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_snapshot_not_in_the_form_loom_writes_is_refused(case: str) -> None:
    d = _state().to_dict()
    HOSTILE[case](d)
    with pytest.raises(CorruptEventError, match="is unusable"):
        validate_snapshot(Snapshot(EID, 7, d), EID)


@loom.step(id="strict-step")
async def strict_step(i: int) -> int:
    return i * 2


@loom.flow(id="strict-flow", version="1")
async def strict_flow(ctx: loom.WorkflowContext, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.run(strict_step, i)
    return total


async def test_the_runtime_ignores_a_hostile_snapshot_with_a_good_checksum(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Stored through the API, so its checksum matches: the bytes are what the writer wrote,
    # and the one-pass check alone must still refuse them.
    store = loom.SQLiteStore(tmp_path / "loom.db")
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(strict_flow)
    handle = await rt.start(strict_flow, 5, execution_id=EID)
    assert await handle.result() == 20
    truth = replay(await store.read(EID), execution_id=EID)
    lie = truth.to_dict()
    lie["ops"]["03"] = lie["ops"].pop("3")  # aliases position 3, equal after int()
    lie["ops"]["1"]["attempts"] = True
    await store.save_snapshot(Snapshot(EID, truth.last_sequence, lie))
    await rt.close()

    store = loom.SQLiteStore(tmp_path / "loom.db")
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(strict_flow)
    with caplog.at_level(logging.WARNING, logger="loom.runtime"):
        loaded = await rt.load_state(EID)
    assert loaded == truth
    assert type(loaded.ops[1].attempts) is int
    assert any("ignored the snapshot" in r.getMessage() for r in caplog.records)
    await rt.close()


# ------------------------------------------------------------------ the compact ops form


def test_the_compact_form_loads_back_equal() -> None:
    for state in (_state(), ExecutionState(EID, last_sequence=0)):
        d = state.to_stored()
        before = copy.deepcopy(d)
        loaded = validate_snapshot(Snapshot(EID, state.last_sequence, d), EID)
        assert loaded == state
        assert loaded.to_stored() == d and loaded.to_dict() == state.to_dict()
        assert d == before
    loaded = validate_snapshot(Snapshot(EID, 7, _state().to_stored()), EID)
    assert loaded.ops[0].status is OpStatus.COMPLETED and loaded.ops[0].kind is OpKind.STEP
    assert loaded.ops[1].annotations == {"tokens": 4} and loaded.ops[2].error == {"type": "E"}
    many = ExecutionState(EID, last_sequence=0)
    many.ops = {i: OpRecord(OpKind.STEP, "s", OpStatus.COMPLETED, i, None, 1) for i in range(5)}
    # Ops sharing kind, name, status and attempts share one shape; positions are runs.
    assert many.to_stored()["ops"][1:4] == [[0, 5], [["step", "s", "completed", 1]], [0, 5]]


def _col(index: int, change: Callable[[list[Any]], None]) -> Callable[[dict[str, Any]], None]:
    def apply(d: dict[str, Any]) -> None:
        change(d["ops"][index])

    return apply


def _put(i: int, value: Any) -> Callable[[list[Any]], None]:
    def apply(column: list[Any]) -> None:
        column[i] = value

    return apply


# _state().to_stored()["ops"]: position runs [0, 3, 10, 1] (0-2 and 10), four shapes, shape
# runs [0, 1, 1, 1, 2, 1, 3, 1], four outputs, extras at ops 1 and 2.
HOSTILE_COLUMNS: dict[str, Callable[[dict[str, Any]], None]] = {
    "form 3": lambda d: d["ops"].__setitem__(0, 3),
    "form 2.0": lambda d: d["ops"].__setitem__(0, 2.0),
    "form missing": lambda d: d["ops"].pop(0),
    "a column more": lambda d: d["ops"].append([]),
    "ops a string": _set("ops", "[2]"),
    "position run start true": _col(1, lambda c: c.__setitem__(slice(None), [True, 1, 0, 3])),
    "position run start 10.0": _col(1, _put(2, 10.0)),
    "position run start a string": _col(1, _put(2, "10")),
    "position run start negative": _col(1, _put(2, -10)),
    "position repeated": _col(1, _put(2, 2)),
    "position runs overlap": _col(1, lambda c: c.__setitem__(slice(None), [0, 3, 1, 1])),
    "position run of none": _col(1, lambda c: c.__setitem__(slice(None), [0, 4, 10, 0])),
    "position run length true": _col(1, lambda c: c.__setitem__(slice(None), [0, 3, 1, True])),
    "position runs odd": _col(1, lambda c: c.pop()),
    "position runs an object": lambda d: d["ops"].__setitem__(1, {"0": 3}),
    "positions one op short": _col(1, _put(1, 2)),
    "positions a billion ops": _col(1, _put(1, 10**9)),
    "one output more": _col(4, lambda c: c.append(None)),
    "outputs an object": lambda d: d["ops"].__setitem__(4, {}),
    "shape index out of range": _col(3, _put(0, 4)),
    "shape index negative": _col(3, _put(0, -1)),
    "shape index true": _col(3, _put(2, True)),
    "shape index 0.0": _col(3, _put(0, 0.0)),
    "shape run of none": _col(3, lambda c: c.__setitem__(slice(None), [0, 2, 1, 0, 2, 1, 3, 1])),
    "shape runs one op over": _col(3, _put(1, 2)),
    "shape runs odd": _col(3, lambda c: c.pop()),
    "shapes an object": lambda d: d["ops"].__setitem__(2, {}),
    "shape three long": _col(2, lambda c: c[0].pop()),
    "shape an object": _col(2, _put(0, {"kind": "step"})),
    "shape status unknown": _col(2, lambda c: c[0].__setitem__(2, "done")),
    "shape status unhashable": _col(2, lambda c: c[0].__setitem__(2, ["completed"])),
    "shape kind not a string": _col(2, lambda c: c[0].__setitem__(0, 1)),
    "shape name null": _col(2, lambda c: c[0].__setitem__(1, None)),
    "shape attempts true": _col(2, lambda c: c[0].__setitem__(3, True)),
    "shape attempts 1.0": _col(2, lambda c: c[0].__setitem__(3, 1.0)),
    "extra at no op": _col(5, lambda c: c[1].__setitem__(0, 4)),
    "extra at a negative op": _col(5, lambda c: c[0].__setitem__(0, -1)),
    "extras out of order": _col(5, lambda c: c.reverse()),
    "extra twice": _col(5, lambda c: c.append(list(c[-1]))),
    "extra index true": _col(5, lambda c: c[0].__setitem__(0, True)),
    "extra error a string": _col(5, lambda c: c[1].__setitem__(1, "boom")),
    "extra annotations a list": _col(5, lambda c: c[0].__setitem__(2, [1])),
    "extra of nothing": _col(5, lambda c: c[0].__setitem__(2, None)),
    "extra two long": _col(5, lambda c: c[0].pop()),
    "extras an object": lambda d: d["ops"].__setitem__(5, {}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_COLUMNS))
def test_compact_ops_not_in_the_form_loom_writes_are_refused(case: str) -> None:
    d = _state().to_stored()
    assert d["ops"][1] == [0, 3, 10, 1] and d["ops"][3] == [0, 1, 1, 1, 2, 1, 3, 1]
    HOSTILE_COLUMNS[case](d)
    with pytest.raises(CorruptEventError, match="is unusable"):
        validate_snapshot(Snapshot(EID, 7, d), EID)


def test_a_chain_of_compact_pieces_merges_later_over_earlier() -> None:
    state = _state()
    whole = state.to_stored()["ops"]
    changed = state.copy()
    changed.ops[10] = OpRecord(OpKind.GATE, "Go", OpStatus.RESOLVED, {"payload": 1})
    changed.ops[11] = OpRecord(OpKind.STEP, "u", OpStatus.FAILED, None, {"type": "F"}, 2)
    changed.ops[1] = OpRecord(OpKind.STEP, "t", OpStatus.COMPLETED, 5, None, 3)
    part = changed.to_stored(only_ops=[10, 11, 1])["ops"]
    before = copy.deepcopy([whole, part])
    merged = merge_stored_ops([whole, part])
    assert [whole, part] == before  # the pieces (maybe cached decodes) are never changed
    d = changed.to_dict()
    d["ops"] = merged
    assert state_from_stored(d) == changed
    assert list(state_from_stored(d).ops) == [0, 1, 2, 10, 11]
    # A chain written across an upgrade mixes the object and the compact form.
    objects = state.to_dict()["ops"]
    for pieces in ([objects, part], [whole, changed.to_dict(only_ops=[10, 11, 1])["ops"]]):
        d["ops"] = merge_stored_ops(pieces)
        assert type(d["ops"]) is dict and state_from_stored(d) == changed
    # A malformed piece anywhere in the chain is refused, never merged around.
    bad = copy.deepcopy(part)
    bad[3][0] = 9
    for pieces in ([whole, bad], [bad, whole], [objects, bad]):
        with pytest.raises(ValueError):
            merge_stored_ops(pieces)


async def test_a_hostile_compact_segment_is_ignored(tmp_path: Path) -> None:
    store = loom.SQLiteStore(tmp_path / "loom.db")
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(strict_flow)
    assert await (await rt.start(strict_flow, 5, execution_id=EID)).result() == 20
    truth = replay(await store.read(EID), execution_id=EID)
    seq = truth.last_sequence
    await store.save_snapshot(Snapshot(EID, 1, replay((await store.read(EID))[:2]).to_stored()))
    lie = truth.to_stored(only_ops=[3])
    lie["ops"][1] = [True, 1]  # position true: would alias position 1 if merged
    assert await store.save_snapshot_segment(Snapshot(EID, seq, lie), 1)
    await rt.close()
    store = loom.SQLiteStore(tmp_path / "loom.db")
    rt = loom.WorkflowRuntime(store, timers=False)
    rt.register(strict_flow)
    assert await rt.load_state(EID) == truth
    await rt.close()


def test_compact_chains_merge_as_the_object_form_does() -> None:
    rng = random.Random(13)
    for _ in range(200):
        state = ExecutionState(EID, last_sequence=0)
        pieces, objects = [], []
        for _ in range(rng.randint(1, 5)):
            touched = rng.sample(range(12), rng.randint(0, 6))
            for pos in touched:
                state.ops[pos] = OpRecord(
                    rng.choice([OpKind.STEP, OpKind.GATE, "ext.k"]),
                    rng.choice("ab"),
                    rng.choice(list(OpStatus)),
                    rng.choice([None, 1, {"v": pos}]),
                    rng.choice([None, None, {"type": "E"}]),
                    rng.randint(0, 2),
                    rng.choice([None, None, {"tokens": 1}]),
                )
            pieces.append(state.to_stored(only_ops=touched)["ops"])
            objects.append(state.to_dict(only_ops=touched)["ops"])
        d = state.to_dict()
        d["ops"] = merge_stored_ops(objects)
        expected = state_from_stored(d)
        d["ops"] = merge_stored_ops(pieces)
        assert type(d["ops"]) is list
        got = state_from_stored(d)
        assert got == expected and list(got.ops) == list(expected.ops)
