"""``loom.agent``: an LLM agent whose every model call and tool call is a durable step."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic

from loom import faults
from loom.agents._approval import approval_gate
from loom.agents._conversation import Conversation, check_fingerprint, static_fingerprint
from loom.agents._events import MODEL_STEP_PREFIX, ModelCalled
from loom.agents._live import LIVE
from loom.agents._tool import Tool, ToolArgumentsError
from loom.errors import ConfigurationError, LoomError, PayloadError, StepFailedError
from loom.llm import (
    CompletionRequest,
    CompletionResponse,
    LlmProvider,
    Message,
    ProviderError,
    StreamingProvider,
    ToolCallPart,
    ToolResultPart,
    Usage,
    canonical_json,
)
from loom.model import DecisionRecorded, OpKind
from loom.runtime import CallNext, Flow, RetryPolicy, Step, StepCall, WorkflowContext
from loom.runtime._sdk import _Codec

__all__ = [
    "Agent",
    "AgentOutputError",
    "AgentResult",
    "Budget",
    "Outcome",
    "Price",
    "UsageAccounting",
    "agent",
]

Outcome = Literal["completed", "budget_exhausted", "max_turns"]


class AgentOutputError(LoomError):
    """The model's final answer kept failing the agent's ``output_type``."""

    code = "agent_output"


@dataclass(frozen=True, slots=True)
class Price:
    """What a model costs, in your currency per million tokens."""

    input_per_mtok: float
    output_per_mtok: float
    cache_read_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None

    def cost(self, usage: Usage) -> float:
        cache_read = self.cache_read_per_mtok
        cache_write = self.cache_write_per_mtok
        total = (
            usage.input_tokens * self.input_per_mtok + usage.output_tokens * self.output_per_mtok
        )
        total += usage.cache_read_tokens * (
            self.input_per_mtok if cache_read is None else cache_read
        )
        total += usage.cache_write_tokens * (
            self.input_per_mtok if cache_write is None else cache_write
        )
        return total / 1_000_000


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits on one agent run; the first one reached ends it with ``budget_exhausted``.

    ``max_tokens`` counts input + output tokens over every call. ``max_cost`` needs a
    ``prices`` entry for the agent's model (your price table: Loom ships none).
    """

    max_turns: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    prices: Mapping[str, Price] = field(default_factory=dict)

    def cost(self, model: str, usage: Usage) -> float | None:
        price = self.prices.get(model)
        return None if price is None else price.cost(usage)

    def exhausted(self, turns: int, usage: Usage, cost: float | None) -> str | None:
        """Which limit is reached, or None."""
        return self.reached(turns, usage.total_tokens, cost)

    def reached(self, turns: int, tokens: int, cost: float | None) -> str | None:
        """Which limit ``turns`` model calls using ``tokens`` and costing ``cost`` reach."""
        if self.max_turns is not None and turns >= self.max_turns:
            return "turns"
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return "tokens"
        if self.max_cost is not None and cost is not None and cost >= self.max_cost:
            return "cost"
        return None


@dataclass(frozen=True, slots=True)
class AgentResult:
    """How an agent run ended: its (validated) ``output``, why it stopped, what it used."""

    output: Any
    outcome: Outcome
    turns: int
    usage: Usage
    cost: float | None = None
    text: str = ""
    exhausted: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "outcome": self.outcome,
            "turns": self.turns,
            "usage": self.usage.to_dict(),
            "cost": self.cost,
            "text": self.text,
            "exhausted": self.exhausted,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AgentResult:
        return cls(
            d.get("output"),
            d["outcome"],
            int(d["turns"]),
            Usage.from_dict(d.get("usage") or {}),
            d.get("cost"),
            str(d.get("text", "")),
            d.get("exhausted"),
        )


class UsageAccounting:
    """The model-call step's own interceptor: annotates each call's record with the tokens
    it used (input + output) and, when the budget prices the model, its cost.

    The loop's budget reads these annotations back from the log, so token and cost
    accounting happens once, where the call is recorded; an interceptor of the runtime (it
    runs outside this one) finds them in ``call.annotations`` after ``call_next`` returns.
    """

    def __init__(self, model: str, budget: Budget) -> None:
        self.model = model
        self.budget = budget

    def annotations(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """What a model call's record is annotated with (``tokens``, maybe ``cost``)."""
        usage = Usage.from_dict(record["response"].get("usage") or {})
        notes: dict[str, Any] = {"tokens": usage.total_tokens}
        cost = self.budget.cost(self.model, usage)
        if cost is not None:
            notes["cost"] = cost
        return notes

    async def invoke(self, call: StepCall, call_next: CallNext) -> Any:
        record = await call_next(call)
        for key, value in self.annotations(record).items():
            call.annotate(key, value)
        return record


@dataclass(frozen=True, slots=True)
class _ModelRetry(RetryPolicy):
    """Retries only what the provider classified as retryable."""

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        if isinstance(exc, ProviderError) and not exc.retryable:
            return False
        if isinstance(exc, (ConfigurationError, PayloadError)):
            return False  # retrying a misconfiguration or an oversized value cannot help
        return RetryPolicy.should_retry(self, exc, attempt)


async def _thunk(call: Any) -> Any:
    return await call()


def _input_message(value: Any) -> Message:
    if isinstance(value, Message):
        return value
    if isinstance(value, str):
        return Message.user(value)
    if isinstance(value, pydantic.BaseModel):
        value = value.model_dump(mode="json")
    return Message.user(canonical_json(value))


class Agent(Flow[Any, dict[str, Any]]):
    """An LLM agent. It is a flow (register, start, dispatch, resume it like any flow; its
    output is :meth:`AgentResult.to_dict`), and a flow can run it inline with
    ``await ctx.agent(agent, input)`` (which returns the :class:`AgentResult`)."""

    def __init__(
        self,
        *,
        id: str,
        version: str,
        provider: LlmProvider,
        model: str,
        instructions: str | None,
        tools: Sequence[Tool[Any, Any]],
        output_type: Any,
        max_turns: int,
        budget: Budget | None,
        max_tokens: int | None,
        temperature: float | None,
        options: Mapping[str, Any] | None,
        retry: RetryPolicy,
        output_retries: int,
        stream: bool,
    ) -> None:
        async def run_as_flow(ctx: WorkflowContext, input: Any) -> dict[str, Any]:
            return (await self.run(ctx, input)).to_dict()

        super().__init__(run_as_flow, id=id, version=version)
        if not isinstance(provider, LlmProvider):
            raise ConfigurationError(f"agent {id!r}: {provider!r} is not an LlmProvider")
        if max_turns < 1:
            raise ConfigurationError(f"agent {id!r}: max_turns must be at least 1")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"agent {id!r}: two tools share a name ({names})")
        for t in tools:
            if not isinstance(t, Tool):
                raise ConfigurationError(f"agent {id!r}: {t!r} is not a @loom.tool")
        if budget and budget.max_cost is not None and model not in budget.prices:
            raise ConfigurationError(
                f"agent {id!r}: a cost budget needs a price for model {model!r}",
                hint="Pass Budget(prices={model: Price(input_per_mtok=..., output_per_mtok=...)})",
            )
        self.provider = provider
        self.model = model
        self.instructions = instructions
        self.tools = {t.name: t for t in tools}
        self.output_type = output_type
        self.output_codec = None if output_type is None else _Codec(output_type)
        self.max_turns = max_turns
        self.budget = budget or Budget()
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.options = dict(options or {})
        self.output_retries = output_retries
        self.stream = stream
        self.accounting = UsageAccounting(model, self.budget)
        self._model_step: Step[[Any], Any] = Step(
            _thunk,
            id=f"{MODEL_STEP_PREFIX}{id}",
            retry=_ModelRetry(**_fields(retry)),
            interceptors=[self.accounting],
            record_as=ModelCalled.from_completion,
            defer_record=self._only_read_only_tools,
        )
        self._read_only = frozenset(
            t.name for t in tools if t.read_only and t.requires_approval is None
        )
        self._tool_steps: dict[str, Step[[Any], Any]] = {
            t.name: Step(
                _thunk,
                id=f"agents.tool:{t.name}",
                retry=dataclasses.replace(
                    t.retry,
                    non_retryable=(*t.retry.non_retryable, ToolArgumentsError, *t.fatal),
                ),
            )
            for t in tools
        }
        schema = None
        if self.output_codec is not None and self.output_codec.adapter is not None:
            schema = self.output_codec.adapter.json_schema()
        self._request_template = CompletionRequest(
            model,
            (),
            system=instructions,
            tools=tuple(t.spec for t in tools),
            max_tokens=max_tokens,
            temperature=temperature,
            response_schema=schema,
            options=self.options,
        )
        self._static_fp = static_fingerprint(self._request_template)

    def __repr__(self) -> str:
        return f"<loom.Agent {self.id!r} v{self.version}>"

    def _only_read_only_tools(self, record: Mapping[str, Any]) -> bool:
        """Whether a model call's record may ride with its first tool's (``read_only``): it
        asked for tools, every one of them read-only and needing no approval. A crash before
        that commit then re-asks the model for the turn; nothing it asked for had an effect."""
        if not self._read_only:
            return False
        parts = record["response"]["message"]["parts"]
        calls = [p for p in parts if p.get("type") == "tool_call"]
        return bool(calls) and all(p.get("name") in self._read_only for p in calls)

    # ------------------------------------------------------------------ the loop

    async def run(self, ctx: WorkflowContext, input: Any) -> AgentResult:
        """Run the tool loop inside ``ctx`` (each model and tool call a recorded step)."""
        conv = Conversation(ctx.blob_store, ctx.execution_id, ctx.limits)
        conv.add(_input_message(input), "the agent's input")
        usage = Usage()
        tokens = 0
        cost: float | None = 0.0 if self.model in self.budget.prices else None
        turns = 0
        feedback_left = self.output_retries
        outcome: Outcome = "completed"
        exhausted: str | None = None
        output: Any = None
        text = ""
        while True:
            if turns >= self.max_turns:
                outcome = "max_turns"
                break
            exhausted = self.budget.reached(turns, tokens, cost)
            if exhausted is not None:
                outcome = "budget_exhausted"
                break
            turns += 1
            response, notes = await self._model_call(ctx, conv, turns)
            usage = usage + response.usage
            tokens += int(notes.get("tokens", 0))
            if cost is not None and notes.get("cost") is not None:
                cost += float(notes["cost"])
            conv.add_response(response.message)
            calls = response.message.tool_calls
            if calls:
                exhausted = self.budget.reached(turns, tokens, cost)
                if exhausted is not None and exhausted != "turns":
                    outcome = "budget_exhausted"
                    break
                for index, call in enumerate(calls):
                    if index and not ctx.is_replaying:
                        faults.hit("agents.between_tool_calls")
                    await self._tool_call(ctx, conv, call)
                continue
            text = response.message.text
            if self.output_codec is None:
                output = text
                break
            try:
                value = self.output_codec.adapter.validate_json(text)  # type: ignore[union-attr]
                output = self.output_codec.dump(value, f"output of agent {self.id!r}")
                break
            except pydantic.ValidationError as exc:
                if feedback_left <= 0:
                    raise AgentOutputError(
                        f"agent {self.id!r} answered {self.output_retries + 1} time(s) without "
                        f"matching its output type: {exc.errors()[0]['msg']}",
                        execution_id=ctx.execution_id,
                        hint="Loosen the output type, improve the instructions or allow more "
                        "output_retries",
                    ) from exc
                feedback_left -= 1
                conv.add(Message.user(_feedback(exc)), "output feedback")
        record = {
            "agent": self.id,
            "outcome": outcome,
            "turns": turns,
            "usage": usage.to_dict(),
            "cost": cost,
            "exhausted": exhausted,
        }
        # The outcome sums up what the log holds, so replay recomputes it: it rides with the
        # next write (the flow's completion when the agent is the flow), not a commit of its own.
        pos, recorded = ctx.claim_position(OpKind.DECISION, f"agents.outcome:{self.id}")
        if recorded is None:
            ctx.record_later(DecisionRecorded(pos, f"agents.outcome:{self.id}", record))
        return AgentResult(output, outcome, turns, usage, cost, text, exhausted)

    async def _model_call(
        self, ctx: WorkflowContext, conv: Conversation, turn: int
    ) -> tuple[CompletionResponse, Mapping[str, Any]]:
        """Record one model call; return its response and the annotations of its record."""
        fp = {**self._static_fp, "history": conv.chain}
        added = conv.take_added()
        provider = self.provider
        execution_id = ctx.execution_id

        # Only the components that changed since the previous call are written (most turns:
        # the history alone); replay carries the others forward from the earlier records.
        written = {k: v for k, v in fp.items() if conv.last_fp.get(k) != v}

        async def call() -> dict[str, Any]:
            ctx.stage_blobs(conv.take_pending())
            request = dataclasses.replace(self._request_template, messages=await conv.messages())
            if self.stream and isinstance(provider, StreamingProvider):
                response = await provider.complete_streaming(
                    request, lambda chunk: LIVE.publish(execution_id, chunk)
                )
            else:
                response = await provider.complete(request)
            record: dict[str, Any] = {"turn": turn, "fp": written}
            if added:
                record["added"] = added
            record["response"] = response.to_dict()
            return record

        live = not ctx.is_replaying
        position = ctx.position
        recorded = await ctx.run(self._model_step, call)
        if live and ctx.recorded(position) is not None:  # not when it waits for a tool's commit
            faults.hit("agents.after_model_recorded")
        recorded_fp = recorded.get("fp")
        effective = {**conv.last_fp, **(recorded_fp if isinstance(recorded_fp, dict) else {})}
        check_fingerprint(effective, fp, agent_id=self.id, turn=turn, execution_id=execution_id)
        conv.last_fp = effective
        op = ctx.recorded(position)
        notes = op.annotations if op is not None else None
        if notes is None:  # recorded before model calls were annotated: account for it now
            notes = self.accounting.annotations(recorded)
        return CompletionResponse.from_dict(recorded["response"]), notes

    async def _tool_call(
        self, ctx: WorkflowContext, conv: Conversation, call: ToolCallPart
    ) -> None:
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            conv.add(_observation(call, f"there is no tool {call.name!r} (tools: {known})"))
            return
        args: Mapping[str, Any] = call.args
        if tool.requires_approval is not None:
            verdict = await approval_gate(ctx, self.id, tool, call)
            if not verdict.approved:
                conv.add(_observation(call, verdict.observation()))
                return
            args = verdict.args
        limits = ctx.limits
        produced: list[Message] = []

        async def invoke() -> dict[str, Any]:
            kwargs = tool.validate_args(dict(args))
            value = await tool.invoke(**kwargs)
            faults.hit("agents.tool_effect_before_record")
            content = tool.output.dump(value, f"result of tool {tool.name!r}")
            message = Message("user", (ToolResultPart(call.id, content, False, tool.name),))
            digest, data = Conversation.encode(message, limits, f"result of tool {tool.name!r}")
            conv.require_blobs()
            # Stored in the same transaction as this step's record (which names it).
            ctx.stage_blobs({digest: data})
            produced[:] = [message]  # known here: the next model call need not read it back
            return {"message": digest}

        try:
            out = await ctx.run(self._tool_steps[tool.name], invoke)
        except StepFailedError as exc:
            error = exc.details.get("error") or {}
            if tool.is_fatal(str(error.get("type"))):
                raise
            text = f"{error.get('type', 'Error')}: {error.get('message', '')}"
            conv.add(_observation(call, text))
            return
        conv.add_stored(str(out["message"]), produced[0] if produced else None)


def _fields(policy: RetryPolicy) -> dict[str, Any]:
    return {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)}


def _observation(call: ToolCallPart, text: str) -> Message:
    return Message("user", (ToolResultPart(call.id, text, True, call.name),))


def _feedback(exc: pydantic.ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}" for e in exc.errors()[:5]
    )
    return (
        f"Your answer does not match the required output schema ({problems}). "
        "Answer again with JSON that matches the schema, and nothing else."
    )


DEFAULT_MODEL_RETRY = RetryPolicy(max_attempts=5, initial_backoff=1.0, max_backoff=60.0)


def agent(
    *,
    id: str,
    provider: LlmProvider,
    model: str,
    version: str = "1",
    instructions: str | None = None,
    tools: Sequence[Tool[Any, Any]] = (),
    output_type: Any = None,
    max_turns: int = 20,
    budget: Budget | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    options: Mapping[str, Any] | None = None,
    retry: RetryPolicy = DEFAULT_MODEL_RETRY,
    output_retries: int = 2,
    stream: bool = False,
) -> Agent:
    """Declare an agent: a durable tool loop around ``provider``'s ``model``.

    The loop: a model call (a recorded step, retried per ``retry`` for errors the provider
    classifies as retryable, after their ``retry-after``); then each tool call the model asked
    for, in its order, as a recorded step; again until the model answers without tools,
    ``max_turns`` model calls, or the ``budget`` (a recorded ``budget_exhausted`` outcome).
    A tool's exception goes back to the model as an error observation. With ``output_type``
    (a pydantic type) the final answer must be JSON of that type: a mismatch is fed back to
    the model up to ``output_retries`` times, then :class:`AgentOutputError`. ``stream=True``
    sends text to :data:`loom.agents.LIVE` while a call runs (not recorded; only the final
    response is).
    """
    return Agent(
        id=id,
        version=version,
        provider=provider,
        model=model,
        instructions=instructions,
        tools=tools,
        output_type=output_type,
        max_turns=max_turns,
        budget=budget,
        max_tokens=max_tokens,
        temperature=temperature,
        options=options,
        retry=retry,
        output_retries=output_retries,
        stream=stream,
    )
