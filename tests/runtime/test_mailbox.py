"""The durable mailbox (issue 19 items 4 and 5): early decisions, idempotent resume and send."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

import loom
from loom.errors import (
    ConfigurationError,
    NotWaitingError,
    ResumeValidationError,
)
from loom.model import EventType, ExecutionStatus
from loom.storage import InMemoryStore, MailboxStore, SQLiteStore
from loom.testing import SkippingClock
from tests.conftest import WITH_TENANT, Backend


class Greeting(pydantic.BaseModel):
    text: str


@pytest.fixture
async def runtime(backend: Backend) -> AsyncIterator[Any]:
    rt = loom.WorkflowRuntime(backend.store(), clock=SkippingClock())
    yield rt
    await rt.close()


# The mailbox works on every store, the tenant view included.
on_every_store = pytest.mark.parametrize("backend", WITH_TENANT, indirect=True)


RELEASE: dict[str, asyncio.Event] = {}


@loom.step(id="wait-for-release")
async def wait_for_release(key: str) -> str:
    await RELEASE[key].wait()
    return "released"


@loom.flow(id="greeter", resume_schemas={"Greet": Greeting})
async def greeter(ctx: loom.WorkflowContext, key: str) -> str:
    await ctx.run(wait_for_release, key)
    first: Greeting = await ctx.suspend("Greet")
    second: Greeting = await ctx.suspend("Greet")
    return f"{first.text}-{second.text}"


@on_every_store
async def test_a_decision_sent_before_the_gate_is_consumed_when_the_gate_is_reached(
    runtime: loom.WorkflowRuntime,
) -> None:
    RELEASE["early"] = asyncio.Event()
    handle = await runtime.start(greeter, "early", execution_id="early-1")
    # The webhook beats the flow: the flow is still inside its first step.
    with pytest.raises(NotWaitingError):
        await runtime.resume("early-1", "Greet", {"text": "too-soon"})  # resume still refuses
    sent = await runtime.send("early-1", "Greet", {"text": "hello"})
    assert sent.execution_id == "early-1" and sent.event_type == "Greet"
    assert sent.payload == {"text": "hello"}
    RELEASE["early"].set()
    state = await handle.wait_for_suspend(timeout=10)
    # The first gate consumed the message without ever waiting; the second waits.
    assert state.waiting is not None and state.waiting.position == 2
    gate = state.ops[1]
    assert gate.status == "resolved" and gate.output["message_id"] == sent.message_id
    await runtime.send("early-1", "Greet", {"text": "world"})
    assert await handle.result(timeout=10) == "hello-world"
    # The consumption is in the log: a replay from scratch reads the same values.
    types = [e.type for e in await runtime.store.read("early-1")]
    assert types.count(EventType.EXECUTION_RESUMED) == 2
    assert isinstance(runtime.store, MailboxStore)
    assert await runtime.store.pending_messages("early-1", "Greet") == []


@on_every_store
async def test_messages_are_consumed_oldest_first_and_validated_before_storing(
    runtime: loom.WorkflowRuntime,
) -> None:
    RELEASE["order"] = asyncio.Event()
    handle = await runtime.start(greeter, "order", execution_id="order-1")
    with pytest.raises(ResumeValidationError):
        await runtime.send("order-1", "Greet", {"txt": "wrong shape"})
    await runtime.send("order-1", "Greet", {"text": "a"})
    await runtime.send("order-1", "Greet", {"text": "b"})
    await runtime.send("order-1", "Greet", {"text": "c"})
    RELEASE["order"].set()
    assert await handle.result(timeout=10) == "a-b"
    assert isinstance(runtime.store, MailboxStore)
    left = await runtime.store.pending_messages("order-1", "Greet")
    assert [m.payload for m in left] == [{"text": "c"}]


@on_every_store
async def test_a_message_to_a_suspended_gate_resumes_it(runtime: loom.WorkflowRuntime) -> None:
    RELEASE["late"] = asyncio.Event()
    RELEASE["late"].set()
    handle = await runtime.start(greeter, "late", execution_id="late-1")
    await handle.wait_for_suspend(timeout=10)
    await runtime.send("late-1", "Greet", {"text": "x"})
    await runtime.send("late-1", "Greet", {"text": "y"})
    assert await runtime.handle("late-1").result(timeout=10) == "x-y"


@on_every_store
async def test_send_refuses_what_no_gate_can_take(runtime: loom.WorkflowRuntime) -> None:
    RELEASE["refuse"] = asyncio.Event()
    RELEASE["refuse"].set()
    handle = await runtime.start(greeter, "refuse", execution_id="refuse-1")
    await handle.wait_for_suspend(timeout=10)
    with pytest.raises(NotWaitingError):
        await runtime.send("refuse-1", "loom.timer", None)
    await runtime.send("refuse-1", "Greet", {"text": "1"})
    await runtime.send("refuse-1", "Greet", {"text": "2"})
    await handle.result(timeout=10)
    with pytest.raises(NotWaitingError) as info:
        await runtime.send("refuse-1", "Greet", {"text": "after the end"})
    assert info.value.execution_id == "refuse-1"


# ------------------------------------------------------------------ idempotency (item 5)


@on_every_store
async def test_a_retried_resume_is_not_delivered_to_a_later_gate(
    runtime: loom.WorkflowRuntime,
) -> None:
    """DBOS's scenario: the retry of a delivered decision must not answer the next gate."""
    RELEASE["retry"] = asyncio.Event()
    RELEASE["retry"].set()
    handle = await runtime.start(greeter, "retry", execution_id="retry-1")
    await handle.wait_for_suspend(timeout=10)
    first = await runtime.resume("retry-1", "Greet", {"text": "hello"}, idempotency_key="k1")
    state = await first.wait_for_suspend(timeout=10)
    assert state.waiting is not None and state.waiting.position == 2
    before = await runtime.store.read("retry-1")
    again = await runtime.resume("retry-1", "Greet", {"text": "hello"}, idempotency_key="k1")
    assert again.execution_id == "retry-1"
    assert await runtime.store.read("retry-1") == before  # a no-op: nothing appended
    # The same key through send is a no-op too: it was delivered already.
    await runtime.send("retry-1", "Greet", {"text": "hello"}, idempotency_key="k1")
    assert isinstance(runtime.store, MailboxStore)
    assert await runtime.store.pending_messages("retry-1", "Greet") == []
    await runtime.resume("retry-1", "Greet", {"text": "world"}, idempotency_key="k2")
    assert await handle.result(timeout=10) == "hello-world"  # never "hello-hello"


@on_every_store
async def test_a_repeated_send_key_stores_one_message(runtime: loom.WorkflowRuntime) -> None:
    RELEASE["dup"] = asyncio.Event()
    handle = await runtime.start(greeter, "dup", execution_id="dup-1")
    one = await runtime.send("dup-1", "Greet", {"text": "a"}, idempotency_key="webhook-7")
    two = await runtime.send("dup-1", "Greet", {"text": "a"}, idempotency_key="webhook-7")
    assert one.message_id == two.message_id
    assert isinstance(runtime.store, MailboxStore)
    assert len(await runtime.store.pending_messages("dup-1", "Greet")) == 1
    await runtime.send("dup-1", "Greet", {"text": "b"}, idempotency_key="webhook-8")
    RELEASE["dup"].set()
    assert await handle.result(timeout=10) == "a-b"
    # After consumption the key is still known: a late retry changes nothing.
    three = await runtime.send("dup-1", "Greet", {"text": "a"}, idempotency_key="webhook-7")
    assert three.message_id == one.message_id


async def test_send_needs_a_store_with_a_mailbox() -> None:
    class NoMailbox(InMemoryStore):
        put_message = None  # type: ignore[assignment]

    rt = loom.WorkflowRuntime(NoMailbox(), clock=SkippingClock())
    RELEASE["none"] = asyncio.Event()
    RELEASE["none"].set()
    handle = await rt.start(greeter, "none", execution_id="none-1")
    await handle.wait_for_suspend(timeout=10)
    with pytest.raises(ConfigurationError):
        await rt.send("none-1", "Greet", {"text": "a"})
    await rt.close()


async def test_the_mailbox_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "restart.db"
    rt = loom.WorkflowRuntime(SQLiteStore(path), clock=SkippingClock())
    RELEASE["restart"] = asyncio.Event()
    await rt.start(greeter, "restart", execution_id="restart-1")
    await rt.send("restart-1", "Greet", {"text": "kept"})
    await rt.close()  # the flow never reached its gate in this process
    rt2 = loom.WorkflowRuntime(SQLiteStore(path), clock=SkippingClock())
    rt2.register(greeter)
    RELEASE["restart"].set()
    handle = await rt2.recover("restart-1")
    state = await handle.wait_for_suspend(timeout=10)
    assert state.status is ExecutionStatus.SUSPENDED and state.waiting is not None
    assert state.waiting.position == 2  # the first gate took the stored message
    await rt2.send("restart-1", "Greet", {"text": "too"})
    assert await rt2.handle("restart-1").result(timeout=10) == "kept-too"
    await rt2.close()


class _SendsDuringTheGate(InMemoryStore):
    """A message stored while the gate is being recorded: the sender found the execution still
    running (so it did not deliver), and the holder's first look found nothing yet."""

    def __init__(self) -> None:
        super().__init__()
        self.looked = 0

    async def pending_messages(
        self, execution_id: str, event_type: str, *, limit: int = 100
    ) -> Any:
        self.looked += 1
        if self.looked == 1:
            found = await super().pending_messages(execution_id, event_type, limit=limit)
            await self.put_message(
                loom.Message(execution_id, "raced", event_type, {"text": "raced"}, 0.0)
            )
            return found
        return await super().pending_messages(execution_id, event_type, limit=limit)


@loom.flow(id="one-gate", resume_schemas={"Greet": Greeting})
async def one_gate(ctx: loom.WorkflowContext) -> str:
    greeting: Greeting = await ctx.suspend("Greet")
    return greeting.text


async def test_a_message_stored_while_the_gate_is_recorded_is_not_stranded() -> None:
    store = _SendsDuringTheGate()
    rt = loom.WorkflowRuntime(store, clock=SkippingClock())
    handle = await rt.start(one_gate, None, execution_id="race-1")
    # The holder looks again once its wait is durable: the message is taken, never stranded
    # in the mailbox of a suspended execution.
    assert await handle.result(timeout=10) == "raced"
    assert store.looked >= 2
    types = [e.type for e in await store.read("race-1")]
    assert types[1:] == [
        EventType.EXECUTION_SUSPENDED,
        EventType.EXECUTION_RESUMED,
        EventType.EXECUTION_COMPLETED,
    ]
    await rt.close()
