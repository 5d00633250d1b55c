from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import loom
from loom.otel import OpenTelemetryInterceptor


async def test_each_step_attempt_is_a_span_and_replays_are_not() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rt = loom.WorkflowRuntime(
        loom.InMemoryStore(),
        interceptors=[OpenTelemetryInterceptor(provider.get_tracer("test"))],
    )

    @loom.step(id="flaky", retry=loom.RetryPolicy(max_attempts=2, initial_backoff=0))
    async def flaky() -> str:
        info = loom.current_step()
        if info is not None and info.attempt == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    @loom.flow(id="traced")
    async def traced(ctx: loom.WorkflowContext) -> str:
        out = await ctx.run(flaky)
        await ctx.suspend("Go")
        return out

    rt.register(traced)
    await (await rt.start(traced, execution_id="t1")).wait_for_suspend()
    await (await rt.resume("t1", "Go", None)).result()  # replays flaky: no new span
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["loom.step flaky", "loom.step flaky"]
    assert [s.attributes["loom.attempt"] for s in spans] == [1, 2]
    assert spans[0].attributes["loom.idempotency_key"] == "t1/0"
    assert spans[0].status.status_code.name == "ERROR"
    with pytest.raises(AssertionError):
        assert spans[1].status.status_code.name == "ERROR"
    await rt.close()
