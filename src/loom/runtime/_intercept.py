"""Step interceptors: a chain around each attempt of each step's effect.

An interceptor sees the attempt (:class:`StepCall`), may annotate the record it will leave
(tokens, cost: stored with ``STEP_COMPLETED``), and decides whether and how the effect runs:
it calls ``call_next(call)`` to run the rest of the chain (and finally the step), or returns a
value of its own instead (a simulation's dry run). Tracing is one interceptor
(``loom.otel.OpenTelemetryInterceptor``). Replayed steps run nothing, so no interceptor sees
them. A step may carry its own interceptors (``Step(interceptors=...)``), which run inside the
runtime's: an agent's model call annotates its record with tokens and cost that way, so an
outer interceptor sees ``call.annotations`` filled once ``call_next`` returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, overload, runtime_checkable

from loom.errors import ConfigurationError
from loom.runtime._sdk import Step, StepInfo, _step_info_now

__all__ = ["CallNext", "StepCall", "StepInterceptor", "build_chain", "own_chain", "resource"]

T = TypeVar("T")


@dataclass(slots=True)
class StepCall:
    """One attempt of one step, as interceptors see it.

    ``args``/``kwargs`` are what the flow passed (an interceptor may pass changed ones on with
    ``dataclasses.replace``). :meth:`annotate` attaches JSON values to the attempt's record.
    """

    info: StepInfo
    step: Step[Any, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    annotations: dict[str, Any] = field(default_factory=dict)

    def annotate(self, key: str, value: Any) -> None:
        """Record ``value`` (JSON) under ``key`` with the step's ``STEP_COMPLETED`` event.

        Annotations describe the attempt (tokens used, cost, the model that answered); they
        are stored only when the attempt completes, and never change what replay returns.
        """
        self.annotations[key] = value


#: The rest of the chain: run it with a call to get the step's value.
CallNext = Callable[[StepCall], Awaitable[Any]]


@runtime_checkable
class StepInterceptor(Protocol):
    """Wraps each attempt of each step's effect (first registered = outermost).

    ``invoke`` returns the step's value: normally ``await call_next(call)``; an interceptor
    may also return a substitute without calling it, or raise. Exceptions from the step pass
    through it like any exception, so ``try``/``finally`` observes failures too.
    """

    async def invoke(self, call: StepCall, call_next: CallNext) -> Any: ...


async def _invoke(call: StepCall) -> Any:
    return await call.step.invoke(*call.args, **call.kwargs)


async def _run_step(call: StepCall) -> Any:
    own = call.step._chain
    if own is not None:
        return await own(call)  # the step's own interceptors, inside the runtime's
    return await call.step.invoke(*call.args, **call.kwargs)


def own_chain(interceptors: Sequence[StepInterceptor]) -> CallNext:
    """A step's own interceptors around its invocation (see ``Step(interceptors=...)``)."""
    chain: CallNext = _invoke
    for interceptor in reversed(interceptors):
        _check(interceptor)
        chain = _link(interceptor, chain)
    return chain


def _check(interceptor: object) -> None:
    if not isinstance(interceptor, StepInterceptor):
        raise ConfigurationError(
            f"{interceptor!r} is not a step interceptor",
            hint="An interceptor has `async def invoke(self, call, call_next)`",
        )


def build_chain(interceptors: Sequence[StepInterceptor]) -> CallNext | None:
    """Compose ``interceptors`` around the step's invocation (None when there are none, so a
    runtime without interceptors pays nothing per step)."""
    chain: CallNext | None = None
    for interceptor in reversed(interceptors):
        _check(interceptor)
        chain = _link(interceptor, chain or _run_step)
    return chain


def _link(interceptor: StepInterceptor, call_next: CallNext) -> CallNext:
    async def invoke(call: StepCall) -> Any:
        return await interceptor.invoke(call, call_next)

    return invoke


@overload
def resource(name: str) -> Any: ...
@overload
def resource(name: str, kind: type[T]) -> T: ...
def resource(name: str, kind: type[Any] | None = None) -> Any:
    """The resource ``name`` the runtime was given (``WorkflowRuntime(resources={...})``),
    for the step running in this task: an LLM client, a database pool.

    With ``kind``, the resource is checked to be an instance of it (and typed as one).
    Raises :class:`ConfigurationError` outside a step, for an unknown name or a wrong type.
    """
    info = _step_info_now()
    if info is None:
        raise ConfigurationError(
            f"loom.resource({name!r}) is only available inside a step run by a runtime",
            hint="Call it from a @loom.step that a flow runs with ctx.run()",
        )
    resources: Mapping[str, Any] = info.resources
    if name not in resources:
        known = ", ".join(sorted(resources)) or "none"
        raise ConfigurationError(
            f"no resource {name!r} was given to this runtime (given: {known})",
            execution_id=info.execution_id,
            hint="Pass it as WorkflowRuntime(resources={...})",
        )
    value = resources[name]
    if kind is not None and not isinstance(value, kind):
        raise ConfigurationError(
            f"resource {name!r} is a {type(value).__name__}, not a {kind.__name__}",
            execution_id=info.execution_id,
        )
    return value
