"""ExecutionSummary: the one-row digest of an execution that the stores' index keeps.

The index answers "which executions are suspended on flow X" without folding any log. It is
derived from the log by one pure function, :func:`summarize`, and written by the store in the
same transaction as the append that changes it. Only the events that move the summary write it
(start, suspend, resume or timer fired, recovery, fork, the terminal events): a plain step
append leaves the index untouched, so a step stays one row written.

:func:`summary_change` is the part that depends on the batch alone; stores that cannot read the
previous row cheaply inside their write apply it as an upsert (a start sets every field, later
changes set status, waiting-for, forked-from and the times), which is :func:`summarize` with the
previous row read by the database.

Conventions of the payloads read here (the only fields the index looks at):
  * ``EXECUTION_STARTED``: ``flow_id``, ``flow_version``, and a child execution's parent as
    ``parent_id`` or as ``metadata["loom.parent_id"]`` (optional);
  * ``EXECUTION_SUSPENDED``: ``event_type`` (what a gate waits for) or ``timer: true`` (a durable
    sleep: ``waiting_for`` is ``"loom.timer"``);
  * ``EXECUTION_FORKED``: ``parent_id`` (or ``execution_id``) names the execution forked from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from loom.model._events import Envelope, EventType, ExecutionStatus

__all__ = ["TIMER_WAIT", "ExecutionSummary", "SummaryChange", "summarize", "summary_change"]

#: ``waiting_for`` of an execution suspended in a durable sleep.
TIMER_WAIT = "loom.timer"


@dataclass(frozen=True, slots=True)
class ExecutionSummary:
    """What the index knows about one execution.

    ``cursor`` is the position of the summary's last change in the store's global change feed
    (0 before a store assigned one): strictly increasing in commit order across the store.
    ``updated_at`` is the time of the last event that changed the summary (a step does not).
    """

    execution_id: str
    flow_id: str
    flow_version: str
    status: ExecutionStatus
    waiting_for: str | None
    parent_id: str | None
    forked_from: str | None
    created_at: float
    updated_at: float
    cursor: int = 0

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict (the CLI's and the console's wire shape)."""
        return {
            "execution_id": self.execution_id,
            "flow_id": self.flow_id,
            "flow_version": self.flow_version,
            "status": self.status.value,
            "waiting_for": self.waiting_for,
            "parent_id": self.parent_id,
            "forked_from": self.forked_from,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "cursor": self.cursor,
        }


@dataclass(frozen=True, slots=True)
class SummaryChange:
    """What one append batch changes in a summary (see :func:`summary_change`).

    ``started`` is set when the batch holds ``EXECUTION_STARTED``: then ``flow_id``,
    ``flow_version``, ``parent_id`` and ``created_at`` are the execution's. ``status`` (with
    ``waiting_for``) is None when the batch does not move it (only a fork record).
    ``forked_from`` is set only by ``EXECUTION_FORKED`` (otherwise the previous value stands).
    """

    execution_id: str
    status: ExecutionStatus | None
    waiting_for: str | None
    updated_at: float
    started: bool = False
    flow_id: str = ""
    flow_version: str = ""
    parent_id: str | None = None
    created_at: float = 0.0
    forked_from: str | None = None

    def apply(self, prev: ExecutionSummary | None) -> ExecutionSummary:
        """The summary after this change (``prev``: the one before, None if none)."""
        if prev is None or self.started:
            base = ExecutionSummary(
                self.execution_id,
                self.flow_id,
                self.flow_version,
                self.status or ExecutionStatus.PENDING,
                self.waiting_for,
                self.parent_id,
                self.forked_from,
                self.created_at if self.started else self.updated_at,
                self.updated_at,
            )
            if prev is not None and base.forked_from is None:
                base = replace(base, forked_from=prev.forked_from)
            return base
        if self.status is None:
            return replace(
                prev,
                forked_from=self.forked_from or prev.forked_from,
                updated_at=self.updated_at,
            )
        return replace(
            prev,
            status=self.status,
            waiting_for=self.waiting_for,
            forked_from=self.forked_from if self.forked_from is not None else prev.forked_from,
            updated_at=self.updated_at,
        )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _parent_of(started: Mapping[str, Any]) -> str | None:
    """A child execution's parent: ``parent_id`` in the start payload, or ``loom.parent_id`` in
    its metadata (where a layer that cannot extend the payload puts it)."""
    metadata = started.get("metadata")
    nested = metadata.get("loom.parent_id") if isinstance(metadata, Mapping) else None
    return _text(started.get("parent_id")) or _text(nested)


_TERMINAL = {
    EventType.EXECUTION_COMPLETED.value: ExecutionStatus.COMPLETED,
    EventType.EXECUTION_FAILED.value: ExecutionStatus.FAILED,
    EventType.EXECUTION_CANCELLED.value: ExecutionStatus.CANCELLED,
}
_RUNNING_AGAIN = frozenset(
    {
        EventType.EXECUTION_RESUMED.value,
        EventType.TIMER_FIRED.value,
        EventType.EXECUTION_RECOVERED.value,
    }
)
#: Every event type that moves a summary; the back-fill reads only these from old logs.
SUMMARY_EVENT_TYPES = frozenset(
    {
        EventType.EXECUTION_STARTED.value,
        EventType.EXECUTION_SUSPENDED.value,
        EventType.EXECUTION_FORKED.value,
        *_RUNNING_AGAIN,
        *_TERMINAL,
    }
)


def summary_change(batch: Sequence[Envelope]) -> SummaryChange | None:
    """What ``batch`` (one execution's envelopes, in order) changes in its summary, or None.

    Pure; status follows the fold (``apply_event``) exactly, so a summary built from a whole
    log has the status ``replay`` gives.
    """
    # Fields gathered in locals and the change built once: dataclasses.replace costs ~20 µs a
    # call, and a start or a wake batch would pay it twice per record.
    found = False
    execution_id = ""
    status: ExecutionStatus | None = None
    waiting_for: str | None = None
    updated_at = 0.0
    started = False
    flow_id = flow_version = ""
    parent_id: str | None = None
    created_at = 0.0
    forked_from: str | None = None
    for env in batch:
        t = env.type  # a str (EventType members are str): compared by value
        if t not in SUMMARY_EVENT_TYPES:
            continue
        p = env.payload
        at = env.recorded_at
        if not found:
            found, execution_id = True, env.execution_id
        if t == EventType.EXECUTION_STARTED.value:
            status, waiting_for, started = ExecutionStatus.RUNNING, None, True
            flow_id = str(p.get("flow_id", ""))
            flow_version = str(p.get("flow_version", ""))
            parent_id = _parent_of(p)
            created_at = at
        elif t == EventType.EXECUTION_SUSPENDED.value:
            status = ExecutionStatus.SUSPENDED
            waiting_for = TIMER_WAIT if p.get("timer") else str(p.get("event_type", ""))
        elif t in _RUNNING_AGAIN:
            status, waiting_for = ExecutionStatus.RUNNING, None
        elif t == EventType.EXECUTION_FORKED.value:
            forked_from = _text(p.get("parent_id")) or _text(p.get("execution_id"))
        else:
            status, waiting_for = _TERMINAL[t], None
        updated_at = at
    if not found:
        return None
    return SummaryChange(
        execution_id,
        status,
        waiting_for,
        updated_at,
        started,
        flow_id,
        flow_version,
        parent_id,
        created_at,
        forked_from,
    )


def summarize(prev: ExecutionSummary | None, batch: Sequence[Envelope]) -> ExecutionSummary | None:
    """The summary after appending ``batch`` onto an execution summarized as ``prev``.

    None when the batch changes nothing (a plain step append): the store writes no index row.
    The returned summary keeps ``prev``'s cursor; the store assigns the new one.
    """
    change = summary_change(batch)
    if change is None:
        return None
    new = change.apply(prev)
    return new if prev is None else replace(new, cursor=prev.cursor)
