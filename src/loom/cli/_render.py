"""Human-readable rendering of logs and states (rich), shared by the CLI commands."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from loom.model import Envelope, ExecutionState
from loom.runtime._context import TIMER_EVENT

__all__ = ["render_state", "render_timeline", "summarize", "timeline_rows", "when_iso"]


def _short(value: Any, limit: int = 70) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _call(name: Any, args: Any) -> str:
    if not isinstance(args, dict):
        return f"{name}({_short(args, 40)})"
    inner = ", ".join(f"{k}={_short(v, 30)}" for k, v in args.items())
    return f"{name}({inner if len(inner) <= 60 else inner[:59] + '…'})"


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _model_called(p: Mapping[str, Any]) -> str:
    """An agent's model call: what the model answered (tool calls or text), in one line."""
    response = _obj(p.get("response"))
    message = _obj(response.get("message"))
    parts = [x for x in message.get("parts") or [] if isinstance(x, dict)]
    calls = [_call(x.get("name"), x.get("args")) for x in parts if x.get("type") == "tool_call"]
    text = "".join(str(x.get("text", "")) for x in parts if x.get("type") == "text")
    said = f"calls {', '.join(calls)}" if calls else f"says {_short(text, 60)}"
    extra = [str(response.get("stop_reason"))] if response.get("stop_reason") else []
    annotations = _obj(p.get("annotations"))
    if annotations.get("tokens"):
        extra.append(f"{annotations['tokens']} tokens")
    if p.get("attempt", 1) != 1:
        extra.append(f"attempt {p.get('attempt')}")
    tail = f" [{', '.join(extra)}]" if extra else ""
    return f"#{p.get('position')} {p.get('agent')} turn {p.get('turn')}: {said}{tail}"


def _vote_recorded(p: Mapping[str, Any]) -> str:
    reason = f": {_short(p['reason'], 50)}" if p.get("reason") else ""
    edited = f" with edited args {_short(p['args'], 50)}" if p.get("args") else ""
    return f"#{p.get('position')} {p.get('vote')} by {p.get('by')}{edited}{reason}"


def _agent_decision(p: Mapping[str, Any]) -> str | None:
    """An agent's own decision records (an approval asked for, the loop's outcome)."""
    name, value = str(p.get("name", "")), p.get("value")
    if not isinstance(value, dict):
        return None
    if name == "agents.approval_request":
        who = value.get("approvers")
        voters = f"any {value.get('quorum', 1)} of {', '.join(map(str, who))}" if who else "anyone"
        due = f", until {when_iso(value['deadline_at'])}" if value.get("deadline_at") else ""
        call = _call(value.get("tool"), value.get("args"))
        return f"#{p.get('position')} approval asked for {call} from {voters}{due}"
    if name.startswith("agents.outcome:"):
        turns = value.get("turns")
        outcome = f"{value.get('agent')} {value.get('outcome')}"
        return f"#{p.get('position')} {outcome} after {turns} turn(s)"
    return None


#: One-line summaries of the agents layer's own event types (``loom.agents``).
_EXTENSIONS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "agents.model_called": _model_called,
    "agents.vote_recorded": _vote_recorded,
}


def summarize(env: Envelope) -> str:
    """One line saying what an event recorded."""
    p = env.payload
    t = str(env.type)
    extension = _EXTENSIONS.get(t)
    if extension is not None:
        try:
            return extension(p)
        except Exception:  # a payload of another shape: shown as it is below
            pass
    if t == "EXECUTION_STARTED":
        return f"{p.get('flow_id')} v{p.get('flow_version')} input={_short(p.get('input'), 50)}"
    if t in ("STEP_STARTED", "STEP_COMPLETED", "STEP_FAILED"):
        step = str(p.get("step_id"))
        if step.startswith("agents.tool:"):
            step = f"tool {step.removeprefix('agents.tool:')}"
        head = f"#{p.get('position')} {step} (attempt {p.get('attempt', 1)})"
        if t == "STEP_COMPLETED":
            output = p.get("output")
            if step.startswith("tool ") and isinstance(output, dict) and "message" in output:
                # The result is a message in the blob store: its address, not its content.
                return f"{head} -> result in message {str(output['message'])[:12]}"
            return f"{head} -> {_short(output, 50)}"
        if t == "STEP_FAILED":
            err = p.get("error") or {}
            final = "final" if p.get("final") else "will retry"
            return f"{head} {err.get('type')}: {err.get('message')} [{final}]"
        return head
    if t == "EXECUTION_SUSPENDED":
        if p.get("event_type") == TIMER_EVENT:
            return f"#{p.get('position')} sleeping; wakes at {when_iso(p.get('timeout_at'))}"
        key = f" key={p.get('correlation_key')}" if p.get("correlation_key") else ""
        due = f", times out at {when_iso(p['timeout_at'])}" if p.get("timeout_at") else ""
        return f"#{p.get('position')} waiting for {p.get('event_type')}{key}{due}"
    if t == "TIMER_SCHEDULED":
        return f"#{p.get('position')} {p.get('name')} wakes at {when_iso(p.get('fire_at'))}"
    if t == "TIMER_FIRED":
        what = "gate timed out" if p.get("timed_out") else "woke"
        return f"#{p.get('position')} {what}"
    if t == "EXECUTION_CANCELLED":
        return f"reason: {p['reason']}" if p.get("reason") else "no reason given"
    if t == "EXECUTION_RESUMED":
        return f"#{p.get('position')} {p.get('event_type')} {_short(p.get('payload'), 50)}"
    if t == "UI_PATCHED":
        return f"{p.get('op')} {p.get('key')} = {_short(p.get('value'), 50)}"
    if t == "DECISION_RECORDED":
        agent = _agent_decision(p) if str(p.get("name", "")).startswith("agents.") else None
        if agent is not None:
            return agent
        return f"#{p.get('position')} {p.get('name')} = {_short(p.get('value'), 50)}"
    if t == "EXECUTION_COMPLETED":
        return f"output={_short(p.get('output'))}"
    if t == "EXECUTION_FAILED":
        err = p.get("error") or {}
        return f"{err.get('type')}: {err.get('message')}"
    return _short(dict(p))


def when_iso(ts: Any) -> str:
    """An epoch as an ISO-8601 UTC date-time (a date always: a 24 h timeout must not look
    expired)."""
    if not isinstance(ts, (int, float)):
        return "?"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def timeline_rows(envelopes: list[Envelope]) -> list[dict[str, Any]]:
    return [
        {
            "sequence": e.sequence,
            "type": str(e.type),
            "recorded_at": e.recorded_at,
            "recorded_at_iso": when_iso(e.recorded_at),
            "fence": e.fence,
            "summary": summarize(e),
            "payload": dict(e.payload),
        }
        for e in envelopes
    ]


def render_timeline(console: Console, envelopes: list[Envelope], title: str) -> None:
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("seq", justify="right")
    table.add_column("recorded at (UTC)", no_wrap=True)
    table.add_column("fence", justify="right")
    table.add_column("event")
    table.add_column("detail", overflow="fold")
    styles = {
        "EXECUTION_COMPLETED": "green",
        "EXECUTION_FAILED": "red",
        "STEP_FAILED": "red",
        "EXECUTION_SUSPENDED": "yellow",
        "EXECUTION_RECOVERED": "magenta",
        "EXECUTION_CANCELLED": "red",
    }
    for e in envelopes:
        table.add_row(
            str(e.sequence),
            when_iso(e.recorded_at),
            str(e.fence),
            f"[{styles.get(str(e.type), 'cyan')}]{escape(str(e.type))}[/]",
            # Recorded data, not markup: "[final]" or a step's "[bold]" output stays as it is.
            escape(summarize(e)),
        )
    console.print(table)


def render_state(console: Console, state: ExecutionState) -> None:
    colour = {"completed": "green", "failed": "red", "suspended": "yellow", "cancelled": "red"}
    console.print(
        f"[bold]{state.execution_id}[/]  flow [cyan]{state.flow_id}[/] v{state.flow_version}  "
        f"status [{colour.get(state.status.value, 'blue')}]{state.status.value}[/]  "
        f"at sequence {state.last_sequence}  steps completed {state.completed_steps}"
    )
    if state.waiting and state.waiting.event_type == TIMER_EVENT:
        console.print(
            f"  sleeping; wakes at [yellow]{when_iso(state.waiting.timeout_at)}[/] "
            "(woken by `loom serve`, `loom recover` or any open runtime on this store)"
        )
    elif state.waiting:
        w = state.waiting
        console.print(
            f"  waiting for [yellow]{w.event_type}[/]"
            + (f" (key {w.correlation_key})" if w.correlation_key else "")
            + (f", times out at {when_iso(w.timeout_at)}" if w.timeout_at else "")
        )
    if state.ui:
        console.print(f"  ui: {_short(state.ui, 200)}")
    if state.output is not None:
        console.print(f"  output: {_short(state.output, 200)}")
    if state.error:
        console.print(f"  [red]error: {state.error.get('type')}: {state.error.get('message')}[/]")
    if state.status.value == "cancelled":
        console.print(f"  cancel reason: {state.cancel_reason or '(none given)'}")
    if state.recoveries:
        console.print(f"  recovered {state.recoveries} time(s)")
