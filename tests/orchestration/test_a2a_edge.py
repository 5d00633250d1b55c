"""The A2A edge against the official a2a-sdk client as a real peer, over real HTTP on
127.0.0.1 to a server subprocess: the gate lifecycle, streaming, cancel, the protocol's error
codes for bad input (creating no execution), and a server SIGKILLed mid-task that loses
nothing, answers GetTask after the restart and stays idempotent on the message id."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("a2a")

from a2a.client import ClientConfig, create_client
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import TaskNotCancelableError, UnsupportedOperationError
from google.protobuf import json_format

import loom
from loom.model import EventType
from loom.storage import SQLiteStore
from tests.support import orchestration as scenario
from tests.support.poll import until
from tests.support.proc import Child

DEADLINE = 30.0


class Server:
    def __init__(self, tmp: Path, agent: str) -> None:
        self.tmp, self.agent = tmp, agent
        self.db, self.ledger, self.holds = tmp / "a2a.db", tmp / "fx.db", tmp / "holds"
        self.holds.mkdir(exist_ok=True)
        self.proc: Child | None = None
        self.url = ""
        self.starts = 0

    async def start(self) -> None:
        self.starts += 1
        port_file = self.tmp / f"port-{self.starts}"
        env = {
            "LOOM_TEST_DB": str(self.db),
            "LOOM_TEST_LEDGER": str(self.ledger),
            "LOOM_TEST_HOLD_DIR": str(self.holds),
        }
        self.proc = Child(
            "a2a_server", "--port-file", port_file, "--agent", self.agent,
            env=env, log=self.tmp / f"server-{self.starts}.log",
        )  # fmt: skip
        self.url = await self.proc.serving(
            port_file, health="/.well-known/agent-card.json", timeout=DEADLINE
        )

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def effects(self) -> list[str]:
        return [what for _, what, _ in scenario.effects(self.ledger)]

    async def executions(self) -> list[str]:
        async with loom.WorkflowRuntime(SQLiteStore(self.db), timers=False) as rt:
            return [s.execution_id async for s in rt.executions()]


@pytest.fixture
async def review_server(tmp_path: Path) -> AsyncIterator[Server]:
    server = Server(tmp_path, "review")
    await server.start()
    yield server
    server.kill()


def _message(
    *, text: str | None = None, data: Any = None, task_id: str = "", message_id: str
) -> pb.SendMessageRequest:
    part = pb.Part(text=text) if text is not None else pb.Part()
    if data is not None:
        json_format.ParseDict(data, part.data)
    message = pb.Message(role=pb.ROLE_USER, message_id=message_id, task_id=task_id, parts=[part])
    return pb.SendMessageRequest(message=message)


async def _send(client: Any, request: pb.SendMessageRequest) -> list[pb.StreamResponse]:
    return [event async for event in client.send_message(request)]


async def test_card_gate_lifecycle_and_cancel(review_server: Server) -> None:
    async with httpx.AsyncClient() as http:
        card = (await http.get(review_server.url + "/.well-known/agent-card.json")).json()
    assert card["name"] == "review" and card["capabilities"]["streaming"] is True
    assert card["supportedInterfaces"][0]["protocolBinding"] == "JSONRPC"
    client = await create_client(review_server.url, ClientConfig(streaming=False))
    try:
        (first,) = await _send(client, _message(text="a draft", message_id="m-1"))
        task = first.task
        assert task.status.state == pb.TASK_STATE_INPUT_REQUIRED
        again = await _send(client, _message(text="a draft", message_id="m-1"))
        assert again[0].task.id == task.id  # idempotent on the message id
        (done,) = await _send(
            client, _message(data=scenario.APPROVE, task_id=task.id, message_id="m-2")
        )
        assert done.task.status.state == pb.TASK_STATE_COMPLETED
        assert done.task.artifacts[0].parts[0].text == "reviewed and published"
        fetched = await client.get_task(pb.GetTaskRequest(id=task.id))
        assert fetched.status.state == pb.TASK_STATE_COMPLETED
        with pytest.raises(UnsupportedOperationError, match="completed"):  # -32004
            await _send(client, _message(data=scenario.APPROVE, task_id=task.id, message_id="m-3"))
        (other,) = await _send(client, _message(text="another", message_id="m-4"))
        cancelled = await client.cancel_task(pb.CancelTaskRequest(id=other.task.id))
        assert cancelled.status.state == pb.TASK_STATE_CANCELED
        with pytest.raises(TaskNotCancelableError, match="canceled"):  # -32002
            await client.cancel_task(pb.CancelTaskRequest(id=other.task.id))
    finally:
        await client.close()
    assert review_server.effects().count("publish") == 1


async def test_streaming_to_the_gate_and_through_it(review_server: Server) -> None:
    client = await create_client(review_server.url, ClientConfig(streaming=True))
    try:
        events = await _send(client, _message(text="a draft", message_id="s-1"))
        assert events[0].HasField("task")
        last = events[-1]
        state = (
            last.status_update.status.state
            if last.HasField("status_update")
            else (last.task.status.state)
        )
        assert state == pb.TASK_STATE_INPUT_REQUIRED
        task_id = events[0].task.id
        events = await _send(
            client, _message(data=scenario.APPROVE, task_id=task_id, message_id="s-2")
        )
        final = events[-1]
        states = [
            e.status_update.status.state if e.HasField("status_update") else e.task.status.state
            for e in events
        ]
        assert states[-1] == pb.TASK_STATE_COMPLETED, states
        assert final is events[-1]
    finally:
        await client.close()


async def _rpc(url: str, body: bytes | dict[str, Any]) -> dict[str, Any]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with httpx.AsyncClient() as http:
        response = await http.post(
            url + "/", content=content, headers={"content-type": "application/json"}
        )
    result: dict[str, Any] = response.json()
    return result


async def test_bad_input_gets_protocol_errors_and_creates_nothing(review_server: Server) -> None:
    url = review_server.url

    def send(parts: Any, **message: Any) -> dict[str, Any]:
        msg = {"messageId": "bad-1", "role": "ROLE_USER", "parts": parts, **message}
        return {"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"message": msg}}

    cases = [
        (b"{not json", -32700),
        (b"[1, 2]", -32600),
        ({"jsonrpc": "2.0", "id": 1, "method": "Nope", "params": {}}, -32601),
        ({"jsonrpc": "1.0", "id": 1, "method": "SendMessage"}, -32600),
        (send([{"text": 5}]), -32602),
        (send("not a list"), -32602),
        (send([]), -32602),
        (send([{"url": "https://example.invalid/x.pdf"}]), -32005),
        (send([{"text": "hi"}], taskId="no-such-task"), -32001),
        (send([{"text": "x" * (70 << 10)}]), -32600),
        ({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": "nope"}}, -32001),
        ({"jsonrpc": "2.0", "id": 3, "method": "CancelTask", "params": {"id": "nope"}}, -32001),
    ]
    for body, code in cases:
        answer = await _rpc(url, body)
        assert answer.get("error", {}).get("code") == code, (body, answer)
    assert await review_server.executions() == []
    assert review_server.effects() == []


async def test_server_killed_mid_task_loses_nothing(tmp_path: Path) -> None:
    server = Server(tmp_path, "slow")
    await server.start()
    try:
        client = await create_client(server.url, ClientConfig(streaming=False, polling=True))
        (first,) = await _send(client, _message(text="go", message_id="k-1"))
        await client.close()
        task_id = first.task.id
        await until(
            lambda: "hold" in server.effects(),
            "the task to reach its held step",
            timeout=DEADLINE,
            every=0.02,
        )
        server.kill()
        (server.holds / "release").touch()
        await server.start()  # continues the task it finds running
        client = await create_client(server.url, ClientConfig(streaming=False))
        try:

            async def completed() -> tuple[Any] | None:
                task = await client.get_task(pb.GetTaskRequest(id=task_id))
                if task.status.state == pb.TASK_STATE_COMPLETED:
                    return (task,)
                assert task.status.state == pb.TASK_STATE_WORKING, task
                return None

            (task,) = await until(
                completed, "the task to complete after the restart", timeout=DEADLINE, every=0.05
            )
            assert task.artifacts[0].parts[0].text == "done: GO!"
            # The same message again: the same task, nothing new runs.
            (again,) = await _send(client, _message(text="go", message_id="k-1"))
            assert again.task.id == task_id
            assert again.task.status.state == pb.TASK_STATE_COMPLETED
        finally:
            await client.close()
    finally:
        server.kill()
    effects = server.effects()
    # The interrupted step runs again (at-least-once); completed ones never do.
    assert (effects.count("before"), effects.count("hold"), effects.count("after")) == (1, 2, 1)
    assert await server.executions() == [task_id]
    async with loom.WorkflowRuntime(SQLiteStore(server.db), timers=False) as rt:
        log = await rt.store.read(task_id)
    assert [e.type for e in log].count(EventType.EXECUTION_STARTED) == 1
    assert EventType.EXECUTION_RECOVERED in [e.type for e in log]


async def test_subscribe_follows_a_task_started_without_waiting(review_server: Server) -> None:
    poller = await create_client(review_server.url, ClientConfig(streaming=False, polling=True))
    streamer = await create_client(review_server.url, ClientConfig(streaming=True))
    try:
        (first,) = await _send(poller, _message(text="a draft", message_id="sub-1"))
        task_id = first.task.id
        events = [e async for e in streamer.subscribe(pb.SubscribeToTaskRequest(id=task_id))]
        assert events[0].HasField("task") and events[0].task.id == task_id
        last = events[-1]
        state = (
            last.status_update.status.state
            if last.HasField("status_update")
            else last.task.status.state
        )
        assert state == pb.TASK_STATE_INPUT_REQUIRED
    finally:
        await poller.close()
        await streamer.close()
