"""The HTTP worker's wire protocol, shared by the server and the clients.

Every answer other than a 200 result is a JSON object with the same top-level keys, so a client
can classify it without knowing the error types::

    {"error": "<short message>", "code": "<LoomError.code>", "execution_id": "<id or null>",
     "detail": <LoomError.to_dict()>}

The one exception is the superseded refusal (ADR 0004, "Across the wire"), whose body is fixed::

    409 {"error": "execution superseded", "code": "superseded", "execution_id": "<id>"}
"""

from __future__ import annotations

from typing import Any, Final

from loom.errors import (
    ConfigurationError,
    CorruptEventError,
    ExecutionNotFoundError,
    FlowNotFoundError,
    InvalidInputError,
    LoomError,
    PayloadError,
    ResumeError,
    ResumeValidationError,
    SchemaVersionError,
    StorageError,
    WireFormatError,
)

__all__ = [
    "EXECUTE_PATH",
    "HEALTH_PATH",
    "INFLIGHT_PATH",
    "READY_PATH",
    "SUPERSEDED_CODE",
    "error_body",
    "status_for",
    "superseded_body",
]

EXECUTE_PATH: Final = "/execute"
HEALTH_PATH: Final = "/healthz"
READY_PATH: Final = "/readyz"
INFLIGHT_PATH: Final = "/inflight"

SUPERSEDED_CODE: Final = "superseded"
SUPERSEDED_MESSAGE: Final = "execution superseded"

#: Error types a worker must never send as a typed body: a refusal travels only as the 409.
REFUSAL_TYPES: Final = frozenset(
    {"ExecutionAlreadyExistsError", "StaleFenceError", "ExecutionSupersededError"}
)


def superseded_body(execution_id: str) -> dict[str, Any]:
    return {"error": SUPERSEDED_MESSAGE, "code": SUPERSEDED_CODE, "execution_id": execution_id}


def error_body(err: LoomError) -> dict[str, Any]:
    return {
        "error": err.message,
        "code": err.code,
        "execution_id": err.execution_id,
        "detail": err.to_dict(),
    }


# Most specific first: the first isinstance match decides.
_STATUS: Final[tuple[tuple[type[LoomError], int], ...]] = (
    (WireFormatError, 400),
    (ConfigurationError, 400),
    (FlowNotFoundError, 404),
    (ExecutionNotFoundError, 404),
    (InvalidInputError, 422),
    (ResumeValidationError, 422),
    (PayloadError, 422),
    # Not waiting, gate timed out: a conflict with the execution's state, NOT a supersede.
    (ResumeError, 409),
    # A corrupt record or a newer schema will not heal by retrying.
    (CorruptEventError, 500),
    (SchemaVersionError, 500),
    # The store is unreachable or behind: the attempt failed, another may succeed.
    (StorageError, 503),
)


def status_for(err: BaseException) -> int:
    """The HTTP status an error is answered with (500 for everything unclassified)."""
    for cls, status in _STATUS:
        if isinstance(err, cls):
            return status
    return 500
