"""Op records read lazily from a snapshot's columns (#13.3): a loaded state's ``ops`` builds
each record on first access, and must show exactly what the dict of eagerly built records
shows, through every operation, however the columns were chained."""

from __future__ import annotations

import random
from typing import Any

import pytest

from loom.model import ExecutionState, ExecutionStatus, OpKind, OpRecord, OpStatus
from loom.model._state import LazyOps, merge_stored_ops, state_from_stored

EID = "lazy"
NAMES = ("a", "b", "Go", "sleep")
KINDS = (OpKind.STEP, OpKind.GATE, OpKind.TIMER, OpKind.DECISION, OpKind.UI, "ext.k")


def _record(rng: random.Random, pos: int) -> OpRecord:
    return OpRecord(
        rng.choice(KINDS),
        rng.choice(NAMES),
        rng.choice(list(OpStatus)),
        rng.choice([None, pos, {"v": pos}, [pos, "x"], "out"]),
        rng.choice([None, None, None, {"type": "E", "at": pos}]),
        rng.randint(0, 3),
        rng.choice([None, None, None, {"tokens": pos}]),
    )


def _state(ops: dict[int, OpRecord]) -> ExecutionState:
    return ExecutionState(
        EID,
        flow_id="f",
        flow_version="1",
        status=ExecutionStatus.RUNNING,
        last_sequence=len(ops),
        ops=ops,
        ui={"k": 1},
    )


def _chain(rng: random.Random) -> tuple[ExecutionState, ExecutionState]:
    """(eager, lazy): one state, its ops built eagerly from the object form and lazily from
    a chain of compact pieces (a whole snapshot, then segments, later ops replacing earlier
    ones at the same position, positions out of order and with gaps)."""
    state = _state({})
    pieces, objects = [], []
    width = rng.choice([3, 12, 40])
    flow_like = rng.random() < 0.4
    for k in range(rng.randint(1, 6)):
        if flow_like:  # each segment adds the next positions, as a flow's snapshots do
            touched = list(range(k * 7, k * 7 + rng.randint(1, 7)))
        else:
            touched = rng.sample(range(width), rng.randint(0, width))
            if rng.random() < 0.5:
                touched.sort()  # runs of consecutive positions
        for pos in touched:
            state.ops[pos] = _record(rng, pos)
        pieces.append(state.to_stored(only_ops=touched)["ops"])
        objects.append(state.to_dict(only_ops=touched)["ops"])
    d = state.to_dict()
    d["ops"] = merge_stored_ops(objects)
    eager = state_from_stored(d)
    d["ops"] = merge_stored_ops(pieces)
    lazy = state_from_stored(d)
    assert type(eager.ops) is dict and type(lazy.ops) is LazyOps
    return eager, lazy


def _same(eager: ExecutionState, lazy: ExecutionState, probe: range, rng: random.Random) -> None:
    """Compared position by position, reading some positions only (so that others stay
    unbuilt for what comes next), and as whole states on a copy (that builds every record)."""
    e, z = eager.ops, lazy.ops
    assert list(z) == list(e) and len(z) == len(e)
    for pos in rng.sample(probe, len(probe) // 3):
        assert (pos in z) == (pos in e)
        assert z.get(pos) == e.get(pos)
        assert z.get(pos, "none") == e.get(pos, "none")  # type: ignore[arg-type]
        if pos in e:
            assert z[pos] == e[pos] and z[pos] is z[pos]  # built once, then the same object
        else:
            with pytest.raises(KeyError):
                z[pos]
    assert lazy.copy() == eager


def _step_output(ops: dict[int, OpRecord], pos: int, name: str) -> Any:
    op = ops.get(pos)
    if (
        op is not None
        and op.status is OpStatus.COMPLETED
        and op.kind == OpKind.STEP
        and op.name == name
    ):
        return op.output
    return "not replayed"


def test_lazily_loaded_ops_equal_the_eager_ones_through_any_use() -> None:
    """A model check: the same random operations on the eager dict and the lazy ops, compared
    after each one (reads, replay lookups, in-place changes, new and replaced positions,
    deletions, copies, the views that build everything)."""
    for seed in range(300):
        rng = random.Random(seed)
        eager, lazy = _chain(rng)
        e, z = eager.ops, lazy.ops
        assert isinstance(z, LazyOps)
        probe = range(-1, 45)
        for pos in probe:  # before any record is built: from the columns alone
            for name in NAMES:
                assert z.step_output(pos, name, "not replayed") == _step_output(e, pos, name)
        _same(eager, lazy, probe, rng)
        for _ in range(rng.randint(0, 12)):
            pos = rng.randrange(-1, 45)
            action = rng.randrange(8)
            if action == 0 and pos in e:  # an in-place change, as the fold makes
                e[pos].status = z[pos].status = OpStatus.RESOLVED
                e[pos].output = z[pos].output = {"payload": pos}
            elif action == 1:  # a new or a replaced record
                rec = _record(rng, pos)
                e[pos] = rec
                z[pos] = OpRecord(
                    rec.kind, rec.name, rec.status, rec.output, rec.error, rec.attempts
                )
                z[pos].annotations = rec.annotations
            elif action == 2 and pos in e:
                del e[pos]
                del z[pos]
            elif action == 3:  # a copy is independent of its original
                copy = lazy.copy()
                assert copy.copy() == eager and list(copy.ops) == list(e)
                if pos in copy.ops:
                    copy.ops[pos].attempts = 99
                    assert z[pos].attempts == e[pos].attempts != 99
                copy.ops[99] = _record(rng, 99)
                assert 99 not in z and len(z) == len(e)
            elif action == 4:
                assert list(z.values()) == list(e.values())
                assert list(z.items()) == list(e.items())
            elif action == 5:
                assert lazy.to_stored() == eager.to_stored()
                assert lazy.to_dict(only_ops=[p for p in e if p % 2]) == eager.to_dict(
                    only_ops=[p for p in e if p % 2]
                )
            elif action == 6:
                assert z.copy() == e.copy() and type(z.copy()) is dict
            else:
                for name in NAMES:
                    assert z.step_output(pos, name, "not replayed") == _step_output(e, pos, name)
            _same(eager, lazy, probe, rng)


def test_a_dict_key_that_equals_a_position_finds_it() -> None:
    ops = LazyOps(
        _state(
            {i: OpRecord(OpKind.STEP, "a", OpStatus.COMPLETED, i) for i in range(3)}
        ).to_stored()["ops"]
    )
    eager = {i: OpRecord(OpKind.STEP, "a", OpStatus.COMPLETED, i) for i in range(3)}
    for key in (1.0, True, 2.5, "1", None):
        assert (key in ops) == (key in eager)
        assert ops.get(key) == eager.get(key)  # type: ignore[call-overload]


def test_changed_positions_are_exactly_what_differs_from_the_columns() -> None:
    rng = random.Random(7)
    for _ in range(100):
        eager, lazy = _chain(rng)
        z = lazy.ops
        assert isinstance(z, LazyOps)
        stored = {
            p: (op.kind, op.name, op.status, op.attempts, op.output, op.error, op.annotations)
            for p, op in eager.ops.items()
        }
        for pos in rng.sample(range(45), 10):
            if pos in z and rng.random() < 0.3:
                z[pos]  # read only: unchanged
            elif pos in z and rng.random() < 0.5:
                z[pos].attempts += 1
            elif pos in z and rng.random() < 0.5:
                z[pos].output = {"changed": pos}  # the output alone, as a layer's reducer may
            elif rng.random() < 0.5:
                z[pos] = _record(rng, pos)
        changed = {
            p
            for p in z._ops
            if p not in stored
            or stored[p]
            != (
                z[p].kind,
                z[p].name,
                z[p].status,
                z[p].attempts,
                z[p].output,
                z[p].error,
                z[p].annotations,
            )
        }
        in_order = [p for p in z if p in changed]
        assert z.changed_positions() == in_order
        z.values()  # every record built: each is compared with its column
        assert z.changed_positions() == in_order
        if stored:
            del z[next(iter(stored))]
            assert z.changed_positions() is None  # a segment cannot remove an op
