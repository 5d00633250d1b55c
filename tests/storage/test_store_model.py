"""Model-based test of the storage contract: SQLiteStore against the in-memory reference
(RELIABILITY scenario 16). Every operation must have the same outcome on both."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from loom.errors import LoomError
from loom.model import Envelope, EventType
from loom.storage import InMemoryStore, SQLiteStore

IDS = st.sampled_from(["a", "b", "c"])


def _outcome(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except LoomError as exc:
        cause = exc.__cause__
        # Compare Loom-level causes (StartFencedOutError); driver exceptions differ by store.
        return (
            "err",
            type(exc).__name__,
            type(cause).__name__ if isinstance(cause, LoomError) else None,
        )


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.mkdtemp()
        self.ref = InMemoryStore()
        self.sut = SQLiteStore(Path(self.tmp) / "model.db")
        self.fences: dict[str, list[int]] = {}
        self.used_ids: list[str] = []

    def both(self, op: Any) -> tuple[Any, Any]:
        a = _outcome(lambda: self.loop.run_until_complete(op(self.ref)))
        b = _outcome(lambda: self.loop.run_until_complete(op(self.sut)))
        assert a == b, (a, b)
        return a, b

    @rule(eid=IDS)
    def acquire(self, eid: str) -> None:
        a, _ = self.both(lambda s: s.acquire_fence(eid))
        self.fences.setdefault(eid, []).append(a[1])

    @rule(
        eid=IDS,
        count=st.integers(1, 3),
        seq_shift=st.integers(-1, 1),
        which_fence=st.integers(0, 3),
        reuse_id=st.booleans(),
    )
    def append(
        self, eid: str, count: int, seq_shift: int, which_fence: int, reuse_id: bool
    ) -> None:
        fences = self.fences.get(eid) or [1]
        fence = fences[-1 - min(which_fence, len(fences) - 1)]
        last = self.loop.run_until_complete(self.ref.last_sequence(eid))
        first = max(0, last + 1 + seq_shift)
        envs = [
            Envelope.create(
                eid,
                first + i,
                EventType.STEP_COMPLETED if first + i else EventType.EXECUTION_STARTED,
                {"position": first + i, "step_id": "s", "flow_id": "f"},
                fence=fence,
                recorded_at=1.0,
                envelope_id=(self.used_ids[0] if reuse_id and self.used_ids and i == 0 else None),
            )
            for i in range(count)
        ]
        a, _ = self.both(lambda s: s.append(envs))
        if a[0] == "ok":
            self.used_ids.extend(e.envelope_id for e in envs)

    @invariant()
    def same_logs(self) -> None:
        for eid in ("a", "b", "c"):
            ref = self.loop.run_until_complete(self.ref.read(eid))
            sut = self.loop.run_until_complete(self.sut.read(eid))
            assert [e.to_dict() for e in ref] == [e.to_dict() for e in sut]
            assert self.loop.run_until_complete(
                self.ref.current_fence(eid)
            ) == self.loop.run_until_complete(self.sut.current_fence(eid))

    def teardown(self) -> None:
        self.loop.run_until_complete(self.sut.close())
        self.loop.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


StoreMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_sqlite_matches_the_reference = StoreMachine.TestCase
