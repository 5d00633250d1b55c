"""A local HTTP server on 127.0.0.1 that answers SDK calls with recorded wire-format JSON.

Each provider test points the official SDK's ``base_url`` at it; the server keeps every
request (method, path, headers, JSON body) so a test can check exactly what went out.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Answer = tuple[int, dict[str, str], Any]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class WireServer:
    """Answers each request with ``respond(seen)`` or, when it is a list, the next entry."""

    respond: Callable[[Seen], Answer] | list[Answer]
    requests: list[Seen] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def base_url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aenter__(self) -> WireServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _answer(self, seen: Seen) -> Answer:
        if callable(self.respond):
            return self.respond(seen)
        if not self.respond:
            return 500, {}, {"error": "the test scripted no more answers"}
        return self.respond.pop(0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, target, _ = line.decode().split(" ", 2)
                headers: dict[str, str] = {}
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    k, v = h.decode().split(":", 1)
                    headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length", "0"))
                raw = await reader.readexactly(length) if length else b""
                seen = Seen(method, target, headers, json.loads(raw) if raw else None)
                self.requests.append(seen)
                status, extra, payload = self._answer(seen)
                body = json.dumps(payload).encode()
                head = [f"HTTP/1.1 {status} X", "content-type: application/json"]
                head += [f"{k}: {v}" for k, v in extra.items()]
                head.append(f"content-length: {len(body)}")
                writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            self._tasks.discard(task)
            writer.close()
