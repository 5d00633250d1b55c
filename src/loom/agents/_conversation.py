"""An agent's conversation as content-addressed messages, and the request fingerprint.

Each message has an address (the sha256 of its canonical JSON). Messages the user or a tool
adds live in the execution store's :class:`~loom.storage.BlobStore`, written before the event
that first names them; a model's response is recorded inline in its model-call event. So a
conversation of N turns stores each message once. Replay needs only the addresses: content is
fetched (in one batch) when the next live model call needs the whole history.
"""

from __future__ import annotations

import hashlib
from typing import Any

from loom.errors import ConfigurationError, CorruptEventError, NonDeterminismError, PayloadError
from loom.llm import CompletionRequest, Message, canonical_json
from loom.model import PayloadLimits
from loom.storage import BlobStore

__all__ = ["Conversation", "fingerprint", "short_hash", "static_fingerprint"]


def short_hash(value: Any) -> str:
    """A 12-hex-digit digest of a JSON value: enough to tell a changed component (this is a
    change detector recorded every turn, not an address)."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:12]


def fingerprint(request: CompletionRequest, history: str) -> dict[str, str]:
    """What a recorded model call is compared against on replay, component by component."""
    return {**static_fingerprint(request), "history": history}


def static_fingerprint(request: CompletionRequest) -> dict[str, str]:
    """The components that do not change during a run (an agent computes them once)."""
    return {
        "instructions": short_hash(request.system),
        "tools": short_hash([t.to_dict() for t in request.tools]),
        "parameters": short_hash(request.parameters()),
    }


def check_fingerprint(
    recorded: Any, current: dict[str, str], *, agent_id: str, turn: int, execution_id: str
) -> None:
    """Raise NonDeterminismError naming the turn and every component that changed."""
    if recorded == current:
        return
    if not isinstance(recorded, dict):
        recorded = {}
    changed = sorted(k for k in current if recorded.get(k) != current[k])
    raise NonDeterminismError(
        f"agent {agent_id!r} turn {turn} of execution {execution_id!r}: the model call "
        f"recorded there was made with different {', '.join(changed)} than the code makes now",
        execution_id=execution_id,
        agent=agent_id,
        turn=turn,
        changed=changed,
    )


class Conversation:
    """The messages of one agent run, by address, with the contents fetched lazily."""

    def __init__(self, blobs: BlobStore | None, execution_id: str, limits: PayloadLimits) -> None:
        self.blobs = blobs
        self.execution_id = execution_id
        self.limits = limits
        self.hashes: list[str] = []
        self.contents: dict[str, Message] = {}
        self.chain = ""
        #: Addresses the next model call's event names first (input, feedback, observations);
        #: a tool's result is named by its own tool-call event instead.
        self.added: list[str] = []
        #: Messages to put in the blob store before the next event naming them.
        self.pending: dict[str, bytes] = {}
        #: The fingerprint of the previous model call, as recorded (components carried forward).
        self.last_fp: dict[str, str] = {}

    def _append(self, digest: str) -> None:
        self.hashes.append(digest)
        self.chain = hashlib.sha256(f"{self.chain}:{digest}".encode()).hexdigest()[:24]

    @staticmethod
    def encode(message: Message, limits: PayloadLimits, what: str) -> tuple[str, bytes]:
        """The message's address and stored bytes; PayloadError when over the limit."""
        data = canonical_json(message.to_dict()).encode()
        if len(data) > limits.max_bytes:
            raise PayloadError(
                f"{what} is {len(data)} bytes, over the {limits.max_bytes}-byte limit",
                hint="Return less (a summary, or a reference to where the data is)",
            )
        return hashlib.sha256(data).hexdigest(), data

    def add(self, message: Message, what: str = "message") -> str:
        """Add a user-side message (input, feedback, an error observation): stored with the
        next model call."""
        digest, data = self.encode(message, self.limits, what)
        self.contents[digest] = message
        self.pending[digest] = data
        self._append(digest)
        self.added.append(digest)
        return digest

    def add_stored(self, digest: str, message: Message | None = None) -> None:
        """Add a message a tool step already stored (and named) under ``digest``."""
        if message is not None:
            self.contents[digest] = message
        self._append(digest)

    def add_response(self, message: Message) -> None:
        """Add the model's response (recorded inline in its model-call event)."""
        digest = hashlib.sha256(canonical_json(message.to_dict()).encode()).hexdigest()
        self.contents[digest] = message
        self._append(digest)

    def take_added(self) -> list[str]:
        added, self.added = self.added, []
        return added

    def take_pending(self) -> dict[str, bytes]:
        """The messages to store with the next event (which names them), handed over once."""
        if not self.pending:
            return {}
        self.require_blobs()
        pending, self.pending = self.pending, {}
        return pending

    def require_blobs(self) -> BlobStore:
        if self.blobs is None:
            raise ConfigurationError(
                f"execution {self.execution_id!r} runs an agent, but the runtime's store keeps "
                "no blobs (BlobStore)",
                execution_id=self.execution_id,
                hint="Use a store with blob storage: InMemoryStore, SQLiteStore, PostgresStore",
            )
        return self.blobs

    async def messages(self) -> tuple[Message, ...]:
        """Every message, in order, fetching the ones only known by address."""
        missing = [h for h in self.hashes if h not in self.contents]
        if missing:
            found = await self.require_blobs().get_blobs(set(missing))
            for digest in missing:
                data = found.get(digest)
                if data is None:
                    raise CorruptEventError(
                        f"execution {self.execution_id!r} names message {digest[:12]}... "
                        "that the blob store does not hold",
                        execution_id=self.execution_id,
                        blob=digest,
                    )
                from loom.model import decode_json

                self.contents[digest] = Message.from_dict(decode_json(data, limits=self.limits))
        return tuple(self.contents[h] for h in self.hashes)
