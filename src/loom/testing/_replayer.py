"""A public replayer: check that a flow's current code still replays a recorded log."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loom.errors import ExecutionEndedError, NonDeterminismError
from loom.model import DEFAULT_LIMITS, Envelope, ExecutionState, ExecutionStatus, replay
from loom.runtime import Flow, SystemClock
from loom.runtime._context import SuspendExecution, WorkflowContext
from loom.runtime._driver import Driver
from loom.storage import InMemoryStore

__all__ = ["replay_flow"]


class _ReadOnly(InMemoryStore):
    """Replay must only read: a flow that wants to write has gone past (or off) the log."""

    async def append(self, envelopes: Sequence[Envelope]) -> None:
        first = envelopes[0]
        raise NonDeterminismError(
            f"replay of {first.execution_id!r} went beyond the recorded log: the code now "
            f"records {first.type!s} {dict(first.payload)!r} at sequence {first.sequence}",
            execution_id=first.execution_id,
            sequence=first.sequence,
            requested=str(first.type),
        )


async def replay_flow(flow: Flow[Any, Any], envelopes: Sequence[Envelope]) -> ExecutionState:
    """Run ``flow``'s code against a recorded log without running any effect.

    Raises :class:`NonDeterminismError` at the first position where the code asks for
    something other than what the log recorded, if the code would record anything the log
    lacks, or if a completed log's output differs. Keep golden logs of your flows and run this
    in CI whenever flow code changes (``tests/golden`` in Loom does this for its own flows).
    """
    state = replay(envelopes)
    if state.flow_id != flow.id:
        raise NonDeterminismError(
            f"the log is of flow {state.flow_id!r}, not {flow.id!r}",
            execution_id=state.execution_id,
        )
    driver = Driver(
        _ReadOnly(),
        state.copy(),
        state.fence,
        SystemClock(),
        snapshot_every=1 << 30,
        limits=DEFAULT_LIMITS,
        last_snapshot=state.last_sequence,
    )
    ctx = WorkflowContext(driver, flow)
    try:
        if flow.takes_input:
            out = await flow.fn(ctx, flow.input.load(state.input))
        else:
            out = await flow.fn(ctx)
    except SuspendExecution:
        return state
    except NonDeterminismError:
        raise
    except ExecutionEndedError as exc:
        raise NonDeterminismError(
            f"replay of {state.execution_id!r} went beyond the recorded log: the code now "
            f"records more after its {state.status} outcome",
            execution_id=state.execution_id,
        ) from exc
    except Exception:
        # The code raised where the log recorded a failure (or a cancellation the flow
        # re-raised while cleaning up): that is a faithful replay.
        if state.error is None and state.status is not ExecutionStatus.CANCELLED:
            raise
        return state
    ctx._check_fully_replayed()
    if state.is_terminal and state.output != flow.output.dump(out, "replayed output"):
        raise NonDeterminismError(
            f"replay of {state.execution_id!r} returned a different output than recorded",
            execution_id=state.execution_id,
        )
    return state
