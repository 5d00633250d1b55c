"""The upgrade check: replay every in-flight execution against new code before deploying it.

A deploy that changes a flow's code under live executions is safe only if every execution that
is still running or suspended replays to its recorded position unchanged. This module replays
each one against the new code without running any effect and reports those that would raise
:class:`NonDeterminismError` after the deploy, with the position and the recorded and the new
operation. ``loom upgrade-check --app module:flows`` is the command; :func:`upgrade_check` is
the same check as a function for a CI step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loom.errors import LoomError, NonDeterminismError
from loom.model import DEFAULT_LIMITS, Envelope, ExecutionState, OpRecord, replay
from loom.runtime import Flow, SystemClock
from loom.runtime._context import SuspendExecution, WorkflowContext
from loom.runtime._driver import Driver
from loom.storage import EventStore, InMemoryStore

__all__ = ["UpgradeIssue", "UpgradeReport", "upgrade_check"]

IN_FLIGHT = ("pending", "running", "suspended")


class _ReachedTheEnd(BaseException):
    """The code reached a position the log does not hold yet: where a live execution would
    continue. A BaseException so that a flow's ``except Exception`` cannot swallow it."""


class _CheckingContext(WorkflowContext):
    """Stops at the first position that would run or record something new, before any effect
    (a step, a decision's computation, a timer, a UI patch): replay only compares."""

    def _take_position(self, kind: str, name: str) -> tuple[int, OpRecord | None]:
        pos, op = super()._take_position(kind, name)
        if op is None or (kind == "step" and op.status not in ("completed", "failed")):
            raise _ReachedTheEnd
        return pos, op


class _NoWrites(InMemoryStore):
    async def append(self, envelopes: Sequence[Envelope]) -> None:
        raise _ReachedTheEnd


@dataclass(frozen=True, slots=True)
class UpgradeIssue:
    """One in-flight execution the new code would not continue.

    ``kind`` is ``non_determinism`` (the code asks for another operation at ``position``),
    ``flow_missing`` (the new code has no flow with this id and version: the execution could
    not run at all), ``error`` (replaying raised another exception) or ``timeout``.
    """

    execution_id: str
    flow_id: str
    flow_version: str
    status: str
    kind: str
    message: str
    position: int | None = None
    recorded: str | None = None
    requested: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "flow_id": self.flow_id,
            "flow_version": self.flow_version,
            "status": self.status,
            "kind": self.kind,
            "message": self.message,
            "position": self.position,
            "recorded": self.recorded,
            "requested": self.requested,
        }


@dataclass(frozen=True, slots=True)
class UpgradeReport:
    """What :func:`upgrade_check` found: ``checked`` in-flight executions, ``issues`` among them."""

    checked: int
    issues: list[UpgradeIssue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.issues

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "issues": [i.to_dict() for i in self.issues],
        }


async def check_execution(
    flow: Flow[Any, Any], envelopes: Sequence[Envelope], *, timeout: float = 10.0
) -> UpgradeIssue | None:
    """Replay one in-flight execution's log against ``flow``; None when it continues cleanly."""
    state = replay(envelopes)
    try:
        async with asyncio.timeout(timeout):
            await _replay(flow, state)
    except NonDeterminismError as exc:
        details = exc.details
        position = details.get("position", details.get("sequence"))
        return _issue(
            state,
            "non_determinism",
            exc.message,
            position=int(position) if position is not None else None,
            recorded=_opt_str(details.get("recorded")),
            requested=_opt_str(details.get("requested")),
        )
    except TimeoutError:
        return _issue(state, "timeout", f"replay did not reach the recorded position in {timeout}s")
    except Exception as exc:
        text = exc.message if isinstance(exc, LoomError) else repr(exc)
        return _issue(state, "error", f"replaying raised {type(exc).__name__}: {text}")
    return None


async def _replay(flow: Flow[Any, Any], state: ExecutionState) -> None:
    driver = Driver(
        _NoWrites(),
        state.copy(),
        state.fence,
        SystemClock(),
        snapshot_every=1 << 30,
        limits=DEFAULT_LIMITS,
        last_snapshot=state.last_sequence,
    )
    ctx = _CheckingContext(driver, flow)
    try:
        if flow.takes_input:
            await flow.fn(ctx, flow.input.load(state.input))
        else:
            await flow.fn(ctx)
    except (_ReachedTheEnd, SuspendExecution):
        return
    # The code returned: it must have walked every position the log holds.
    ctx._check_fully_replayed()


async def _in_flight_ids(store: EventStore) -> AsyncIterator[str]:
    """Ids worth replaying: from the execution index when the store keeps one (only the
    running, pending and suspended ones), else every id (terminal ones are skipped later)."""
    if not callable(getattr(store, "list_executions", None)):
        async for execution_id in store.iterate_execution_ids():
            yield execution_id
        return
    from loom.storage import ExecutionQuery

    index: Any = store
    cursor: str | None = None
    while True:
        page = await index.list_executions(
            ExecutionQuery(statuses=IN_FLIGHT, limit=500, cursor=cursor)
        )
        for summary in page.items:
            yield summary.execution_id
        cursor = page.next_cursor
        if cursor is None:
            return


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _issue(state: ExecutionState, kind: str, message: str, **extra: Any) -> UpgradeIssue:
    return UpgradeIssue(
        state.execution_id,
        state.flow_id,
        state.flow_version,
        state.status.value,
        kind,
        message,
        **extra,
    )


async def upgrade_check(
    store: EventStore,
    flows: Iterable[Flow[Any, Any]],
    *,
    progress: Callable[[int], None] | None = None,
    timeout: float = 10.0,
) -> UpgradeReport:
    """Replay every running or suspended execution in ``store`` against ``flows``.

    Runs no effect and writes nothing. Each execution is replayed against the flow with its id
    and pinned version (the one the runtime would run it with after the deploy); one whose
    version the new code no longer registers is reported as ``flow_missing``. ``progress`` is
    called with the number of executions looked at so far (with an execution index, only
    in-flight ones are looked at; without one, terminal ones are counted and skipped).

    Use it as a CI step before a deploy::

        report = await upgrade_check(SQLiteStore("prod-copy.db"), [my_flow_v2])
        assert report.ok, [i.to_dict() for i in report.issues]
    """
    registered: dict[tuple[str, str], Flow[Any, Any]] = {}
    for flow in flows:
        registered[(flow.id, flow.version)] = flow
    checked = 0
    seen = 0
    issues: list[UpgradeIssue] = []
    async for execution_id in _in_flight_ids(store):
        envelopes = await store.read(execution_id)
        seen += 1
        if progress is not None:
            progress(seen)
        if not envelopes:
            continue
        state = replay(envelopes)
        if state.is_terminal:
            continue
        checked += 1
        pinned = registered.get((state.flow_id, state.flow_version))
        if pinned is None:
            issues.append(
                _issue(
                    state,
                    "flow_missing",
                    f"the new code has no flow {state.flow_id!r} version "
                    f"{state.flow_version!r}; keep that version registered until its "
                    "executions finish",
                )
            )
            continue
        issue = await check_execution(pinned, envelopes, timeout=timeout)
        if issue is not None:
            issues.append(issue)
    return UpgradeReport(checked, issues)
