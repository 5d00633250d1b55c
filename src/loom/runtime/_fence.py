"""The fence a command holds or takes: the :class:`Lease` a caller passes, and the checks
and limits the runtime's commands share."""

from __future__ import annotations

from dataclasses import dataclass

from loom.errors import ConfigurationError, ExecutionSupersededError
from loom.model import execution_id_problem

#: How often a conditional write is retried after losing to a concurrent writer before the
#: caller is told the execution keeps changing (each retry re-reads the log first).
RETRIES = 8


@dataclass(frozen=True, slots=True)
class Lease:
    """A fence the caller holds on one execution (from :meth:`WorkflowRuntime.acquire_lease`
    or a worker's allocation). A command given one appends under it, unconditionally; losing
    it to a newer holder is a superseded refusal. Without one, a command takes the execution
    over conditionally (only if nobody moved since it read the log)."""

    execution_id: str
    fence: int


def held(holder: Lease, execution_id: str | None) -> str:
    if not isinstance(holder, Lease) or holder.fence < 1:
        raise ConfigurationError(f"holder must be a Lease with a fence >= 1, not {holder!r}")
    if execution_id is not None and execution_id != holder.execution_id:
        raise ConfigurationError(
            f"the lease is for execution {holder.execution_id!r}, not {execution_id!r}",
            execution_id=execution_id,
        )
    return holder.execution_id


def check_id(execution_id: str) -> None:
    problem = execution_id_problem(execution_id)
    if problem is not None:
        raise ConfigurationError(f"{problem} (got {execution_id!r})")


def superseded(execution_id: str, cause: BaseException) -> ExecutionSupersededError:
    err = ExecutionSupersededError(
        f"execution {execution_id!r} was superseded by a newer fence holder",
        execution_id=execution_id,
    )
    err.__cause__ = cause
    return err
