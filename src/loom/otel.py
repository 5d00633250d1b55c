"""OpenTelemetry tracing for steps (extra ``loom-runtime[otel]``), as a step interceptor.

    runtime = loom.WorkflowRuntime(store, interceptors=[loom.otel.OpenTelemetryInterceptor()])

Each attempt of a step's effect becomes a span ``loom.step <id>`` with the execution id,
position, attempt and idempotency key as attributes; a failing attempt records its exception.
Replayed steps create no span: they run nothing.
"""

from __future__ import annotations

from typing import Any

from loom.errors import ConfigurationError
from loom.runtime._intercept import CallNext, StepCall

__all__ = ["OpenTelemetryInterceptor"]


class OpenTelemetryInterceptor:
    """Traces each step attempt as a span (``tracer`` defaults to the global ``loom`` one)."""

    def __init__(self, tracer: Any = None) -> None:
        if tracer is None:
            try:
                from opentelemetry import trace
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise ConfigurationError(
                    "OpenTelemetry is not installed",
                    hint="pip install 'loom-runtime[otel]'",
                ) from exc
            tracer = trace.get_tracer("loom")
        self.tracer = tracer

    async def invoke(self, call: StepCall, call_next: CallNext) -> Any:
        info = call.info
        with self.tracer.start_as_current_span(
            f"loom.step {info.step_id}",
            attributes={
                "loom.execution_id": info.execution_id,
                "loom.step_id": info.step_id,
                "loom.position": info.position,
                "loom.attempt": info.attempt,
                "loom.idempotency_key": info.idempotency_key,
            },
        ):
            return await call_next(call)
