"""The model layer: events, envelopes, ExecutionState and the pure replay fold. No I/O.

The log's vocabulary is typed and open: each event type has a frozen payload type and one
reducer in a registry. Loom's own events are :class:`EventType` members with the payload types
below; a layer built on Loom adds its namespaced events with :func:`register_event`.
"""

from loom.model._codec import DEFAULT_LIMITS, PayloadLimits, checksum, decode_json, encode_json
from loom.model._events import (
    TERMINAL_STATUSES,
    Envelope,
    EventType,
    ExecutionStatus,
    derived_envelope_id,
    execution_id_problem,
    has_derived_form,
    new_envelope_id,
)
from loom.model._fold import apply_event, replay
from loom.model._registry import (
    EventPayload,
    Payload,
    Reducer,
    event_type_of,
    register_event,
    registered_event_types,
)
from loom.model._state import ExecutionState, Gate, OpKind, OpRecord, OpStatus, WaitOutcome
from loom.model._summary import (
    TIMER_WAIT,
    ExecutionSummary,
    SummaryChange,
    summarize,
    summary_change,
)
from loom.model._vocabulary import (
    DecisionRecorded,
    ExecutionCancelled,
    ExecutionCompleted,
    ExecutionFailed,
    ExecutionForked,
    ExecutionRecovered,
    ExecutionResumed,
    ExecutionStarted,
    ExecutionSuspended,
    StepCompleted,
    StepFailed,
    StepStarted,
    TimerFired,
    TimerScheduled,
    UIPatched,
)

__all__ = [
    "DEFAULT_LIMITS",
    "TERMINAL_STATUSES",
    "TIMER_WAIT",
    "DecisionRecorded",
    "Envelope",
    "EventPayload",
    "EventType",
    "ExecutionCancelled",
    "ExecutionCompleted",
    "ExecutionFailed",
    "ExecutionForked",
    "ExecutionRecovered",
    "ExecutionResumed",
    "ExecutionStarted",
    "ExecutionState",
    "ExecutionStatus",
    "ExecutionSummary",
    "ExecutionSuspended",
    "Gate",
    "OpKind",
    "OpRecord",
    "OpStatus",
    "Payload",
    "PayloadLimits",
    "Reducer",
    "StepCompleted",
    "StepFailed",
    "StepStarted",
    "SummaryChange",
    "TimerFired",
    "TimerScheduled",
    "UIPatched",
    "WaitOutcome",
    "apply_event",
    "checksum",
    "decode_json",
    "derived_envelope_id",
    "encode_json",
    "event_type_of",
    "execution_id_problem",
    "has_derived_form",
    "new_envelope_id",
    "register_event",
    "registered_event_types",
    "replay",
    "summarize",
    "summary_change",
]
