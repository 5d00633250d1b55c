"""Gate decisions shared by ``loom approve/reject`` and the console's gate forms.

A gate's decision is the payload of ``runtime.resume``, validated against the flow's resume
schema. Approving and rejecting fill the schema's conventional fields: a boolean ``approved``,
the approver's identity (``approved_by``, ``decided_by``, ``by`` or ``approver``) and a
``reason`` (or ``note``). A gate without a schema takes ``{"approved", "by", "reason"}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loom.errors import ConfigurationError, NotWaitingError
from loom.model import ExecutionState
from loom.runtime import Flow

__all__ = ["GateForm", "decision_payload", "gate_schema"]

IDENTITY_FIELDS = ("approved_by", "decided_by", "by", "approver")
REASON_FIELDS = ("reason", "note", "comment")


def gate_schema(flow: Flow[Any, Any] | None, event_type: str) -> dict[str, Any] | None:
    """The JSON schema of a gate's decision, or None when the gate takes any JSON."""
    if flow is None:
        return None
    codec = flow.resume_schemas.get(event_type)
    if codec is None or codec.adapter is None:
        return None
    schema: dict[str, Any] = codec.adapter.json_schema()
    return schema


@dataclass(frozen=True, slots=True)
class GateForm:
    """One input of a gate's form, derived from a property of its JSON schema."""

    name: str
    kind: str  # "bool", "number", "integer", "string", "choice" or "json"
    required: bool
    title: str
    choices: tuple[str, ...] = ()
    default: str = ""


def form_fields(schema: dict[str, Any] | None) -> list[GateForm]:
    """The inputs a form needs for ``schema`` (one JSON text area when there is none)."""
    if schema is None or not isinstance(schema.get("properties"), dict):
        return [GateForm("payload", "json", False, "decision (JSON)", default="{}")]
    required = set(schema.get("required", []))
    fields = []
    for name, prop in schema["properties"].items():
        prop = prop if isinstance(prop, dict) else {}
        kind = {"boolean": "bool", "number": "number", "integer": "integer", "string": "string"}
        if "enum" in prop:
            fields.append(
                GateForm(
                    name,
                    "choice",
                    name in required,
                    str(prop.get("title", name)),
                    tuple(str(v) for v in prop["enum"]),
                )
            )
            continue
        default = prop.get("default")
        fields.append(
            GateForm(
                name,
                kind.get(str(prop.get("type")), "json"),
                name in required,
                str(prop.get("title", name)),
                default="" if default is None else str(default),
            )
        )
    return fields


def parse_form(schema: dict[str, Any] | None, form: dict[str, str]) -> Any:
    """Turn submitted form text into a payload. Values that do not parse are passed through
    as text, so the schema refuses them with its own message (never a silent coercion)."""
    from loom.model import decode_json

    if schema is None or not isinstance(schema.get("properties"), dict):
        return decode_json(form.get("payload") or "{}")
    out: dict[str, Any] = {}
    for f in form_fields(schema):
        raw = form.get(f.name)
        if raw is None or (raw == "" and not f.required):
            continue
        if f.kind == "bool":
            out[f.name] = {"true": True, "false": False}.get(raw.lower(), raw)
        elif f.kind in ("number", "integer"):
            try:
                out[f.name] = int(raw) if f.kind == "integer" else float(raw)
            except ValueError:
                out[f.name] = raw
        elif f.kind == "json":
            try:
                out[f.name] = decode_json(raw)
            except Exception:
                out[f.name] = raw
        else:
            out[f.name] = raw
    return out


def decision_payload(
    state: ExecutionState,
    schema: dict[str, Any] | None,
    *,
    approve: bool,
    by: str | None,
    reason: str | None,
    data: Any = None,
) -> dict[str, Any]:
    """The payload of an approval (``approve=True``) or a rejection of ``state``'s open gate."""
    eid = state.execution_id
    if state.waiting is None or state.waiting.event_type == "loom.timer":
        raise NotWaitingError(
            f"execution {eid!r} is {state.status}, not waiting on a gate",
            execution_id=eid,
            hint=f"See `loom logs {eid}`",
        )
    if data is not None and not isinstance(data, dict):
        raise ConfigurationError("--data must be a JSON object", execution_id=eid)
    payload: dict[str, Any] = dict(data or {})
    props: dict[str, Any] | None = None
    if schema is not None and isinstance(schema.get("properties"), dict):
        props = schema["properties"]
    if props is None:
        payload.setdefault("approved", approve)
        if by is not None:
            payload.setdefault("by", by)
        if reason is not None:
            payload.setdefault("reason", reason)
        return payload
    if "approved" in props:
        payload["approved"] = approve
    if by is not None:
        field = next((f for f in IDENTITY_FIELDS if f in props), None)
        if field is None:
            raise ConfigurationError(
                f"the gate {state.waiting.event_type!r} of {eid!r} records no identity "
                f"(its schema has none of {', '.join(IDENTITY_FIELDS)})",
                execution_id=eid,
                hint="Drop --by, or pass the decision with --data",
            )
        payload[field] = by
    if reason is not None:
        field = next((f for f in REASON_FIELDS if f in props), None)
        if field is None:
            raise ConfigurationError(
                f"the gate {state.waiting.event_type!r} of {eid!r} records no reason",
                execution_id=eid,
                hint="Drop --reason, or pass the decision with --data",
            )
        payload[field] = reason
    return payload
