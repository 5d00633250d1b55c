"""Agent storage and per-turn overhead on SQLite: a long tool-using conversation.

    python -m bench.agents [--turns 100] [--result-bytes 2048] [--synchronous FULL] [--read-only]

**Storage.** One agent run of ``--turns`` model calls, each asking for one tool whose result
is ``--result-bytes`` of text. Three figures, in bytes:

- *distinct messages*: the canonical JSON of every distinct message of the conversation,
  each counted once (the input, every response, every tool result): the least any record of
  the conversation can hold;
- *Loom*: what the run stored for the execution: every event's payload plus every blob;
- *full history per call*: what recording each model call's whole request history plus its
  response takes (the peers' way of checkpointing a conversation).

**Overhead.** Wall time (and this process's CPU time, which a busy machine's scheduling does
not inflate) per turn of the durable run, next to the same turns with the
provider and the tools called directly, no runtime (the provider call alone: ScriptedProvider
answers instantly, so the difference is Loom's cost per turn: its commits and encoding). A
turn is two durable commits with the chosen ``synchronous`` setting: the model call's event,
and the tool step's event with the tool result's blob in the same transaction. The raw floor
of two single-row commits on the same disk is printed beside it. With ``--read-only`` the tool
is declared ``read_only=True`` (a fetch changes nothing): the model call's event then rides in
the tool step's commit, one commit per turn (floor: one commit).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import loom
from loom.llm import CompletionRequest, Message, ScriptedProvider, canonical_json, tool_calls


def make_agent(
    turns: int, result_bytes: int, read_only: bool = False
) -> tuple[loom.Agent, ScriptedProvider]:
    page = "x" * result_bytes

    async def fetch(i: int) -> str:
        """Fetch page i."""
        return f"{i:06d}{page}"[:result_bytes]

    # (read_only passed only when asked: the bench also runs on Loom before it, for A/B runs)
    tool = loom.tool(read_only=True)(fetch) if read_only else loom.tool(fetch)

    script: list[Any] = [tool_calls(("fetch", {"i": i})) for i in range(turns - 1)]
    script.append(loom.llm.reply("All pages read."))
    provider = ScriptedProvider(script)
    agent = loom.agent(
        id="reader",
        provider=provider,
        model="bench",
        instructions="Read every page.",
        tools=[tool],
        max_turns=turns + 1,
    )
    return agent, provider


def sizes(requests: list[CompletionRequest], final: Message) -> tuple[int, int]:
    """(distinct message bytes, full-history-per-call bytes)."""
    distinct: dict[str, int] = {}
    per_call = 0
    responses = [*[r.messages[i] for r in requests[1:] for i in [len(r.messages) - 2]], final]
    for request, response in zip(requests, responses, strict=True):
        history = sum(len(canonical_json(m.to_dict()).encode()) for m in request.messages)
        per_call += history + len(canonical_json(response.to_dict()).encode())
        for m in (*request.messages, response):
            distinct[m.digest()] = len(canonical_json(m.to_dict()).encode())
    return sum(distinct.values()), per_call


async def durable_run(
    db: Path, turns: int, result_bytes: int, sync: str, read_only: bool = False
) -> dict[str, Any]:
    agent, provider = make_agent(turns, result_bytes, read_only)
    store = loom.SQLiteStore(db, synchronous=sync)
    async with loom.WorkflowRuntime(store, timers=False) as runtime:
        runtime.register(agent)
        started, cpu = time.perf_counter(), time.process_time()
        handle = await runtime.start(agent, "Read the pages.", execution_id="bench")
        result = await handle.result(timeout=600)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        events = await store.read("bench")
    conn = sqlite3.connect(db)
    blob_bytes = conn.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM loom_blobs").fetchone()[0]
    conn.close()
    event_bytes = sum(len(e.payload_json.encode()) for e in events)
    calls = [
        e.payload if e.type == "agents.model_called" else e.payload["output"]
        for e in events
        if e.type == "agents.model_called"
        or (e.type == "STEP_COMPLETED" and e.payload["step_id"].startswith("agents.model"))
    ]  # (the second shape: logs of Loom before agents.model_called, for A/B runs)
    final = loom.llm.CompletionResponse.from_dict(calls[-1]["response"]).message
    distinct, per_call = sizes(provider.requests, final)
    return {
        "elapsed": elapsed,
        "cpu": cpu,
        "turns": result["turns"],
        "loom": event_bytes + blob_bytes,
        "events": event_bytes,
        "blobs": blob_bytes,
        "distinct": distinct,
        "per_call": per_call,
    }


async def provider_alone(turns: int, result_bytes: int) -> float:
    agent, provider = make_agent(turns, result_bytes)
    fetch = agent.tools["fetch"]
    messages: list[Message] = [Message.user("Read the pages.")]
    started = time.perf_counter()
    for _ in range(turns):
        request = CompletionRequest("bench", tuple(messages), system="Read every page.")
        response = await provider.complete(request)
        messages.append(response.message)
        for call in response.message.tool_calls:
            out = await fetch.invoke(**dict(call.args))
            messages.append(Message("user", (loom.llm.ToolResultPart(call.id, out, name="fetch"),)))
    return time.perf_counter() - started


def commit_floor(db: Path, commits: int, sync: str, payload: int) -> float:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")
    text = "y" * payload
    started = time.perf_counter()
    for _ in range(commits):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", (text,))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--result-bytes", type=int, default=2048)
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--read-only", action="store_true", help="declare the tool read_only")
    args = parser.parse_args()
    commits = 1 if args.read_only else 2
    runs, alone, floors = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            runs.append(
                await durable_run(
                    Path(tmp) / f"a{r}.db",
                    args.turns,
                    args.result_bytes,
                    args.synchronous,
                    args.read_only,
                )
            )
            alone.append(await provider_alone(args.turns, args.result_bytes))
            floors.append(
                commit_floor(Path(tmp) / f"f{r}.db", commits * args.turns, args.synchronous, 700)
            )
    run = runs[0]
    per_turn = statistics.median(r["elapsed"] for r in runs) / args.turns * 1000
    alone_turn = statistics.median(alone) / args.turns * 1000
    floor_turn = statistics.median(floors) / args.turns * 1000
    print(
        f"agent: {args.turns} turns, {args.result_bytes} B tool result per turn, "
        f"SQLite synchronous={args.synchronous}, median of {args.rounds}, "
        f"{'read-only tool: 1 commit' if args.read_only else '2 commits'} per turn"
    )
    print()
    print(f"{'storage':<34}{'bytes':>12}{'vs distinct':>14}")
    rows = [
        ("distinct messages (the minimum)", run["distinct"]),
        ("Loom (events + blobs)", run["loom"]),
        ("  of which events", run["events"]),
        ("  of which blobs", run["blobs"]),
        ("full history per call (peers)", run["per_call"]),
    ]
    for name, value in rows:
        print(f"{name:<34}{value:>12,}{value / run['distinct']:>13.2f}x")
    print()
    print(f"{'per turn':<34}{'ms':>12}")
    print(f"{'provider + tool alone':<34}{alone_turn:>12.3f}")
    print(f"{'Loom durable turn':<34}{per_turn:>12.3f}")
    cpu_turn = statistics.median(r["cpu"] for r in runs) / args.turns * 1000
    print(f"{'  of which CPU (this process)':<34}{cpu_turn:>12.3f}")
    print(f"{'Loom overhead':<34}{per_turn - alone_turn:>12.3f}")
    print(f"{f'raw floor: {commits} commit(s)':<34}{floor_turn:>12.3f}")
    print(f"{'overhead over the floor':<34}{per_turn - alone_turn - floor_turn:>12.3f}")


if __name__ == "__main__":
    asyncio.run(main())
