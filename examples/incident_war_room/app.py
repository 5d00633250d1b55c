"""The incident war room's agents, tools and simulated data sources.

An alert (checkout errors and a drop in orders) starts the commander's run (the durable flow
``incident-command``), which fans out to three investigator agents (logs, metrics, recent
deploys), each with one tool over a simulated source with planted evidence; the incident
commander agent turns their findings into a remediation plan (a
:class:`loom.orchestration.Plan`) whose steps are remediation agents. Each risky remediation
(turn a feature flag off, roll back, scale out) is a tool behind an approval: quorum 2 (the
on-call engineer and the incident lead), a 15-minute deadline; when it passes, the agent is
told and escalates to the incident manager. A postmortem agent writes the report.

Every model call and tool effect is counted in the effect ledger. Worker processes load
``examples.incident_war_room.app:make_runtime``.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pydantic

import loom
from examples._support import Ledger, open_store, provider
from loom.llm import CompletionRequest, reply, tool_calls
from loom.orchestration import Plan, PlanStep

CLOCK_ENV = "LOOM_EXAMPLE_CLOCK_FILE"
APPROVERS = ("oncall", "incident-lead")
DEADLINE = timedelta(minutes=15)


class SkewClock:
    """Wall-clock time plus an offset (seconds) read from the file ``LOOM_EXAMPLE_CLOCK_FILE``
    names, so the story can let "15 minutes pass" in every process at once (the workers'
    clocks decide when an approval deadline is due). No file: the real clock."""

    def now(self) -> float:
        path = os.environ.get(CLOCK_ENV)
        offset = 0.0
        if path:
            try:
                offset = float(Path(path).read_text() or 0)
            except (OSError, ValueError):
                offset = 0.0
        return time.time() + offset

    async def sleep(self, seconds: float) -> None:
        import asyncio

        await asyncio.sleep(max(0.0, seconds))


def advance_clock(seconds: float) -> None:
    """Move every process's SkewClock forward by ``seconds``."""
    path = Path(os.environ[CLOCK_ENV])
    current = float(path.read_text() or 0) if path.exists() else 0.0
    path.write_text(str(current + seconds))


# ------------------------------------------------------------------------------ the sources

LOGS = [
    "14:01:12 payments-api INFO settlement batch 8812 done",
    "14:02:05 deployer INFO checkout-api v2.14.0 rolled out (pricing cache v2)",
    "14:03:40 flags INFO pricing-cache-v2 enabled for 100% of traffic",
    "14:04:02 checkout-api ERROR java.lang.OutOfMemoryError: pricing cache exceeded heap",
    "14:04:09 checkout-api ERROR POST /checkout 503 upstream reset",
    "14:04:31 checkout-api ERROR java.lang.OutOfMemoryError: pricing cache exceeded heap",
    "14:05:15 checkout-api WARN pod checkout-api-7 restarted (OOMKilled)",
]
METRICS: dict[str, dict[str, Any]] = {
    "checkout-api": {
        "error_rate": {"13:55": 0.002, "14:00": 0.002, "14:05": 0.121, "14:10": 0.134},
        "memory_pct": {"13:55": 61, "14:00": 63, "14:05": 98, "14:10": 97},
        "orders_per_min": {"13:55": 412, "14:00": 405, "14:05": 188, "14:10": 171},
    },
    "payments-api": {"error_rate": {"13:55": 0.001, "14:00": 0.001, "14:05": 0.001}},
}
DEPLOYS = [
    {"service": "payments-api", "version": "v5.1.0", "at": "09:12", "by": "dana"},
    {"service": "checkout-api", "version": "v2.14.0", "at": "14:02", "by": "alice",
     "change": "pricing cache v2", "previous": "v2.13.2"},
    {"flag": "pricing-cache-v2", "at": "14:03", "by": "alice", "state": "on"},
]  # fmt: skip


@loom.tool
def search_logs(pattern: str) -> list[str]:
    """Log lines of the last 15 minutes containing ``pattern`` (case-insensitive)."""
    Ledger().record("tool:search_logs")
    return [line for line in LOGS if pattern.lower() in line.lower()]


@loom.tool
def query_metrics(service: str) -> dict[str, Any]:
    """The service's metrics around the alert, per 5-minute bucket."""
    Ledger().record("tool:query_metrics")
    return dict(METRICS.get(service, {}))


@loom.tool
def recent_deploys(hours: int) -> list[dict[str, Any]]:
    """Deploys and flag changes of the last ``hours`` hours."""
    Ledger().record("tool:recent_deploys")
    return DEPLOYS


_GUARD = loom.ApprovalPolicy(approvers=APPROVERS, quorum=2, deadline=DEADLINE, on_timeout="reject")


@loom.tool(requires_approval=_GUARD)
def disable_flag(flag: str) -> str:
    """Turn a feature flag off for all traffic."""
    Ledger().record("remediation:disable_flag")
    return f"flag {flag} is off"


@loom.tool(requires_approval=_GUARD)
def rollback(service: str, to_version: str) -> str:
    """Roll a service back to an earlier version."""
    Ledger().record("remediation:rollback")
    return f"{service} rolled back to {to_version}"


@loom.tool(requires_approval=_GUARD)
def scale_out(service: str, replicas: int) -> str:
    """Scale a service to ``replicas`` replicas."""
    Ledger().record("remediation:scale_out")
    return f"{service} scaled to {replicas} replicas"


@loom.tool
def page(who: str, why: str) -> str:
    """Page someone (escalation)."""
    Ledger().record("escalation:page")
    return f"paged {who}"


# ------------------------------------------------------------------------------ scripts


def _tool_results(request: CompletionRequest) -> list[Any]:
    """The tool results in the conversation so far, decoded, oldest first."""
    out = []
    for message in request.messages:
        for part in message.parts:
            content = getattr(part, "content", None)
            if getattr(part, "call_id", None) is not None:
                try:
                    out.append(json.loads(content) if isinstance(content, str) else content)
                except ValueError:
                    out.append(content)
    return out


def _turn(request: CompletionRequest) -> int:
    return sum(1 for m in request.messages if m.role == "assistant")


class Finding(pydantic.BaseModel):
    source: str
    summary: str
    suspect: str | None = None


def _service(request: CompletionRequest) -> str:
    """The service an alert is about (the text before its first colon)."""
    return str(json.loads(request.messages[0].text)["alert"]).split(":")[0].strip()


def _investigator(source: str, call: Any, summarize: Any) -> Any:
    def script(request: CompletionRequest) -> Any:
        service = _service(request)
        if _turn(request) == 0:
            return tool_calls(call(service))
        summary, suspect = summarize(service, _tool_results(request)[-1])
        return reply(Finding(source=source, summary=summary, suspect=suspect).model_dump_json())

    return script


def _logs_summary(service: str, lines: list[str]) -> tuple[str, str | None]:
    ooms = [line for line in lines if "OutOfMemoryError" in line]
    if not ooms:
        return f"{len(lines)} error lines for {service}; nothing unusual", None
    return f"{len(ooms)} OutOfMemoryError lines in {service} since {ooms[0][:5]}", service


def _metrics_summary(service: str, m: dict[str, Any]) -> tuple[str, str | None]:
    if "memory_pct" not in m:
        return f"no anomaly in {service}'s metrics", None
    err, mem = m["error_rate"], m["memory_pct"]
    return (
        f"{service} error rate {err['14:00']:.1%} -> {err['14:05']:.1%}, memory "
        f"{mem['14:00']}% -> {mem['14:05']}%, orders/min halved",
        service,
    )


def _deploys_summary(service: str, d: list[dict[str, Any]]) -> tuple[str, str | None]:
    mine = [x for x in d if x.get("service") == service]
    if not mine:
        return f"no recent deploy of {service}", None
    flags = [x["flag"] for x in d if "flag" in x]
    return (f"{service} {mine[-1]['version']} ({mine[-1].get('change')}) at {mine[-1]['at']}, "
            f"flag {flags[0]} on at 14:03, two minutes before the errors", flags[0])  # fmt: skip


REMEDIATION_PLAN = Plan(
    goal="stop checkout errors caused by pricing cache v2",
    steps=[
        PlanStep(id="flag-off", agent="flag-operator", input={"flag": "pricing-cache-v2"}),
        PlanStep(
            id="rollback",
            agent="deploy-operator",
            input={"service": "checkout-api", "to_version": "v2.13.2"},
        ),
        PlanStep(
            id="scale",
            agent="capacity-operator",
            input={"service": "checkout-api", "replicas": 12},
        ),
    ],
)
FALSE_ALARM_PLAN = Plan(
    goal="add capacity for a batch spike",
    steps=[
        PlanStep(id="scale", agent="capacity-operator", input={"service": "batch-7", "replicas": 4})
    ],
)


def _commander(request: CompletionRequest) -> Any:
    facts = json.loads(request.messages[0].text)
    plan = REMEDIATION_PLAN if "checkout" in facts["alert"] else FALSE_ALARM_PLAN
    return reply(plan.model_dump_json())


def _remediator(tool: str) -> Any:
    """Call the risky tool with the step's input; if the approvers let its deadline pass,
    escalate by paging the incident manager; then report."""

    def script(request: CompletionRequest) -> Any:
        turn = _turn(request)
        if turn == 0:
            return tool_calls((tool, json.loads(request.messages[0].text)))
        last = str(_tool_results(request)[-1])
        if turn == 1 and "deadline" in last:
            return tool_calls(
                ("page", {"who": "incident-manager", "why": f"{tool}: no quorum in 15 min"})
            )
        if turn >= 2:
            return reply(f"{tool} not approved in time; escalated to the incident manager")
        return reply(last)

    return script


def _postmortem(request: CompletionRequest) -> Any:
    facts = json.loads(request.messages[0].text)
    lines = [f"# Postmortem: {facts['alert']}", "", "## Findings"]
    lines += [f"- {f['source']}: {f['summary']}" for f in facts["findings"]]
    lines += ["", "## Remediation"]
    lines += [f"- {step}: {outcome}" for step, outcome in facts["remediation"].items()]
    lines += ["", "## Root cause", "pricing cache v2 (flag pricing-cache-v2) exhausted the heap."]
    return reply("\n".join(lines))


def _agent(agent_id: str, script: Any, instructions: str, **kw: Any) -> loom.Agent:
    model_provider, model = provider(agent_id, script)
    return loom.agent(
        id=agent_id, provider=model_provider, model=model, instructions=instructions, **kw
    )


LOGS_AGENT = _agent(
    "logs-investigator",
    _investigator("logs", lambda svc: ("search_logs", {"pattern": f"{svc} ERROR"}), _logs_summary),
    "Investigate the alert in the logs. Answer JSON {source, summary, suspect}.",
    tools=[search_logs],
    output_type=Finding,
)
METRICS_AGENT = _agent(
    "metrics-investigator",
    _investigator("metrics", lambda svc: ("query_metrics", {"service": svc}), _metrics_summary),
    "Investigate the alert in the metrics. Answer JSON {source, summary, suspect}.",
    tools=[query_metrics],
    output_type=Finding,
)
DEPLOYS_AGENT = _agent(
    "deploys-investigator",
    _investigator("deploys", lambda svc: ("recent_deploys", {"hours": 6}), _deploys_summary),
    "Find recent deploys and flag changes. Answer JSON {source, summary, suspect}.",
    tools=[recent_deploys],
    output_type=Finding,
)
COMMANDER = _agent(
    "incident-commander",
    _commander,
    "You command an incident. From the alert and the investigators' findings, plan the "
    "remediation as JSON {goal, steps: [{id, agent, input}]} using the agents flag-operator "
    "({flag}), deploy-operator ({service, to_version}) and capacity-operator ({service, "
    "replicas}).",
    output_type=Plan,
)
FLAG_AGENT = _agent(
    "flag-operator",
    _remediator("disable_flag"),
    "Turn the flag off.",
    tools=[disable_flag, page],
)
DEPLOY_AGENT = _agent(
    "deploy-operator", _remediator("rollback"), "Roll back.", tools=[rollback, page]
)
CAPACITY_AGENT = _agent(
    "capacity-operator", _remediator("scale_out"), "Scale out.", tools=[scale_out, page]
)
POSTMORTEM_AGENT = _agent(
    "postmortem-writer", _postmortem, "Write a short blameless postmortem in Markdown."
)

INVESTIGATORS = [LOGS_AGENT, METRICS_AGENT, DEPLOYS_AGENT]
COMMAND_FLOW = "incident-command"


@loom.flow(id=COMMAND_FLOW)
async def incident_command(ctx: loom.WorkflowContext, alert: dict[str, Any]) -> dict[str, Any]:
    """The commander's run, a durable flow (its execution id is the incident's): fan out to
    the three investigators at once (each a child execution, ``<incident>.<position>``), join
    their findings and have the commander agent plan the remediation (one more child). A
    crash anywhere in here continues from the log: finished investigators are found by id
    and never asked again, and the plan is asked for once."""
    tasks = await ctx.fan_out([(agent.id, {"alert": alert["alert"]}) for agent in INVESTIGATORS])
    findings = [task["output"] for task in tasks]
    command = await ctx.call(COMMANDER.id, {"alert": alert["alert"], "findings": findings})
    return {"findings": findings, "plan": command["output"]}


AGENTS = [
    *INVESTIGATORS,
    COMMANDER,
    FLAG_AGENT,
    DEPLOY_AGENT,
    CAPACITY_AGENT,
    POSTMORTEM_AGENT,
]


def make_runtime() -> loom.WorkflowRuntime:
    """The runtime a worker process serves (store from ``LOOM_EXAMPLE_STORE``)."""
    runtime = loom.WorkflowRuntime(open_store(), clock=SkewClock())
    runtime.register(*AGENTS, incident_command)
    return runtime
