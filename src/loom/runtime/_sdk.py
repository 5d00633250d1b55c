"""The authoring API: ``@loom.step``, ``@loom.handler``, ``@loom.flow`` and retry policies."""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import types
import typing
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

import pydantic
import pydantic_core

from loom.errors import (
    ConfigurationError,
    InvalidInputError,
    PayloadError,
    RetryableError,
    TerminalError,
)
from loom.model import DEFAULT_LIMITS, EventPayload, PayloadLimits, StepCompleted, encode_json

if TYPE_CHECKING:
    from loom.runtime._intercept import CallNext, StepInterceptor

__all__ = [
    "Flow",
    "RetryPolicy",
    "Step",
    "StepInfo",
    "current_step",
    "flow",
    "handler",
    "register_error",
    "registered_error",
    "step",
]

P = ParamSpec("P")
R = TypeVar("R")
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")


def _seconds(
    value: timedelta | float, what: str = "a duration", execution_id: str | None = None
) -> float:
    """``value`` in seconds; a NaN or infinite one is refused (ConfigurationError) before it
    can become a timer that never fires or a record no store can keep."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not math.isfinite(seconds):
        raise ConfigurationError(
            f"{what} must be a finite number of seconds, not {seconds!r}",
            execution_id=execution_id,
            hint="Pass a finite number of seconds or a timedelta; nothing was recorded",
        )
    return seconds


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a failing step is attempted again, and how long to wait between attempts.

    Every attempt is recorded in the log (``STEP_FAILED`` with its attempt number), so a retry
    sequence survives a crash: a recovered execution continues with the next attempt.

    The error decides too: :class:`~loom.errors.TerminalError` (and ``non_retryable`` types)
    are never retried; :class:`~loom.errors.RetryableError` with ``retry_after`` waits exactly
    that long before the next attempt instead of the backoff (still within ``max_attempts``).
    """

    max_attempts: int = 1
    initial_backoff: float = 1.0
    backoff_multiplier: float = 2.0
    max_backoff: float = 60.0
    non_retryable: tuple[type[BaseException], ...] = ()
    #: Spread each backoff uniformly by up to this fraction either way (0.1: +-10%), so many
    #: executions failing together do not retry in lockstep against the same dependency.
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError("RetryPolicy.max_attempts must be at least 1")
        numbers = (self.initial_backoff, self.max_backoff, self.backoff_multiplier, self.jitter)
        if not all(math.isfinite(n) for n in numbers):
            # NaN passes every comparison below; an infinite backoff parks the step for good.
            raise ConfigurationError("RetryPolicy backoffs, multiplier and jitter must be finite")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.backoff_multiplier < 1:
            raise ConfigurationError("RetryPolicy backoffs must be >= 0 and multiplier >= 1")
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigurationError("RetryPolicy.jitter must be between 0 and 1")

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        """Whether failed attempt number ``attempt`` (1-based) that raised ``exc`` gets another."""
        if isinstance(exc, TerminalError):
            return False
        return attempt < self.max_attempts and not isinstance(exc, self.non_retryable)

    def delay(self, exc: BaseException, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` raised ``exc``: the error's own
        ``retry_after`` when it is a :class:`RetryableError` that names one, else the backoff."""
        if isinstance(exc, RetryableError) and exc.retry_after is not None:
            return exc.retry_after
        return self.backoff(attempt)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        delay = min(
            self.initial_backoff * self.backoff_multiplier ** (attempt - 1), self.max_backoff
        )
        if self.jitter:
            delay *= 1.0 + random.uniform(-self.jitter, self.jitter)
        return float(delay)


NO_RETRY = RetryPolicy()


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What a running step may know about itself: pass ``idempotency_key`` to callees that
    honour one, so the one re-run a crash can cause is absorbed downstream. ``fence`` is the
    holder's fencing token: a downstream system that keeps the highest token it has seen can
    refuse a zombie's late write the same way the store does."""

    execution_id: str
    position: int
    attempt: int
    step_id: str
    fence: int = 0
    #: What the runtime was given to share with steps (see :func:`loom.resource`).
    resources: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: True in a branch forked for a simulation (``runtime.simulate``): a step with an
    #: external effect can dry-run it (or let ``loom.DryRun`` substitute its result).
    simulation: bool = False

    @property
    def idempotency_key(self) -> str:
        return f"{self.execution_id}/{self.position}"


_new_object = object.__new__
_set_info_fields = tuple(
    getattr(StepInfo, name).__set__
    for name in (
        "execution_id",
        "position",
        "attempt",
        "step_id",
        "fence",
        "resources",
        "simulation",
    )
)


def new_step_info(
    execution_id: str,
    position: int,
    attempt: int,
    step_id: str,
    fence: int,
    resources: Mapping[str, Any],
    simulation: bool,
) -> StepInfo:
    """``StepInfo(...)`` for the runtime's step path: the slots filled directly, as the frozen
    dataclass's own __init__ does through a slower object.__setattr__ per field."""
    info: StepInfo = _new_object(StepInfo)
    (s_execution_id, s_position, s_attempt, s_step_id, s_fence, s_resources, s_simulation) = (
        _set_info_fields
    )
    s_execution_id(info, execution_id)
    s_position(info, position)
    s_attempt(info, attempt)
    s_step_id(info, step_id)
    s_fence(info, fence)
    s_resources(info, resources)
    s_simulation(info, simulation)
    return info


#: The step running in this task: its StepInfo, or (on the runtime's plain step path) the
#: arguments of :func:`new_step_info`, built into one only when something asks (most steps never
#: do, and building it is a tenth of the step's own Python).
_current_step: ContextVar[StepInfo | tuple[Any, ...] | None] = ContextVar(
    "loom_current_step", default=None
)


def _step_info_now() -> StepInfo | None:
    """The running step's StepInfo (built from its arguments the first time it is asked for
    in this context, and kept there: ctx.run's reset after the step undoes that too)."""
    info = _current_step.get()
    if type(info) is tuple:
        built = new_step_info(*info)
        _current_step.set(built)
        return built
    return info  # type: ignore[return-value]


#: The flow context driving this task (set by the runtime around the flow's code), so a step
#: called directly inside a flow is the durable call, never a silent unrecorded effect.
_current_flow: ContextVar[Any] = ContextVar("loom_current_flow", default=None)


def current_step() -> StepInfo | None:
    """The step running in this task, or None outside a step."""
    return _step_info_now()


#: What pydantic raises (besides its own errors) for values JSON cannot hold: an object of an
#: unknown type, bytes that are not UTF-8, a circular or too-deep structure.
_NOT_JSON = (ValueError, TypeError, UnicodeError, RecursionError, PayloadError)


def json_dump(adapter: pydantic.TypeAdapter[Any], value: Any) -> Any:
    """``adapter.dump_python(value, mode="json")``, refusing instead of changing values.

    pydantic's JSON mode turns NaN and ±Infinity into None, so a stored record would differ
    from what the code saw (a silent wrong result, and a replay mismatch later). The Python
    mode keeps floats as they are, so non-finite ones are looked for there first.
    """
    python = adapter.dump_python(value, mode="python")
    if _refuse_non_finite(python):
        # Already plain JSON (the common case: None, numbers, strings, lists, str-keyed
        # dicts): JSON mode would return the same values, so one serialisation is enough.
        return python
    return adapter.dump_python(value, mode="json")


#: Types whose Python-mode dump is already what JSON mode returns (exact types: a subclass
#: such as an enum member is converted by JSON mode).
_PLAIN_LEAVES = frozenset({str, int, bool, type(None)})


def _refuse_non_finite(value: Any) -> bool:
    """Refuse NaN and ±Infinity anywhere in ``value``; return whether ``value`` is plain JSON
    (only exact dicts with str keys, lists, strings, numbers, booleans and None, nested less
    than _PLAIN_DEPTH deep) that JSON mode would return unchanged."""
    # Iterative, with a visited set: a hostile value can be deep or circular.
    stack: list[tuple[Any, int]] = [(value, 0)]
    seen: set[int] = set()
    plain = True
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind in _PLAIN_LEAVES:
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise PayloadError(f"{item!r} is not a JSON number")
            plain = plain and kind is float
        elif isinstance(item, (dict, list, tuple, set, frozenset)):
            if id(item) in seen:
                raise PayloadError("the value refers to itself (circular)")
            seen.add(id(item))
            depth += 1
            if depth >= _PLAIN_DEPTH:
                plain = False  # JSON mode has a nesting limit of its own: let it decide
            if isinstance(item, dict):
                plain = plain and kind is dict and all(type(k) is str for k in item)
                stack.extend((v, depth) for v in item.values())
            else:
                plain = plain and kind is list
                stack.extend((v, depth) for v in item)
        else:
            plain = False
    return plain


#: Below pydantic's own JSON-mode nesting limit (255 levels).
_PLAIN_DEPTH = 128


_EXACT = (int, str, float, bool)


#: Annotations whose values, of exactly these types, JSON mode dumps as they are.
_SCALARS: frozenset[Any] = frozenset({type(None), bool, int, float, str})


def _scalar_types(annotation: Any) -> frozenset[type]:
    """The exact types a value of ``annotation`` may have to be stored as it is (no dump):
    ``None``, ``bool``, ``int``, ``float``, ``str`` and unions of them; empty for the rest."""
    try:
        if annotation in _SCALARS:
            return frozenset({annotation})
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            args = frozenset(typing.get_args(annotation))
            if args <= _SCALARS:
                return args
    except TypeError:  # an unhashable annotation: not a plain scalar
        pass
    return frozenset()


#: Containers whose pydantic schema is built from their arguments' alone, by how many
#: arguments each takes (a tuple: any number, or one and ``...``).
_JSON_CONTAINERS: dict[Any, int] = {dict: 2, list: 1, set: 1, frozenset: 1, tuple: -1}


def _json_shaped(annotation: Any, depth: int = 0) -> bool:
    """Whether ``annotation`` is made only of JSON scalars, ``Any`` and the builtin containers
    (each with as many arguments as it takes) and unions of them (``dict[str, Any]``,
    ``list[int] | None``, ``tuple[int, ...]``): a TypeAdapter of such an annotation is always
    built, so building it can wait until a value needs it. Anything else (``list[...]``,
    ``dict[str]``, ``Annotated``, models) is False, and its adapter is built where it is
    declared, refusing it there if pydantic cannot."""
    if depth > 8:
        return False
    try:
        if annotation is Any or annotation in _SCALARS or annotation in _JSON_CONTAINERS:
            return True  # a bare container: its items are Any
    except TypeError:  # unhashable (Annotated with a dict in its metadata): not one of these
        return False
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return all(_json_shaped(arg, depth + 1) for arg in args)
    takes = _JSON_CONTAINERS.get(origin)
    if takes is None:
        return False
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        args = args[:1]  # tuple[int, ...]
    elif takes >= 0 and len(args) != takes:
        return False
    return all(_json_shaped(arg, depth + 1) for arg in args)


class _Codec:
    """JSON-mode (de)serialisation through a pydantic TypeAdapter; ``Any`` passes through.

    The adapter of an annotation made of JSON scalars and builtin containers (``int``,
    ``dict[str, Any]``: see ``_json_shaped``) is built on first need: building it cannot fail,
    plain values never need it, and the first adapter of a process imports pydantic's schema
    machinery (~70 ms that every worker and recovery paid at import for flows that only pass
    ints and dicts). Any other annotation's is built here, so one that pydantic cannot handle
    is refused where it is declared.
    """

    __slots__ = ("_adapter", "annotation", "as_is", "exact", "passthrough")

    def __init__(self, annotation: Any) -> None:
        self.annotation = annotation
        #: ``Any`` (or no annotation): values are stored and loaded as they are.
        self.passthrough = annotation is Any or annotation is inspect.Parameter.empty
        #: A JSON scalar type whose decoded values load as themselves (the lax validator
        #: returns an int, str, float or bool of exactly that type unchanged).
        self.exact: type | None = next((t for t in _EXACT if annotation is t), None)
        #: Scalar types stored without a pydantic round trip (an immutable value that JSON
        #: mode would return unchanged: nothing to convert, copy or check but finiteness).
        self.as_is = _scalar_types(annotation)
        self._adapter: pydantic.TypeAdapter[Any] | None = None
        if not self.passthrough and not _json_shaped(annotation):
            self._adapter = pydantic.TypeAdapter(annotation)

    @property
    def adapter(self) -> pydantic.TypeAdapter[Any] | None:
        """The annotation's TypeAdapter (built on first use for a JSON-shaped one); None for
        ``Any``."""
        if self.passthrough:
            return None
        adapter = self._adapter
        if adapter is None:
            adapter = self._adapter = pydantic.TypeAdapter(self.annotation)
        return adapter

    def plain(self, value: Any) -> bool:
        """Whether ``value`` is stored as it is: of an ``as_is`` type (and finite)."""
        kind = type(value)
        return kind in self.as_is and (kind is not float or math.isfinite(value))

    def dump(self, value: Any, what: str) -> Any:
        if self.passthrough or self.plain(value):
            return value
        adapter = self.adapter
        assert adapter is not None
        try:
            return json_dump(adapter, value)
        except (pydantic.ValidationError, pydantic_core.PydanticSerializationError) as exc:
            raise PayloadError(f"{what} does not match {self.annotation!r}: {exc}") from exc
        except _NOT_JSON as exc:
            raise PayloadError(f"{what} is not storable as JSON: {exc!r}") from exc

    def load(self, data: Any) -> Any:
        if self.passthrough or type(data) is self.exact:
            return data
        adapter = self.adapter
        assert adapter is not None
        return adapter.validate_python(data)


def problems_line(exc: pydantic.ValidationError) -> str:
    """A validation error as one line: ``field: problem; other.field: problem``."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '<value>'}: {e['msg']}" for e in exc.errors()
    )


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to JSON passthrough
        return {}


class Step(Generic[P, R]):
    """A named effect. Inside a flow, ``await step(...)`` and ``await ctx.run(step, ...)`` are
    the same durable call: its result is recorded once and served from the log on replay.
    Called outside a flow (or from inside another step), it just runs."""

    def __init__(
        self,
        fn: Callable[P, Awaitable[R]] | Callable[P, R],
        *,
        id: str,
        retry: RetryPolicy = NO_RETRY,
        record_start: bool = False,
        timeout: timedelta | float | None = None,
        interceptors: Sequence[StepInterceptor] = (),
        record_as: Callable[[StepCompleted], EventPayload] | None = None,
        defer_record: Callable[[Any], bool] | None = None,
    ) -> None:
        if not id:
            raise ConfigurationError("a step needs a non-empty id")
        self.fn = fn
        self.id = id
        self.retry = retry
        self.record_start = record_start
        self.timeout = None if timeout is None else _seconds(timeout)
        #: This step's own interceptors (``StepInterceptor``), inside the runtime's: a layer
        #: uses them to annotate its steps' records (an agent's model call: tokens, cost).
        self.interceptors: tuple[StepInterceptor, ...] = tuple(interceptors)
        self._chain: CallNext | None = None
        if self.interceptors:
            from loom.runtime._intercept import own_chain

            self._chain = own_chain(self.interceptors)
        #: For a layer's steps: turns the attempt's ``StepCompleted`` into the layer's own
        #: registered event (whose reducer records the same ``OpRecord``), e.g.
        #: ``agents.model_called``. None: the completion is recorded as ``STEP_COMPLETED``.
        self.record_as = record_as
        #: For a layer's steps: given the attempt's recorded output, whether its record may
        #: wait for the flow's next durable write instead of a commit of its own. Only for a
        #: step whose loss in a crash costs nothing but running it again (the next write is
        #: what the flow does with its result; a crash before it re-runs this step). An
        #: agent's model call uses it when every tool the model asked for is read-only.
        self.defer_record = defer_record
        if self.timeout is not None and self.timeout <= 0:
            raise ConfigurationError(f"step {id!r}: timeout must be positive")
        self.is_async = inspect.iscoroutinefunction(fn)
        try:
            self.output = _Codec(_hints(fn).get("return", Any))
        except (pydantic.PydanticSchemaGenerationError, TypeError):
            # Known now, before any effect runs: a result Loom could not store or reload (a
            # malformed annotation such as ``dict[str]`` is pydantic's TypeError).
            raise ConfigurationError(
                f"step {id!r} returns {_hints(fn).get('return')!r}, which Loom cannot store "
                "as JSON",
                hint="Return a JSON value, a pydantic model, or a type pydantic can serialise",
            ) from None
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", id)

    async def invoke(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the handler once: async handlers are awaited, sync ones run in a thread."""
        # No typing.cast here: it would build a generic alias on every call of a hot path.
        if self.is_async:
            return await self.fn(*args, **kwargs)  # type: ignore[misc,no-any-return]
        return await asyncio.to_thread(self.fn, *args, **kwargs)  # type: ignore[arg-type]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
        """Inside a flow (and outside any step), the durable call: ``await step(x)`` is
        ``await ctx.run(step, x)``, recorded once. Anywhere else it just runs."""
        ctx = _current_flow.get()
        if ctx is not None and _current_step.get() is None:
            run: Callable[..., Awaitable[R]] = ctx.run
            return run(self, *args, **kwargs)
        return self.invoke(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<loom.Step {self.id!r}>"


class _StepDecorator:
    def __init__(
        self,
        id: str | None,
        retry: RetryPolicy,
        record_start: bool,
        timeout: timedelta | float | None = None,
    ) -> None:
        self.id = id
        self.retry = retry
        self.record_start = record_start
        self.timeout = timeout

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> Step[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> Step[P, R]: ...
    def __call__(self, fn: Callable[P, Any]) -> Step[P, Any]:
        return Step(
            fn,
            id=self.id or f"{fn.__module__}.{fn.__qualname__}",
            retry=self.retry,
            record_start=self.record_start,
            timeout=self.timeout,
        )


@overload
def step(fn: Callable[P, Coroutine[Any, Any, R]], /) -> Step[P, R]: ...
@overload
def step(fn: Callable[P, R], /) -> Step[P, R]: ...
@overload
def step(
    *,
    id: str | None = None,
    retry: RetryPolicy | None = None,
    record_start: bool = False,
    timeout: timedelta | float | None = None,
) -> _StepDecorator: ...
def step(
    fn: Callable[P, Any] | None = None,
    /,
    *,
    id: str | None = None,
    retry: RetryPolicy | None = None,
    record_start: bool = False,
    timeout: timedelta | float | None = None,
) -> Step[P, Any] | _StepDecorator:
    """Declare a step: a named effect whose result is recorded once per execution position.

    ``id`` names the step in the log (default: module.qualname); renaming it is a change replay
    detects. ``retry`` is its :class:`RetryPolicy`. ``record_start=True`` makes the step's start
    durable before its effect runs (one more commit; useful for long effects an operator should
    see in flight); by default a step costs exactly one commit, after its effect.
    ``timeout`` bounds each attempt: one that runs longer is abandoned and recorded as a failed
    attempt (``TimeoutError``), retried as the policy says. (A sync step's thread cannot be
    stopped; only its result is no longer awaited.)
    """
    decorator = _StepDecorator(id, retry or NO_RETRY, record_start, timeout)
    if fn is not None:
        return decorator(fn)
    return decorator


@overload
def handler(fn: Callable[P, Coroutine[Any, Any, R]], /) -> Step[P, R]: ...
@overload
def handler(fn: Callable[P, R], /) -> Step[P, R]: ...
@overload
def handler(*, id: str | None = None, retry: RetryPolicy | None = None) -> _StepDecorator: ...
def handler(
    fn: Callable[P, Any] | None = None,
    /,
    *,
    id: str | None = None,
    retry: RetryPolicy | None = None,
) -> Step[P, Any] | _StepDecorator:
    """Wrap a plain function (sync or async) as a reusable effect, usable with ``ctx.run``.

    The same as :func:`step`, named for the common case of adapting existing code
    (``send_email = loom.handler(smtp.send)``).
    """
    decorator = _StepDecorator(id, retry or NO_RETRY, False)
    if fn is not None:
        return decorator(fn)
    return decorator


_ERRORS: dict[str, type[BaseException]] = {}
E = TypeVar("E", bound=type[BaseException])


@overload
def register_error(cls: E, /) -> E: ...
@overload
def register_error(*, name: str) -> Callable[[E], E]: ...
def register_error(cls: E | None = None, /, *, name: str | None = None) -> E | Callable[[E], E]:
    """Make an exception type round-trip through the log, so a flow can catch it by type.

    A step error of a registered type reaches the flow as that type (rebuilt from the log, so
    the first run and every replay see the same thing), with the :class:`StepFailedError`
    describing the step as its ``__cause__``. Its ``args`` and instance attributes are
    recorded, so they must be JSON; an error whose fields are not stays a
    ``StepFailedError``. ``name`` (default ``module.QualName``) is what the log stores: keep
    it stable, like a step id. Unregistered errors reach the flow as ``StepFailedError`` with
    ``error_type`` set to their class name.
    """

    def decorate(c: E) -> E:
        if not (isinstance(c, type) and issubclass(c, Exception)):
            raise ConfigurationError(f"register_error() takes an Exception subclass, not {c!r}")
        key = name or f"{c.__module__}.{c.__qualname__}"
        existing = _ERRORS.get(key)
        if existing is not None and existing is not c:
            raise ConfigurationError(f"error name {key!r} is already registered for {existing!r}")
        _ERRORS[key] = c
        c.__loom_error_name__ = key  # type: ignore[attr-defined]
        return c

    if cls is not None:
        return decorate(cls)
    return decorate


def registered_error(name: object) -> type[BaseException] | None:
    """The exception type registered under ``name``, if any."""
    return _ERRORS.get(name) if isinstance(name, str) else None


class Flow(Generic[InputT, OutputT]):
    """A registered unit of durable work: an async function ``(ctx, input) -> output``."""

    def __init__(
        self,
        fn: Callable[..., Awaitable[OutputT]],
        *,
        id: str,
        version: str,
        resume_schemas: Mapping[str, Any] | None = None,
        cancel_grace: timedelta | float | None = None,
    ) -> None:
        if not id:
            raise ConfigurationError("a flow needs a non-empty id")
        self.cancel_grace = None if cancel_grace is None else _seconds(cancel_grace)
        if self.cancel_grace is not None and self.cancel_grace <= 0:
            raise ConfigurationError(f"flow {id!r}: cancel_grace must be positive")
        if not inspect.iscoroutinefunction(fn):
            raise ConfigurationError(f"flow {id!r} must be an async function (ctx, input)")
        params = list(inspect.signature(fn).parameters.values())
        if not 1 <= len(params) <= 2:
            raise ConfigurationError(
                f"flow {id!r} must take (ctx) or (ctx, input), not {len(params)} parameters"
            )
        hints = _hints(fn)
        self.fn = fn
        self.id = id
        self.version = str(version)
        self.takes_input = len(params) == 2
        self.input = _Codec(hints.get(params[1].name, Any) if self.takes_input else Any)
        self.output = _Codec(hints.get("return", Any))
        self.resume_schemas: dict[str, _Codec] = {
            name: _Codec(schema) for name, schema in (resume_schemas or {}).items()
        }
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", id)

    def encode_input(
        self, value: Any, execution_id: str | None = None, *, limits: PayloadLimits = DEFAULT_LIMITS
    ) -> Any:
        """Validate and JSON-encode a start input; raise InvalidInputError before anything runs."""
        try:
            codec = self.input
            if codec.passthrough:
                encode_json(value, limits=limits, what="the input")
                return value
            if codec.plain(value):
                return value  # what validating and dumping it would return (see _Codec.dump)
            adapter = codec.adapter
            assert adapter is not None
            return json_dump(adapter, adapter.validate_python(value))
        except (
            pydantic.ValidationError,
            pydantic_core.PydanticSerializationError,
            *_NOT_JSON,
        ) as exc:
            # One line listing the problems, and no execution id: nothing was started.
            problems = problems_line(exc) if isinstance(exc, pydantic.ValidationError) else str(exc)
            err = InvalidInputError(
                f"input for flow {self.id!r} is invalid: {problems}",
                execution_id=execution_id,
                hint="Nothing was started; fix the input and start again (JSON values only)",
            )
            # The id stays on the error for programs, but the line a person reads does not
            # name an execution that never started.
            err.args = (f"{err.message}. {err.hint}",)
            raise err from exc

    def __repr__(self) -> str:
        return f"<loom.Flow {self.id!r} v{self.version}>"


def flow(
    *,
    id: str,
    version: str = "1",
    resume_schemas: Mapping[str, Any] | None = None,
    cancel_grace: timedelta | float | None = None,
) -> Callable[[Callable[..., Awaitable[OutputT]]], Flow[Any, OutputT]]:
    """Declare a flow. ``resume_schemas`` maps each gate's event type to the pydantic type its
    resume payload must match; a payload that does not is refused before it is appended.

    With ``cancel_grace``, a cancel lets the flow clean up: it receives
    :class:`~loom.errors.ExecutionCancelledError` where it is, may run compensating steps,
    and ends ``cancelled``; a durable timer ends it outright after ``cancel_grace``. Without
    it, a cancel stops the flow at once."""

    def decorate(fn: Callable[..., Awaitable[OutputT]]) -> Flow[Any, OutputT]:
        return Flow(
            fn, id=id, version=version, resume_schemas=resume_schemas, cancel_grace=cancel_grace
        )

    return decorate
