"""The orchestration scenario's agents, served in-process and by HTTP worker processes
(``--app tests.support.orchestration:make_runtime``).

Three agents on ScriptedProvider (no network): ``research`` answers with facts, ``review``
asks to ``publish`` (a tool behind an approval gate) and, when the operator rejects it,
``decline``s the task (a fatal tool raising TaskRejectedError: the task ends ``rejected``),
``writer`` writes the final text. Each model call and each tool effect is counted in the
effect ledger (``LOOM_TEST_LEDGER``, a SQLite file every process shares) with the pid that ran
it: the oracle for "ran N times" and "ran on a worker".
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

import loom
from loom.llm import CompletionRequest, ScriptedProvider, ToolResultPart, reply, tool_calls
from loom.orchestration import TaskRejectedError
from loom.storage import SQLiteStore

APPROVE = {"vote": "approve", "by": "ops"}
REJECT = {"vote": "reject", "by": "ops", "reason": "not today"}


def record(what: str) -> None:
    path = os.environ.get("LOOM_TEST_LEDGER")
    info = loom.current_step()
    if not path or info is None:
        return
    conn = sqlite3.connect(path, timeout=30)
    try:
        with conn:
            conn.execute("CREATE TABLE IF NOT EXISTS fx (eid TEXT, what TEXT, pid INTEGER)")
            conn.execute("INSERT INTO fx VALUES (?, ?, ?)", (info.execution_id, what, os.getpid()))
    finally:
        conn.close()


def effects(path: str | os.PathLike[str]) -> list[tuple[str, str, int]]:
    """(execution id, what, pid) of every effect so far."""
    if not os.path.exists(path):
        return []
    conn = sqlite3.connect(path, timeout=30)
    try:
        rows = conn.execute("SELECT eid, what, pid FROM fx").fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
    return [(str(e), str(w), int(p)) for e, w, p in rows]


def _counting(name: str, script: Any) -> ScriptedProvider:
    def answer(request: CompletionRequest) -> Any:
        record(f"model:{name}")
        return script(request)

    return ScriptedProvider(answer)


def _results(request: CompletionRequest) -> list[ToolResultPart]:
    return [p for m in request.messages for p in m.parts if isinstance(p, ToolResultPart)]


@loom.tool(requires_approval=True)
async def publish(text: str) -> str:
    """Publish the reviewed text (an operator approves each call)."""
    record("publish")
    return f"published: {text}"


@loom.tool(fatal=(TaskRejectedError,))
async def decline(reason: str) -> str:
    """Decline the task."""
    record("decline")
    raise TaskRejectedError(f"declined: {reason}")


def _review(request: CompletionRequest) -> Any:
    results = _results(request)
    if not results:
        return tool_calls(("publish", {"text": "draft"}))
    last = results[-1]
    if last.is_error and "rejected" in str(last.content):
        return tool_calls(("decline", {"reason": "the operator rejected publishing"}))
    return reply("reviewed and published")


research = loom.agent(
    id="research",
    provider=_counting("research", lambda r: reply("three facts")),
    model="scripted",
    instructions="Find facts.",
)
review = loom.agent(
    id="review",
    provider=_counting("review", _review),
    model="scripted",
    instructions="Review, then publish with approval.",
    tools=[publish, decline],
)
writer = loom.agent(
    id="writer",
    provider=_counting("writer", lambda r: reply("the final article")),
    model="scripted",
    instructions="Write the article.",
)

AGENTS = [research, review, writer]


def make_runtime() -> loom.WorkflowRuntime:
    runtime = loom.WorkflowRuntime(SQLiteStore(os.environ["LOOM_TEST_DB"]))
    runtime.register(*AGENTS)
    return runtime
