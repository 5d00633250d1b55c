"""Every error Loom raises, rooted at :class:`LoomError`.

The tree::

    LoomError
    ├── TerminalError                      a step's failure no retry can fix (never retried)
    ├── RetryableError                     a step's transient failure (``retry_after``)
    ├── ConfigurationError                 bad arguments / environment
    ├── PayloadError                       not JSON, too large, too deep (nothing stored)
    ├── FlowNotFoundError                  unknown flow id or unregistered version
    ├── ExecutionNotFoundError             unknown execution id
    ├── ExecutionAlreadyExistsError        a start lost the sequence-0 race
    ├── InvalidInputError                  flow input fails the flow's schema
    ├── ResumeError                        a resume the execution cannot take
    │   ├── ResumeValidationError          payload fails the gate's resume schema
    │   ├── NotWaitingError                not suspended on that event
    │   │   └── GateSupersededError        a promoted branch took the gate's place
    │   └── GateTimedOutError              the gate's timeout already fired
    ├── ForkError                          a fork the parent's log cannot give
    ├── BranchError                        a branch-ref operation refused (nothing changed)
    │   ├── InvalidRefNameError            not a valid ref name
    │   ├── RefNotFoundError               no ref of that name
    │   ├── RefExistsError                 a ref of that name points elsewhere
    │   ├── InvalidRefMoveError            a tip moved backwards or past its execution's head
    │   └── RefConflictError               a compare-and-swap lost: the ref moved
    │       └── PromotionConflictError     the target is no longer what the branch forked from
    ├── NonDeterminismError                replay asked for a different operation
    ├── UnknownEventError                  an event type this process cannot fold
    ├── ConcurrentWaitError                a flow awaited two gates/sleeps at once
    ├── StepFailedError                    a step exhausted its retry policy
    ├── ExecutionFailedError               the flow raised; carries the recorded error
    ├── ExecutionCancelledError            the execution was cancelled
    ├── ExecutionSupersededError           another holder owns the execution now
    ├── RuntimeClosedError                 the runtime stopped driving it (still resumable)
    ├── AuthenticationError                an HTTP worker refused the caller (401)
    ├── DispatchError                      placement could not run a package
    │   ├── CircuitOpenError               the supervisor's circuit is open
    │   ├── RemoteWorkerError              a remote attempt failed without an outcome
    │   └── WireFormatError                a package/result of an unknown shape or version
    └── StorageError
        ├── StorageWriteError              the write did not happen (may carry a cause)
        ├── StaleFenceError                an older fence holder tried to write
        ├── StartFencedOutError            a start fenced out by a holder that wrote nothing
        ├── DuplicateSequenceError         expected sequence mismatch (gap or repeat)
        ├── DuplicateEnvelopeIdError       envelope id already stored
        ├── ExecutionEndedError            an append after the execution's terminal event
        ├── CorruptEventError              checksum mismatch or undecodable record
        └── SchemaVersionError             the database was written by a newer Loom

Every error names the execution it concerns (``execution_id``) where there is one, and says
what to do next (``hint``). ``to_dict`` / :func:`error_from_dict` round-trip them through JSON,
which is how errors are recorded in the log and carried across HTTP. Every subclass (yours too)
is known to :func:`error_from_dict` by its class name once its module is imported.

A step's own code says whether retrying can help: raise :class:`TerminalError` to fail the step
at once whatever its :class:`~loom.RetryPolicy`, or :class:`RetryableError` with
``retry_after`` to have the next attempt wait exactly that long.

What an error says beyond its message is a typed attribute (``StaleFenceError.current_fence``,
``StorageWriteError.outcome``, ``NonDeterminismError.position``...); ``details`` holds the same
values as JSON, which is the recorded form.
"""

from __future__ import annotations

import enum
import inspect
from datetime import timedelta
from typing import Any, ClassVar

__all__ = [
    "AuthenticationError",
    "BranchError",
    "ChildFailedError",
    "CircuitOpenError",
    "ConcurrentWaitError",
    "ConfigurationError",
    "CorruptEventError",
    "DispatchError",
    "DuplicateEnvelopeIdError",
    "DuplicateSequenceError",
    "ExecutionAlreadyExistsError",
    "ExecutionCancelledError",
    "ExecutionEndedError",
    "ExecutionFailedError",
    "ExecutionNotFoundError",
    "ExecutionSupersededError",
    "FlowNotFoundError",
    "ForkError",
    "GateSupersededError",
    "GateTimedOutError",
    "InvalidInputError",
    "InvalidRefMoveError",
    "InvalidRefNameError",
    "LoomError",
    "NonDeterminismError",
    "NotALoomDatabaseError",
    "NotWaitingError",
    "PayloadError",
    "PromotionConflictError",
    "RefConflictError",
    "RefExistsError",
    "RefNotFoundError",
    "RemoteWorkerError",
    "ResumeError",
    "ResumeValidationError",
    "RetryableError",
    "RuntimeClosedError",
    "SchemaVersionError",
    "StaleFenceError",
    "StartFencedOutError",
    "StepFailedError",
    "StorageError",
    "StorageWriteError",
    "TerminalError",
    "UnknownEventError",
    "WireFormatError",
    "WriteOutcome",
    "error_from_dict",
]

#: Every LoomError subclass by class name (filled by ``LoomError.__init_subclass__``).
_BY_NAME: dict[str, type[LoomError]] = {}


class LoomError(Exception):
    """Root of every error Loom raises on purpose."""

    code: ClassVar[str] = "loom_error"
    default_hint: ClassVar[str | None] = None
    #: Names of the typed attributes a subclass declares (bare annotations); each is read
    #: from the keyword of the same name (None when absent) and kept in ``details`` as well.
    _typed: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The first class of a name wins: a user's class never shadows Loom's own.
        _BY_NAME.setdefault(cls.__name__, cls)
        own = [
            name
            for name, hint in inspect.get_annotations(cls).items()
            if not str(hint).startswith(("ClassVar", "typing.ClassVar"))
        ]
        cls._typed = tuple(dict.fromkeys([*cls._typed, *own]))

    def __init__(
        self,
        message: str,
        *,
        execution_id: str | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        self.message = message
        self.execution_id = execution_id
        self.hint = hint if hint is not None else self.default_hint
        self.details: dict[str, Any] = details
        for name in self._typed:
            setattr(self, name, details.get(name))
        text = message
        if execution_id is not None and execution_id not in message:
            text = f"{message} (execution {execution_id!r})"
        if self.hint:
            text = f"{text}. {self.hint}"
        super().__init__(text)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: ``type``, ``code``, ``message``, ids and details."""
        return {
            "type": type(self).__name__,
            "code": self.code,
            "message": self.message,
            "execution_id": self.execution_id,
            "hint": self.hint,
            "details": _jsonable(self.details),
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


class TerminalError(LoomError):
    """Raise it from a step for a failure no retry can fix (a declined card, a 400 answer):
    the step fails at once, whatever its retry policy, and the flow sees StepFailedError.

    Subclass it for your own terminal failures; they are recorded with their class name.
    """

    code = "terminal"


class RetryableError(LoomError):
    """Raise it from a step for a transient failure. The step's :class:`~loom.RetryPolicy`
    still bounds the attempts; ``retry_after`` (seconds or a timedelta), when given, replaces
    the policy's backoff before the next attempt (a server's ``Retry-After``)."""

    code = "retryable"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | timedelta | None = None,
        execution_id: str | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        seconds = retry_after.total_seconds() if isinstance(retry_after, timedelta) else retry_after
        if seconds is not None:
            seconds = float(seconds)
            if not 0 <= seconds < float("inf"):  # also refuses NaN
                raise ValueError("retry_after must be a finite, non-negative number of seconds")
            details["retry_after"] = seconds
        super().__init__(message, execution_id=execution_id, hint=hint, **details)
        self.retry_after: float | None = seconds


class ConfigurationError(LoomError):
    code = "configuration"


class PayloadError(LoomError):
    """A value could not be stored: not JSON, NaN/Infinity, too large or too deeply nested."""

    code = "payload"


class FlowNotFoundError(LoomError):
    code = "flow_not_found"
    default_hint = "Register the flow (runtime.register(flow)) in the process that runs it"


class ExecutionNotFoundError(LoomError):
    code = "execution_not_found"
    default_hint = "Check the id with `loom executions`"


class ExecutionAlreadyExistsError(LoomError):
    """A start lost the sequence-0 race: another holder started this execution id first."""

    code = "execution_exists"
    default_hint = (
        "Await the existing execution with runtime.handle(id).result(), start with "
        "if_exists='attach', or pick another execution id"
    )


class InvalidInputError(LoomError):
    code = "invalid_input"


class ResumeError(LoomError):
    code = "resume"


class ResumeValidationError(ResumeError):
    """The resume payload failed the gate's schema; nothing was appended."""

    code = "resume_invalid"


class NotWaitingError(ResumeError):
    code = "not_waiting"


class GateSupersededError(NotWaitingError):
    """The gate was closed by the promotion of a branch forked at it: the branch carries the
    work on, so a decision for the parent's gate is refused (``superseded_by`` names it)."""

    code = "gate_superseded"
    default_hint = "Decide the gate in the promoted branch instead"
    event_type: str | None
    superseded_by: str | None


class ForkError(LoomError):
    """A fork the parent's log cannot give: a sequence past its head, inside a step (its
    attempt started and has no record yet), or at its terminal event. Nothing was written."""

    code = "fork_refused"
    default_hint = "Pick a sequence between steps; `loom logs ID` shows the timeline"
    at_sequence: int | None
    head: int | None


class BranchError(LoomError):
    """A branch-ref operation was refused; no ref changed."""

    code = "branch"
    ref: str | None


class InvalidRefNameError(BranchError):
    code = "invalid_ref_name"
    default_hint = (
        "A ref name is 1-200 characters of letters, digits and . _ - / (no leading or "
        "trailing /, no //, no ..)"
    )


class RefNotFoundError(BranchError):
    code = "ref_not_found"
    default_hint = "`loom branches` lists the refs"


class RefExistsError(BranchError):
    code = "ref_exists"
    default_hint = (
        "Pick another name (`loom branches` lists the taken ones), or move the existing ref "
        "onto a branch with `loom promote FROM TO --by NAME`"
    )


class InvalidRefMoveError(BranchError):
    """A tip move that is not forward along its execution: backwards (use a new ref, or a
    fork, to name an earlier point) or past the last event the execution has recorded."""

    code = "invalid_ref_move"
    default_hint = (
        "A ref's tip only moves forward, to a sequence its execution has recorded; "
        "`loom logs ID` shows them"
    )
    tip: int | None
    sequence: int | None
    head: int | None


class RefConflictError(BranchError):
    """A compare-and-swap lost: the ref is not where the caller expected it."""

    code = "ref_conflict"
    default_hint = "Re-read the ref (`loom branches`) and decide again"
    expected: Any
    actual: Any


class PromotionConflictError(RefConflictError):
    """The promotion is not a fast-forward: the target ref no longer points at the state the
    branch was forked from (another branch was promoted first, or the parent moved on)."""

    code = "promotion_conflict"


class GateTimedOutError(ResumeError):
    """The gate's timeout fired before the decision arrived; the late decision is refused."""

    code = "gate_timed_out"
    event_type: str | None
    position: int | None


class NonDeterminismError(LoomError):
    """Replay asked for a different operation than the log holds at that position.

    ``position`` is where, ``recorded`` what the log holds there (``kind:name``) and
    ``requested`` what the code asked for instead (``kind:name`` or ``return``).
    """

    code = "non_determinism"
    position: int | None
    recorded: str | None
    requested: str | None
    default_hint = (
        "The flow's code changed under a running execution; deploy the change as a new flow "
        "version and keep the old version registered until its executions finish"
    )


class UnknownEventError(LoomError):
    """The log holds an event type no reducer is registered for in this process.

    Not corruption: the record is intact (its checksum passed). It was written by a newer Loom
    or by an extension (``agents.*``, ``branches.*``) this process has not imported. ``details``
    carries the ``sequence`` and the ``event_type``.
    """

    code = "unknown_event"
    sequence: int | None
    event_type: str | None
    default_hint = (
        "Upgrade Loom, or import the extension that registers this event type "
        "(loom.register_event) in this process; nothing was changed"
    )


class ConcurrentWaitError(LoomError):
    """A flow awaited a second durable wait (gate or sleep) while another was still open.

    An execution waits on one thing at a time; awaiting two at once (``asyncio.gather`` of two
    ``ctx.suspend`` calls) is refused where it happens and fails the execution, rather than
    leaving one wait unreachable.
    """

    code = "concurrent_wait"
    default_hint = (
        "Await the gates one after the other, or wait for one event type and branch on its payload"
    )


class StepFailedError(LoomError):
    """A step failed on every attempt of its retry policy (or raised TerminalError); the flow
    may catch this. ``error`` is the last attempt's recorded error (``type``, ``message``...).

    ``error_type`` is the class name of the step's last exception as recorded (the same on
    replay); :meth:`caused_by` tells a ``ValueError`` from a timeout. A type registered with
    ``loom.register_error`` reaches the flow as itself instead.
    """

    code = "step_failed"
    step_id: str | None
    position: int | None
    attempts: int | None
    error: dict[str, Any] | None

    @property
    def error_type(self) -> str | None:
        """The class name of the step's last exception as recorded, e.g. ``"ValueError"``."""
        value = (self.details.get("error") or {}).get("type")
        return str(value) if value is not None else None

    def caused_by(self, *types: type[BaseException]) -> bool:
        """Whether the step's last exception was one of ``types``: ``isinstance`` on the live
        exception when this attempt raised it here; on replay, where only the record is
        left, the recorded class name equals one of theirs."""
        cause = self.__cause__
        if cause is not None:
            return isinstance(cause, types)
        return self.error_type in {t.__name__ for t in types}


class ExecutionFailedError(LoomError):
    code = "execution_failed"


class ExecutionCancelledError(LoomError):
    code = "execution_cancelled"


class ChildFailedError(LoomError):
    """A child execution (``ctx.call`` / ``ctx.start_child`` / ``ctx.fan_out``) failed or
    was cancelled. ``execution_id`` is the parent's; ``child_id`` the child's, ``status``
    how it ended (``failed`` or ``cancelled``), ``error`` its recorded error (type, message)
    and ``reason`` a cancellation's reason. The parent may catch it."""

    code = "child_failed"
    child_id: str | None
    status: str | None
    error: dict[str, Any] | None
    reason: str | None


class ExecutionSupersededError(LoomError):
    """Another holder (a newer fence) owns the execution; await it by id instead."""

    code = "superseded"
    default_hint = "Another holder owns this execution; await its outcome by id (load_state)"


class RuntimeClosedError(LoomError):
    """The runtime driving an execution was closed; the execution is left resumable."""

    code = "runtime_closed"
    default_hint = "Recover it from a live runtime (runtime.recover or recover_abandoned)"


class DispatchError(LoomError):
    """A dispatcher gave up on a package (every attempt failed); ``__cause__`` is the last."""

    code = "dispatch"


class CircuitOpenError(DispatchError):
    code = "circuit_open"
    default_hint = "The target kept failing; the supervisor refuses work until its reset delay"


class WireFormatError(DispatchError):
    code = "wire_format"


class AuthenticationError(LoomError):
    """A caller of the HTTP worker could not be authenticated; nothing was run.

    The worker answers it as ``401`` with a ``WWW-Authenticate: Bearer`` header. The message a
    caller sees is deliberately coarse (which check failed is logged on the worker only).
    """

    code = "unauthenticated"
    default_hint = (
        "Send 'Authorization: Bearer <token>' with the worker's token or a valid ID token"
    )


class RemoteWorkerError(DispatchError):
    """An attempt on a remote worker failed without an outcome: a failed attempt.

    Raised for connection errors and timeouts (``unreachable`` is True), 5xx answers, 401/403
    and every 409 that is not the exact superseded refusal for the package's execution. A
    dispatcher retries it (it is never a superseded refusal). ``status`` is the HTTP status, or
    None when no answer arrived; ``remote`` is the worker's typed error body, if it sent one.
    """

    code = "remote_worker"
    default_hint = (
        "The execution is resumable: a redispatch (to this or another worker) continues it"
    )

    def __init__(
        self,
        message: str,
        *,
        execution_id: str | None = None,
        hint: str | None = None,
        status: int | None = None,
        unreachable: bool = False,
        remote: dict[str, Any] | None = None,
        **details: Any,
    ) -> None:
        super().__init__(
            message,
            execution_id=execution_id,
            hint=hint,
            status=status,
            unreachable=unreachable,
            remote=remote,
            **details,
        )
        self.status = status
        self.unreachable = unreachable
        self.remote = remote


class StorageError(LoomError):
    code = "storage"


class WriteOutcome(enum.StrEnum):
    """What a failed write left behind (:attr:`StorageWriteError.outcome`)."""

    #: Nothing was written: safe to retry.
    NOT_APPLIED = "not_applied"
    #: The store lost the answer to its COMMIT and could not find out: re-read first.
    UNKNOWN = "unknown"
    #: The write is durable but its acknowledgement failed: re-read, do not write it again.
    COMMITTED = "committed"


class StorageWriteError(StorageError):
    """A write failed. ``__cause__`` says why when the store knows; ``outcome`` says whether
    anything was written (:class:`WriteOutcome`, ``NOT_APPLIED`` unless the store says)."""

    code = "storage_write"

    def __init__(
        self,
        message: str,
        *,
        outcome: WriteOutcome | str = "not_applied",
        execution_id: str | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        resolved = WriteOutcome(outcome)
        if resolved is not WriteOutcome.NOT_APPLIED:
            details["outcome"] = resolved.value  # the recorded (JSON) form, as before
        super().__init__(message, execution_id=execution_id, hint=hint, **details)
        self.outcome: WriteOutcome = resolved


class StaleFenceError(StorageError):
    """An append carried a fence older than the execution's current one (a zombie holder)."""

    code = "stale_fence"
    fence: int | None
    current_fence: int | None


class StartFencedOutError(StorageError):
    """A start was fenced out by a holder that has not written sequence 0 (safe to retry)."""

    code = "start_fenced_out"
    fence: int | None
    current_fence: int | None


class DuplicateSequenceError(StorageError):
    """The batch did not start at the execution's next sequence (``expected``; it was ``got``)."""

    code = "duplicate_sequence"
    expected: int | None
    got: int | None


class DuplicateEnvelopeIdError(StorageError):
    code = "duplicate_envelope_id"


class ExecutionEndedError(StorageError):
    """An append after the execution's terminal event (completed, failed, cancelled).

    Nothing was written: a terminal event is the last record of a log, whoever tries to write
    after it (a flow's leftover task, a zombie, a racing resume).
    """

    code = "execution_ended"
    default_hint = "The execution already ended; read its outcome with load_state"


class CorruptEventError(StorageError):
    """A stored record failed its checksum or could not be decoded."""

    code = "corrupt_event"
    sequence: int | None
    default_hint = (
        "The stored record was altered outside Loom; restore the database from a backup. "
        "Other executions are unaffected"
    )


class SchemaVersionError(StorageError):
    code = "schema_version"
    default_hint = "Upgrade loom-runtime to the version that wrote this database"


class NotALoomDatabaseError(StorageError):
    """The file or URL opened as a store is not a Loom database (or does not exist)."""

    code = "not_a_loom_database"
    default_hint = "Check the path or URL: point it at a Loom database (or a new file)"


_BY_NAME["LoomError"] = LoomError


_RESERVED = frozenset({"message", "execution_id", "hint"})


def error_from_dict(data: dict[str, Any]) -> LoomError:
    """Rebuild an error from :meth:`LoomError.to_dict` output (unknown types become LoomError)."""
    cls = _BY_NAME.get(str(data.get("type")), LoomError)
    details = data.get("details") or {}
    if not isinstance(details, dict):
        details = {}
    details = {k: v for k, v in details.items() if k not in _RESERVED and isinstance(k, str)}
    message = str(data.get("message", ""))
    try:
        return cls(message, execution_id=data.get("execution_id"), hint=data.get("hint"), **details)
    except (TypeError, ValueError):
        # Details this version's class cannot take (a newer writer's): keep them untyped.
        return LoomError(
            message, execution_id=data.get("execution_id"), hint=data.get("hint"), **details
        )
