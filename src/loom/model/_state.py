"""ExecutionState: what the fold of one execution's log says (no I/O)."""

from __future__ import annotations

import copy
import enum
from bisect import bisect_right
from collections.abc import ItemsView, Iterable, Iterator, KeysView, MutableMapping, ValuesView
from dataclasses import dataclass, field
from itertools import accumulate, chain, repeat
from operator import add
from typing import Any, TypeVar, overload

from loom.model._events import TERMINAL_STATUSES, ExecutionStatus

__all__ = [
    "ExecutionState",
    "Gate",
    "LazyOps",
    "OpKind",
    "OpRecord",
    "OpStatus",
    "WaitOutcome",
]


class OpKind(enum.StrEnum):
    """What kind of operation the log records at a position.

    Replay compares ``(kind, name)`` with what the code asks for at each position. An
    extension's reducer may record its own kinds (a namespaced string) next to these.
    """

    STEP = "step"
    GATE = "gate"
    TIMER = "timer"
    DECISION = "decision"
    UI = "ui"


class OpStatus(enum.StrEnum):
    """Where an operation stands: a step is ``started``, ``retrying``, ``completed`` or
    ``failed`` (for good); a gate or sleep is ``scheduled``, ``waiting`` then ``resolved``;
    decisions and UI patches are ``completed`` when recorded."""

    STARTED = "started"
    RETRYING = "retrying"
    COMPLETED = "completed"
    FAILED = "failed"
    SCHEDULED = "scheduled"
    WAITING = "waiting"
    RESOLVED = "resolved"


class WaitOutcome(enum.StrEnum):
    """How a resolved wait ended: a gate ``decided`` or ``timed_out``; a sleep ``elapsed``."""

    DECIDED = "decided"
    TIMED_OUT = "timed_out"
    ELAPSED = "elapsed"


def _status(value: Any) -> OpStatus:
    # The member map first: ``OpStatus(value)`` costs ~1.5 µs a call, a 10k-op load 15 ms.
    status = OpStatus._value2member_map_.get(value) if isinstance(value, str) else None
    return status if status is not None else OpStatus(value)  # type: ignore[return-value]


def _kind(value: str) -> str:
    return OpKind._value2member_map_.get(value, value)  # type: ignore[return-value]


@dataclass(slots=True)
class OpRecord:
    """What the log holds for one position of the flow: a step, gate, decision, UI patch or timer.

    ``kind`` (an :class:`OpKind` for Loom's own operations) and ``name`` are what replay
    compares against the code; ``status`` is an :class:`OpStatus`. A resolved wait's ``output``
    is ``{"payload": ..., "timed_out": ...}``; read how it ended from :attr:`outcome`.
    """

    kind: str
    name: str
    status: OpStatus
    output: Any = None
    error: dict[str, Any] | None = None
    attempts: int = 0
    #: What step interceptors attached to the completed attempt (tokens, cost), if anything.
    annotations: dict[str, Any] | None = None

    def resolve(self, payload: Any, *, timed_out: bool = False, **extra: Any) -> None:
        """End this wait: the one place that writes a resolved wait's stored ``output``
        shape (snapshots and golden logs hold it; :attr:`outcome` reads it back)."""
        self.status = OpStatus.RESOLVED
        self.output = {"payload": payload, "timed_out": timed_out, **extra}

    @property
    def outcome(self) -> WaitOutcome | None:
        """How this wait ended, or None for an operation that is not a resolved wait."""
        if self.status is not OpStatus.RESOLVED:
            return None
        if isinstance(self.output, dict) and self.output.get("timed_out"):
            return WaitOutcome.TIMED_OUT
        return WaitOutcome.ELAPSED if self.kind == OpKind.TIMER else WaitOutcome.DECIDED

    def to_dict(self) -> dict[str, Any]:
        d = {
            "kind": str(self.kind),
            "name": self.name,
            "status": self.status.value,
            "output": self.output,
            "error": self.error,
            "attempts": self.attempts,
        }
        if self.annotations is not None:  # absent otherwise: snapshots keep their old shape
            d["annotations"] = self.annotations
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpRecord:
        return cls(
            _kind(str(d["kind"])),
            d["name"],
            _status(d["status"]),
            d.get("output"),
            d.get("error"),
            int(d.get("attempts", 0)),
            d.get("annotations"),
        )


@dataclass(slots=True)
class Gate:
    """The durable wait an execution is suspended on (a human gate or a timer)."""

    position: int
    event_type: str
    correlation_key: str | None = None
    timeout_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "event_type": self.event_type,
            "correlation_key": self.correlation_key,
            "timeout_at": self.timeout_at,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Gate:
        return cls(
            int(d["position"]), str(d["event_type"]), d.get("correlation_key"), d.get("timeout_at")
        )


@dataclass(slots=True)
class ExecutionState:
    """Everything the log says about one execution, folded. Runs nothing."""

    execution_id: str
    flow_id: str = ""
    flow_version: str = ""
    input: Any = None
    status: ExecutionStatus = ExecutionStatus.PENDING
    last_sequence: int = -1
    started_at: float | None = None
    updated_at: float | None = None
    #: The op records by position: a dict, or (for a state loaded from a snapshot) a
    #: :class:`LazyOps` that builds each record on first access.
    ops: MutableMapping[int, OpRecord] = field(default_factory=dict)
    waiting: Gate | None = None
    ui: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    error: dict[str, Any] | None = None
    cancel_reason: str | None = None
    recoveries: int = 0
    fence: int = 0
    forked_from: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def completed_steps(self) -> int:
        return sum(
            1
            for op in self.ops.values()
            if op.kind == OpKind.STEP and op.status is OpStatus.COMPLETED
        )

    def copy(self) -> ExecutionState:
        """An independent copy. JSON values are shared: the fold replaces them, never mutates
        them in place, so only the containers and op records need copying."""
        new = copy.copy(self)
        ops = self.ops
        if type(ops) is LazyOps:
            new.ops = ops.clone()
        else:
            new.ops = {
                k: OpRecord(
                    op.kind, op.name, op.status, op.output, op.error, op.attempts, op.annotations
                )
                for k, op in ops.items()
            }
        if self.waiting is not None:
            w = self.waiting
            new.waiting = Gate(w.position, w.event_type, w.correlation_key, w.timeout_at)
        new.ui = dict(self.ui)
        new.metadata = dict(self.metadata)
        return new

    def to_dict(self, *, only_ops: Iterable[int] | None = None) -> dict[str, Any]:
        """The state as JSON-ready dicts; ``only_ops`` limits ``ops`` to those positions."""
        ops = self.ops
        picked = ops.items() if only_ops is None else ((k, ops[k]) for k in only_ops)
        return self._fields({str(k): v.to_dict() for k, v in picked})

    def to_stored(self, *, only_ops: Iterable[int] | None = None) -> dict[str, Any]:
        """What a snapshot stores: :meth:`to_dict` with ``ops`` in the compact column form
        (see :func:`ops_to_stored`); ``only_ops`` limits ``ops`` to those positions (a
        snapshot segment's part). :func:`state_from_stored` reads both forms."""
        ops = self.ops
        picked = ops.items() if only_ops is None else [(k, ops[k]) for k in only_ops]
        return self._fields(ops_to_stored(picked))

    def _fields(self, ops: Any) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "flow_id": self.flow_id,
            "flow_version": self.flow_version,
            "input": self.input,
            "status": self.status.value,
            "last_sequence": self.last_sequence,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "ops": ops,
            "waiting": self.waiting.to_dict() if self.waiting else None,
            "ui": self.ui,
            "output": self.output,
            "error": self.error,
            "cancel_reason": self.cancel_reason,
            "recoveries": self.recoveries,
            "fence": self.fence,
            "forked_from": self.forked_from,
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExecutionState:
        waiting = d.get("waiting")
        return cls(
            execution_id=d["execution_id"],
            flow_id=d.get("flow_id", ""),
            flow_version=d.get("flow_version", ""),
            input=d.get("input"),
            status=ExecutionStatus(d.get("status", "pending")),
            last_sequence=int(d.get("last_sequence", -1)),
            started_at=d.get("started_at"),
            updated_at=d.get("updated_at"),
            ops={int(k): OpRecord.from_dict(v) for k, v in (d.get("ops") or {}).items()},
            waiting=Gate.from_dict(waiting) if waiting else None,
            ui=dict(d.get("ui") or {}),
            output=d.get("output"),
            error=d.get("error"),
            cancel_reason=d.get("cancel_reason"),
            recoveries=int(d.get("recoveries", 0)),
            fence=int(d.get("fence", 0)),
            forked_from=d.get("forked_from"),
            metadata=dict(d.get("metadata") or {}),
        )


_STATE_KEYS = frozenset(ExecutionState("").to_dict())
_OP_KEYS = frozenset(OpRecord("", "", OpStatus.STARTED).to_dict())
_OP_KEYS_ANNOTATED = _OP_KEYS | {"annotations"}
_GATE_KEYS = frozenset(Gate(0, "").to_dict())
_NUMBER = (int, float)


def state_from_stored(d: Any) -> ExecutionState:
    """The state ``d`` describes if it is exactly a dict :meth:`ExecutionState.to_dict` could
    have written, else ValueError saying what is off.

    One pass that checks every field while it builds the op records: what a round trip
    (``from_dict(d).to_dict() == d``) proved, at a third of its cost on a 10,000-op
    snapshot, and stricter where equality was loose (``1.0`` or ``true`` for an integer).
    Nothing of ``d`` is changed; its containers are copied, its JSON values shared.
    """
    if type(d) is not dict:
        raise ValueError("it is not an object")
    if d.keys() != _STATE_KEYS:
        raise ValueError(f"its fields are {sorted(map(str, d))}")
    for key in ("execution_id", "flow_id", "flow_version"):
        if not isinstance(d[key], str):
            raise ValueError(f"{key!r} is not a string")
    for key in ("last_sequence", "recoveries", "fence"):
        if type(d[key]) is not int:
            raise ValueError(f"{key!r} is not an integer")
    for key in ("started_at", "updated_at"):
        v = d[key]
        if v is not None and (type(v) is bool or not isinstance(v, _NUMBER)):
            raise ValueError(f"{key!r} is not a number")
    for key in ("error", "forked_from"):
        if d[key] is not None and type(d[key]) is not dict:
            raise ValueError(f"{key!r} is not an object")
    if type(d["ops"]) is not dict and type(d["ops"]) is not list:
        raise ValueError("'ops' is not an object or columns")
    for key in ("ui", "metadata"):
        if type(d[key]) is not dict:
            raise ValueError(f"{key!r} is not an object")
    if d["cancel_reason"] is not None and not isinstance(d["cancel_reason"], str):
        raise ValueError("'cancel_reason' is not a string")
    raw_status = d["status"]
    status = (
        ExecutionStatus._value2member_map_.get(raw_status) if isinstance(raw_status, str) else None
    )
    if status is None:
        raise ValueError(f"status {raw_status!r} is not an execution status")
    waiting = d["waiting"]
    gate = None
    if waiting is not None:
        if type(waiting) is not dict or waiting.keys() != _GATE_KEYS:
            raise ValueError("'waiting' is malformed")
        position, event_type = waiting["position"], waiting["event_type"]
        key, timeout_at = waiting["correlation_key"], waiting["timeout_at"]
        if (
            type(position) is not int
            or not isinstance(event_type, str)
            or (key is not None and not isinstance(key, str))
            or (
                timeout_at is not None
                and (type(timeout_at) is bool or not isinstance(timeout_at, _NUMBER))
            )
        ):
            raise ValueError("'waiting' is malformed")
        gate = Gate(position, event_type, key, timeout_at)
    return ExecutionState(
        execution_id=d["execution_id"],
        flow_id=d["flow_id"],
        flow_version=d["flow_version"],
        input=d["input"],
        status=status,  # type: ignore[arg-type]
        last_sequence=d["last_sequence"],
        started_at=d["started_at"],
        updated_at=d["updated_at"],
        ops=_ops_from_stored(d["ops"]) if type(d["ops"]) is dict else _ops_from_columns(d["ops"]),
        waiting=gate,
        ui=dict(d["ui"]),
        output=d["output"],
        error=d["error"],
        cancel_reason=d["cancel_reason"],
        recoveries=d["recoveries"],
        fence=d["fence"],
        forked_from=d["forked_from"],
        metadata=dict(d["metadata"]),
    )


def _ops_from_stored(raw: dict[Any, Any]) -> dict[int, OpRecord]:
    if not _canonical_positions(raw):
        # Only the form str(position) writes: "01" or " 1" would alias another position.
        raise ValueError("an op position is not a canonical integer")
    kinds, statuses = OpKind._value2member_map_, OpStatus._value2member_map_
    records: list[OpRecord] = []
    append = records.append
    try:
        # Six (or seven) distinct keys read and no more in the dict: exactly the fields
        # OpRecord.to_dict writes, without comparing key sets (a third of the time here).
        for op in raw.values():
            if type(op) is not dict:
                raise ValueError("an op record is not an object")
            size = len(op)
            kind, name, error, attempts = op["kind"], op["name"], op["error"], op["attempts"]
            member = statuses.get(op["status"])  # TypeError for an unhashable status
            output = op["output"]
            if size == 6:
                annotations = None
            elif size == 7 and type(op["annotations"]) is dict:
                annotations = op["annotations"]
            else:
                raise ValueError("an op record's fields are malformed")
            if (
                member is None
                or type(attempts) is not int
                or not isinstance(kind, str)
                or not isinstance(name, str)
                or (error is not None and type(error) is not dict)
            ):
                raise ValueError("an op record is malformed")
            append(
                OpRecord(
                    kinds.get(kind, kind),  # type: ignore[arg-type]
                    name,
                    member,  # type: ignore[arg-type]
                    output,
                    error,
                    attempts,
                    annotations,
                )
            )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"an op record is malformed ({exc!r})") from exc
    return dict(zip(map(int, raw), records, strict=True))


def _canonical_positions(raw: dict[Any, Any]) -> bool:
    """Every key is a decimal integer >= 0 as str() writes it: ASCII digits, no sign, space or
    underscore, no leading zero. Whole-string checks in C, not one int()/str() per key."""
    if not raw:
        return True
    try:
        joined = ",".join(raw)
    except TypeError:  # a key that is not a string
        return False
    if not (joined.isascii() and joined.replace(",", "").isdigit() and ",," not in joined):
        return False
    if joined.startswith(",") or joined.endswith(","):
        return False
    return ("," + joined).count(",0") == ("0" in raw)


# ----------------------------------------------------------------- the compact ops form
#
# ``[2, position_runs, shapes, shape_runs, outputs, extras]``, for n ops in stored order:
#
# * ``position_runs``: ``[start, length, start, length, ...]``, the ops' positions as runs of
#   consecutive integers (a flow's positions mostly are one run);
# * ``shapes``: the distinct ``[kind, name, status, attempts]`` of the ops;
# * ``shape_runs``: ``[shape index, count, ...]``, each op's shape as runs;
# * ``outputs``: the n outputs;
# * ``extras``: ``[op index, error, annotations]`` for the few ops that have either.
#
# One object per op with six repeated keys made a 10,000-step snapshot ~1 MB whose decoding
# and per-op checking cost more than the rest of a load; here only the outputs are per op, and
# the frame is checked on the short run lists. The leading 2 is the form's version: the object
# form (``to_dict``'s) stays readable.

OPS_COLUMNS = 2


def ops_to_stored(picked: Iterable[tuple[int, OpRecord]]) -> list[Any]:
    """The compact column form of ``(position, op)`` pairs (see above)."""
    shapes: dict[tuple[str, str, str, int], int] = {}
    position_runs: list[int] = []
    shape_runs: list[int] = []
    outputs: list[Any] = []
    extras: list[list[Any]] = []
    next_pos = last_shape = -1
    for i, (pos, op) in enumerate(picked):
        key = (str(op.kind), op.name, str(op.status), op.attempts)  # (str(): no enum property)
        index = shapes.get(key)
        if index is None:
            index = shapes[key] = len(shapes)
        if pos == next_pos:
            position_runs[-1] += 1
        else:
            position_runs += (pos, 1)
        next_pos = pos + 1
        if index == last_shape:
            shape_runs[-1] += 1
        else:
            shape_runs += (index, 1)
            last_shape = index
        outputs.append(op.output)
        if op.error is not None or op.annotations is not None:
            extras.append([i, op.error, op.annotations])
    return [OPS_COLUMNS, position_runs, [list(k) for k in shapes], shape_runs, outputs, extras]


def _ints_in(values: list[Any], low: int, high: int | None) -> bool:
    """Every value is an int (not a bool or float) in ``low .. high-1``; checks in C."""
    if not values:
        return True
    if not set(map(type, values)) <= {int}:
        return False
    return min(values) >= low and (high is None or max(values) < high)


def _runs(runs: Any, n: int, high: int | None, what: str) -> tuple[list[int], list[int]]:
    """The (values, counts) of a run list covering exactly ``n`` ops, or ValueError."""
    if type(runs) is not list or len(runs) % 2:
        raise ValueError(f"the op {what} runs are malformed")
    values, counts = runs[0::2], runs[1::2]
    if not (_ints_in(values, 0, high) and _ints_in(counts, 1, None)):
        raise ValueError(f"an op {what} run is malformed")
    if sum(counts) != n:  # before anything is expanded: a run cannot claim a billion ops
        raise ValueError(f"the op {what} runs do not cover the ops")
    return values, counts


def _positions_distinct(starts: list[int], lengths: list[int]) -> bool:
    spans = sorted(zip(starts, lengths, strict=True))
    end = 0
    for start, length in spans:
        if start < end:
            return False
        end = start + length
    return True


_Frame = tuple[list[int], list[int], list[Any], list[int], list[int], list[Any], list[Any]]


def _frame(raw: Any) -> _Frame:
    """The parts of one compact ops piece, or ValueError if its frame is off: run lists that
    are not integers, do not cover the ops or repeat a position, a shape index out of range,
    extras not at distinct ops in order. Shapes' and extras' contents are checked where the op
    records are built."""
    if type(raw) is not list or len(raw) != 6 or type(raw[0]) is not int:
        raise ValueError("'ops' columns are malformed")
    if raw[0] != OPS_COLUMNS:
        raise ValueError(f"'ops' columns are of an unknown form {raw[0]!r}")
    _, position_runs, shapes, shape_runs, outputs, extras = raw
    if type(shapes) is not list or type(outputs) is not list or type(extras) is not list:
        raise ValueError("an 'ops' column is not a list")
    n = len(outputs)
    starts, lengths = _runs(position_runs, n, None, "position")
    if not _positions_distinct(starts, lengths):
        # Integers only (true or 1.0 would alias 1), none negative, none twice.
        raise ValueError("an op position is repeated")
    shape_of, counts = _runs(shape_runs, n, len(shapes), "shape")
    last = -1
    for extra in extras:
        if type(extra) is not list or len(extra) != 3:
            raise ValueError("an op's extra record is malformed")
        i = extra[0]
        if type(i) is not int or not last < i < n:
            raise ValueError("an op's extra record is not at a later op")
        last = i
    return starts, lengths, shapes, shape_of, counts, outputs, extras


def _expand(starts: list[int], lengths: list[int]) -> list[int]:
    return list(chain.from_iterable(map(range, starts, map(add, starts, lengths))))


def _joined_runs(starts: list[int], lengths: list[int]) -> tuple[list[int], list[int]]:
    """The same positions, in the same order, with each run that continues the one before
    it joined to it."""
    joined_starts = [starts[0]]
    joined_lengths = [lengths[0]]
    end = starts[0] + lengths[0]
    for start, length in zip(starts[1:], lengths[1:], strict=True):
        if start == end:
            joined_lengths[-1] += length
        else:
            joined_starts.append(start)
            joined_lengths.append(length)
        end = start + length
    return joined_starts, joined_lengths


def _ops_from_columns(raw: Any) -> LazyOps:
    return LazyOps(raw)


_T = TypeVar("_T")
#: What a lookup that finds nothing returns internally (an op record is never it).
_MISSING: Any = object()
_STEP_KIND = OpKind.STEP
_DONE = OpStatus.COMPLETED


class LazyOps(MutableMapping[int, OpRecord]):
    """The op records of a state read from a snapshot's compact columns, each record built
    the first time its position is read (and then kept: the same object on every read, so
    changing it in place sticks, as in a dict).

    Building 10,000 records was most of the cost of loading a long execution, and a recovery
    reads them only to replay: :meth:`step_output` answers replay from the columns without
    building anything. Everything a dict of the same records would show is the same here: the
    positions in the same order (the stored order, then positions added since, in the order
    they were added), ``get``, ``in``, ``len``, ``==``. Reading ``values()`` or ``items()`` (or
    deleting a position) builds every remaining record once and keeps them in a plain dict.

    The columns are checked when this is made (as eagerly as before), and never changed: they
    may be shared with a decoded snapshot, and with copies (:meth:`clone`).
    """

    __slots__ = (
        "_added",
        "_done_names",
        "_extras",
        "_flat",
        "_hi",
        "_lengths",
        "_lo",
        "_n",
        "_ops",
        "_outputs",
        "_positions",
        "_shape_of",
        "_shape_runs",
        "_shapes",
        "_single",
        "_sorted",
        "_starts",
        "stored_as",
    )

    def __init__(self, raw: Any) -> None:
        starts, lengths, shapes, shape_of, counts, outputs, extras = _frame(raw)
        kinds, statuses = OpKind._value2member_map_, OpStatus._value2member_map_
        built: list[tuple[str, str, OpStatus, int]] = []
        for shape in shapes:
            if type(shape) is not list or len(shape) != 4:
                raise ValueError("an op shape is malformed")
            kind, name, status, attempts = shape
            member = statuses.get(status) if isinstance(status, str) else None
            if (
                member is None
                or type(attempts) is not int
                or not isinstance(kind, str)
                or not isinstance(name, str)
            ):
                raise ValueError("an op shape is malformed")
            built.append((kinds.get(kind, kind), name, member, attempts))  # type: ignore[arg-type]
        by_op: dict[int, tuple[dict[str, Any] | None, dict[str, Any] | None]] = {}
        for i, error, notes in extras:
            if (
                (error is not None and type(error) is not dict)
                or (notes is not None and type(notes) is not dict)
                or (error is None and notes is None)
            ):
                raise ValueError("an op's extra record is malformed")
            by_op[i] = (error, notes)
        #: Records built or set: at a stored position (replacing the column's) or a new one.
        self._ops: dict[int, OpRecord] = {}
        #: The positions set that the columns do not hold, in the order they were added.
        self._added: dict[int, None] = {}
        #: True once every record is built and ``_ops`` holds them all in order.
        self._flat = False
        self._n = len(outputs)
        if len(starts) > 1:
            # A merged chain holds a run per piece, mostly each continuing the one before.
            starts, lengths = _joined_runs(starts, lengths)
        self._starts, self._lengths = starts, lengths
        self._shapes = built
        #: Per shape, the step name if it is a completed step (what replay looks for).
        self._done_names = [
            name if status is _DONE and kind == _STEP_KIND else None
            for kind, name, status, _ in built
        ]
        self._shape_runs = (shape_of, counts)
        self._shape_of: list[int] | None = None
        self._outputs = outputs
        self._extras = by_op
        self._positions: list[int] | None = None
        self._lo = min(starts) if starts else 0
        self._hi = max(map(add, starts, lengths)) if starts else 0
        #: One run of positions (the usual case): position - _lo is the column index.
        self._single = len(starts) == 1
        #: (run starts sorted, their ends, their first op index), for many runs only.
        self._sorted: tuple[list[int], list[int], list[int]] | None = None
        #: (execution id, sequence, chain) of the stored snapshot these columns are, when the
        #: store told: a driver extends that chain with what changed since (see
        #: :meth:`changed_positions`). Copies keep it; the driver checks the id and sequence.
        self.stored_as: tuple[str, int, tuple[int, int]] | None = None

    # -------------------------------------------------------------- the columns

    def _index(self, key: object) -> int:
        """The column index of position ``key``, or -1 if the columns do not hold it."""
        if type(key) is int:
            pos = key
        elif isinstance(key, int) or (isinstance(key, float) and key.is_integer()):
            pos = int(key)  # what a dict finds for 1.0 or True: position 1
        else:
            return -1
        if self._flat or not self._lo <= pos < self._hi:
            return -1
        starts = self._starts
        if len(starts) == 1:
            return pos - self._lo
        runs = self._sorted
        if runs is None:
            runs = self._sorted = self._sort_runs()
        j = bisect_right(runs[0], pos) - 1
        if j < 0 or pos >= runs[1][j]:
            return -1
        return runs[2][j] + pos - runs[0][j]

    def _sort_runs(self) -> tuple[list[int], list[int], list[int]]:
        starts, lengths = self._starts, self._lengths
        firsts = [0, *accumulate(lengths)][:-1]
        order = sorted(range(len(starts)), key=starts.__getitem__)
        return (
            [starts[j] for j in order],
            [starts[j] + lengths[j] for j in order],
            [firsts[j] for j in order],
        )

    def _shape_indexes(self) -> list[int]:
        shape_of = self._shape_of
        if shape_of is None:
            values, counts = self._shape_runs
            shape_of = self._shape_of = list(chain.from_iterable(map(repeat, values, counts)))
        return shape_of

    def _stored_positions(self) -> list[int]:
        positions = self._positions
        if positions is None:
            positions = self._positions = _expand(self._starts, self._lengths)
        return positions

    def _build(self, pos: int, i: int) -> OpRecord:
        kind, name, status, attempts = self._shapes[self._shape_indexes()[i]]
        error, notes = self._extras.get(i, (None, None))
        op = OpRecord(kind, name, status, self._outputs[i], error, attempts, notes)
        self._ops[self._stored_positions()[i] if type(pos) is not int else pos] = op
        return op

    def _flatten(self) -> dict[int, OpRecord]:
        """Every record built, in a dict in the order a dict of them would have."""
        ops = self._ops
        if self._flat:
            return ops
        shapes, extras = self._shapes, self._extras
        per_op = map(shapes.__getitem__, self._shape_indexes())
        records = [
            OpRecord(kind, name, status, output, None, attempts, None)
            for (kind, name, status, attempts), output in zip(per_op, self._outputs, strict=True)
        ]
        for i, (error, notes) in extras.items():
            record = records[i]
            record.error, record.annotations = error, notes
        flat = dict(zip(self._stored_positions(), records, strict=True))
        flat.update(ops)  # built before (kept: they may have been changed) and added ones
        self._ops = flat
        self._flat = True
        self._single = False
        self._added = {}
        return flat

    # -------------------------------------------------------------- replay

    def step_output(self, pos: int, name: str, default: _T) -> Any | _T:
        """The output of the completed step ``name`` recorded at position ``pos`` (an int),
        else ``default`` (another op, or none): what replay needs of a position, with no
        record built. Once per replayed step of a recovery, so the usual case (one run of
        positions) is inline."""
        op = self._ops.get(pos, _MISSING)
        if op is not _MISSING:
            if op.status is _DONE and op.kind == _STEP_KIND and op.name == name:
                return op.output
            return default
        i = pos - self._lo
        if not (self._single and 0 <= i < self._n):
            i = self._index(pos)
            if i < 0:
                return default
        if self._done_names[(self._shape_of or self._shape_indexes())[i]] == name:
            return self._outputs[i]
        return default

    def changed_positions(self) -> list[int] | None:
        """The positions whose records differ from the columns this was read from (added,
        replaced or changed in place), in this mapping's order; None if a stored position is
        gone (a snapshot segment cannot remove an op). Costs the records built so far, or
        every record once all are built."""
        ops = self._ops
        if self._flat:
            positions = self._stored_positions()
            if len(ops) < len(positions) or not all(map(ops.__contains__, positions)):
                return None
            column = dict(zip(positions, range(self._n), strict=True))
            return [p for p, op in ops.items() if self._differs(op, column.get(p, -1))]
        stored = [(i, p) for p in ops if (i := self._index(p)) >= 0]
        stored.sort()
        changed = [p for i, p in stored if self._differs(ops[p], i)]
        changed += self._added
        return changed

    def _differs(self, op: OpRecord, i: int) -> bool:
        """Whether ``op`` differs from the record at column index ``i`` (-1: none)."""
        if i < 0:
            return True
        shapes, shape_of, output = self._shapes, self._shape_indexes(), self._outputs[i]
        return (
            (op.kind, op.name, op.status, op.attempts) != shapes[shape_of[i]]
            or (op.output is not output and op.output != output)
            or (op.error, op.annotations) != self._extras.get(i, (None, None))
        )

    @property
    def stored_count(self) -> int:
        """How many op records the columns hold."""
        return self._n

    # -------------------------------------------------------------- the mapping

    def __getitem__(self, pos: int) -> OpRecord:
        op = self._ops.get(pos, _MISSING)
        if op is _MISSING:
            i = self._index(pos)
            if i < 0:
                raise KeyError(pos)
            return self._build(pos, i)
        return op  # type: ignore[no-any-return]

    @overload
    def get(self, pos: int, /) -> OpRecord | None: ...
    @overload
    def get(self, pos: int, /, default: OpRecord | _T) -> OpRecord | _T: ...
    def get(self, pos: int, /, default: Any = None) -> Any:
        op = self._ops.get(pos, _MISSING)
        if op is _MISSING:
            i = self._index(pos)
            if i < 0:
                return default
            return self._build(pos, i)
        return op

    def __setitem__(self, pos: int, op: OpRecord) -> None:
        ops = self._ops
        if not self._flat and pos not in ops and self._index(pos) < 0:
            self._added[pos] = None
        ops[pos] = op

    def __delitem__(self, pos: int) -> None:
        del self._flatten()[pos]

    def __contains__(self, pos: object) -> bool:
        return pos in self._ops or self._index(pos) >= 0

    def __len__(self) -> int:
        return len(self._ops) if self._flat else self._n + len(self._added)

    def __iter__(self) -> Iterator[int]:
        if self._flat:
            return iter(self._ops)
        return chain(self._stored_positions(), self._added)

    def keys(self) -> KeysView[int]:
        return self._ops.keys() if self._flat else KeysView(self)

    def values(self) -> ValuesView[OpRecord]:
        return self._flatten().values()

    def items(self) -> ItemsView[int, OpRecord]:
        return self._flatten().items()

    def copy(self) -> dict[int, OpRecord]:
        """A plain dict of the same records (as ``dict.copy``)."""
        return dict(self._flatten())

    def clone(self) -> LazyOps:
        """An independent copy: the columns shared, every record built so far copied."""
        new = LazyOps.__new__(LazyOps)
        for slot in LazyOps.__slots__:
            object.__setattr__(new, slot, getattr(self, slot))
        new._ops = {
            k: OpRecord(
                op.kind, op.name, op.status, op.output, op.error, op.attempts, op.annotations
            )
            for k, op in self._ops.items()
        }
        new._added = dict(self._added)
        return new

    def __repr__(self) -> str:
        return repr(dict(self.items()))


def merge_stored_ops(pieces: list[Any]) -> Any:
    """The ``ops`` of a snapshot chain whose pieces' ``ops`` are ``pieces`` (the whole
    snapshot's first, then each segment's), later pieces' ops replacing earlier ones at the
    same position. ValueError for a piece that is malformed; the pieces are never changed.

    Object pieces merge as objects (any keys: stores keep what they are given); compact
    pieces as columns, in one pass however long the chain; a chain mixing both forms (written
    across an upgrade) as objects.
    """
    if all(type(p) is dict for p in pieces):
        merged: dict[Any, Any] = {}
        for piece in pieces:
            merged.update(piece)
        return merged
    if all(type(p) is list for p in pieces):
        return _merge_columns(pieces)
    merged = {}
    for piece in pieces:
        if type(piece) is dict:
            merged.update(piece)
        elif type(piece) is list:
            merged.update(_columns_as_objects(piece))
        else:
            raise ValueError("'ops' is not an object or columns")
    return merged


def _columns_as_objects(raw: Any) -> dict[str, Any]:
    """A compact piece in the object form, for a chain that mixes forms: every op's fields
    are checked again where the merged state is read."""
    starts, lengths, shapes, shape_of, counts, outputs, extras = _frame(raw)
    at = _expand(starts, lengths)
    per_op = chain.from_iterable(map(repeat, shape_of, counts))
    objects: dict[str, Any] = {}
    for pos, index, output in zip(at, per_op, outputs, strict=True):
        shape = shapes[index]
        if type(shape) is not list or len(shape) != 4:
            raise ValueError("an op shape is malformed")
        objects[str(pos)] = {
            "kind": shape[0],
            "name": shape[1],
            "status": shape[2],
            "output": output,
            "error": None,
            "attempts": shape[3],
        }
    for i, error, notes in extras:
        op = objects[str(at[i])]
        op["error"] = error
        if notes is not None:
            op["annotations"] = notes
    return objects


def _merge_columns(pieces: list[Any]) -> list[Any]:
    starts: list[int] = []
    lengths: list[int] = []
    shapes: list[Any] = []
    shape_runs: list[int] = []
    outputs: list[Any] = []
    extras: list[list[Any]] = []
    for piece in pieces:
        p_starts, p_lengths, p_shapes, p_shape_of, p_counts, p_outputs, p_extras = _frame(piece)
        base, shift = len(outputs), len(shapes)
        starts += p_starts
        lengths += p_lengths
        for index, count in zip(p_shape_of, p_counts, strict=True):
            shape_runs += (index + shift, count)
        shapes += p_shapes
        outputs += p_outputs
        extras += [[i + base, e, a] for i, e, a in p_extras] if base else p_extras
    if _positions_distinct(starts, lengths):  # the usual chain: each segment adds new ops
        position_runs = [v for run in zip(starts, lengths, strict=True) for v in run]
        return [OPS_COLUMNS, position_runs, shapes, shape_runs, outputs, extras]
    # Some ops changed since an earlier piece: a later piece's op replaces the earlier one's.
    at = _expand(starts, lengths)
    shape_of = list(chain.from_iterable(map(repeat, shape_runs[0::2], shape_runs[1::2])))
    latest = dict(zip(at, range(len(at)), strict=True))
    kept = list(latest.values())
    renumber = {old: new for new, old in enumerate(kept)}
    merged_extras = sorted(
        ([renumber[i], e, a] for i, e, a in extras if i in renumber), key=lambda x: x[0]
    )
    return [
        OPS_COLUMNS,
        _runs_of(list(latest), consecutive=True),
        shapes,
        _runs_of([shape_of[i] for i in kept], consecutive=False),
        [outputs[i] for i in kept],
        merged_extras,
    ]


def _runs_of(values: list[int], *, consecutive: bool) -> list[int]:
    """``values`` as ``[value, count, ...]`` runs: of consecutive integers (``start, length``)
    or of repeats (``value, count``)."""
    runs: list[int] = []
    expect: int | None = None
    for value in values:
        if value == expect:
            runs[-1] += 1
        else:
            runs += (value, 1)
        expect = value + 1 if consecutive else value
    return runs
