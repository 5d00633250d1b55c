"""A third-party layer's events, defined outside the loom package (as `agents` or `branches`
will be): a payload type, a reducer, a registration at import, and a flow that records them.

Run as `python -m tests.children.ext_events STORE_URL EXECUTION_ID [--no-register]` it folds that
execution in a fresh process and prints the state as JSON (or the error's code), so tests
can check that what one process recorded another one reads back.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from typing import Any

import loom
from loom.model import ExecutionState, OpRecord, OpStatus, Payload

METER = "acme.meter"


@dataclass(frozen=True, slots=True)
class TokensSpent(Payload):
    """acme.tokens_spent: a model call at ``position`` used ``tokens``."""

    position: int
    model: str
    tokens: int = 0


def apply_tokens_spent(state: ExecutionState, event: TokensSpent, env: loom.Envelope) -> None:
    if event.tokens < 0:
        raise ValueError("tokens cannot be negative")
    state.ops[event.position] = OpRecord(
        METER, event.model, OpStatus.COMPLETED, {"tokens": event.tokens}
    )
    state.ui["tokens"] = int(state.ui.get("tokens", 0)) + event.tokens


def register() -> None:
    loom.register_event("acme.tokens_spent", TokensSpent, apply_tokens_spent)


if "--no-register" not in sys.argv:
    register()


async def spend(ctx: loom.WorkflowContext, model: str, tokens: int) -> int:
    """An extension's replay-safe operation: record once, return the record on replay."""
    pos, op = ctx.claim_position(METER, model)
    if op is None:
        await ctx.record(TokensSpent(pos, model, tokens))
        op = ctx.recorded(pos)
        assert op is not None
    return int(op.output["tokens"])


@loom.step(id="after")
async def after(total: int) -> int:
    return total * 2


@loom.flow(id="metered")
async def metered(ctx: loom.WorkflowContext) -> int:
    a = await spend(ctx, "small", 40)
    b = await spend(ctx, "large", 2)
    return await ctx.run(after, a + b)


async def _fold(url: str, execution_id: str) -> dict[str, Any]:
    if url.startswith("postgresql://"):
        from loom.storage.postgres import PostgresStore

        dsn, _, schema = url.partition("#")
        store: Any = await PostgresStore.open(dsn, schema=schema)
    else:
        store = loom.SQLiteStore(url)
    rt = loom.WorkflowRuntime(store, timers=False)
    try:
        state = await rt.load_state(execution_id)
        assert state is not None
        return {"state": state.to_dict()}
    except loom.LoomError as exc:
        return {"error": exc.to_dict()}
    finally:
        await rt.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_fold(sys.argv[1], sys.argv[2]))))
