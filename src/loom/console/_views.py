"""Turning folded states and envelopes into what pages and the JSON API show."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from loom.cli._render import summarize
from loom.model import Envelope, ExecutionState

__all__ = ["envelope_row", "execution_row", "fmt_time", "parse_sequence", "step_rows"]

MARKS = {
    "gate": "gate",
    "timer": "timer",
    "decision": "decision",
    "ui": "ui",
}


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def execution_row(state: ExecutionState) -> dict[str, Any]:
    """The JSON summary of one execution (what the list shows)."""
    waiting = state.waiting
    return {
        "execution_id": state.execution_id,
        "flow_id": state.flow_id,
        "flow_version": state.flow_version,
        "status": state.status.value,
        "waiting_for": waiting.event_type if waiting else None,
        "last_sequence": state.last_sequence,
        "created_at": state.started_at,
        "updated_at": state.updated_at,
        "forked_from": state.forked_from,
    }


def envelope_row(env: Envelope) -> dict[str, Any]:
    return {
        "sequence": env.sequence,
        "type": str(env.type),
        "recorded_at": env.recorded_at,
        "time": fmt_time(env.recorded_at),
        "fence": env.fence,
        "summary": summarize(env),
        "payload": dict(env.payload),
    }


def step_rows(state: ExecutionState, envelopes: list[Envelope]) -> list[dict[str, Any]]:
    """One row per position of the flow: what it was, its status, attempts and duration."""
    started: dict[int, float] = {}
    ended: dict[int, float] = {}
    for env in envelopes:
        pos = env.payload.get("position")
        if not isinstance(pos, int):
            continue
        if str(env.type) in ("STEP_STARTED", "EXECUTION_SUSPENDED", "TIMER_SCHEDULED"):
            started.setdefault(pos, env.recorded_at)
        # A step's completion, or a layer's event recording one (agents.model_called): both
        # carry when the attempt began.
        if str(env.type) == "STEP_COMPLETED" or "started_at" in env.payload:
            began = env.payload.get("started_at")
            if isinstance(began, (int, float)):
                started.setdefault(pos, float(began))
            ended[pos] = env.recorded_at
        elif str(env.type) in ("STEP_FAILED", "EXECUTION_RESUMED", "TIMER_FIRED"):
            ended[pos] = env.recorded_at
    rows = []
    for pos in sorted(state.ops):
        op = state.ops[pos]
        duration = None
        if pos in started and pos in ended:
            duration = max(0.0, ended[pos] - started[pos])
        rows.append(
            {
                "position": pos,
                "kind": str(op.kind),
                "name": op.name,
                "status": str(op.status),
                "attempts": op.attempts,
                "duration_ms": None if duration is None else round(duration * 1000, 1),
                "mark": MARKS.get(str(op.kind), ""),
            }
        )
    return rows


def parse_sequence(raw: str | None, last: int, execution_id: str) -> int | None:
    """A sequence from a query string: None when absent; a typed error when it is not a
    number or lies outside ``0..last``."""
    from loom.errors import ConfigurationError

    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(
            f"sequence {raw!r} is not a number", execution_id=execution_id
        ) from None
    if value < 0 or value > last:
        raise ConfigurationError(
            f"sequence {value} is outside 0..{last} of execution {execution_id!r}",
            execution_id=execution_id,
        )
    return value
