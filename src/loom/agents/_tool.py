"""``@loom.tool``: a durable step the model can call, with a JSON schema from its type hints."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import pydantic

from loom.errors import ConfigurationError
from loom.llm import ToolSpec
from loom.runtime import RetryPolicy, Step
from loom.runtime._sdk import _hints

if TYPE_CHECKING:
    from loom.agents._approval import ApprovalPolicy

__all__ = ["FatalToolError", "Tool", "ToolArgumentsError", "tool"]

P = ParamSpec("P")
R = TypeVar("R")


class FatalToolError(Exception):
    """Raise it (or a subclass) from a tool to fail the agent instead of telling the model.

    Any other exception a tool raises (after its retry policy) goes back to the model as an
    error observation it can correct.
    """


class ToolArgumentsError(ValueError):
    """The model called a tool with arguments its schema refuses (an observation)."""


def _description(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


class Tool(Step[P, R]):
    """A step the model can call by ``name``. ``ctx.run(tool, ...)`` works as for any step."""

    def __init__(
        self,
        fn: Callable[P, Any],
        *,
        id: str,
        name: str,
        description: str,
        retry: RetryPolicy,
        requires_approval: ApprovalPolicy | None,
        fatal: tuple[type[BaseException], ...],
        read_only: bool = False,
    ) -> None:
        super().__init__(fn, id=id, retry=retry)
        if not name.replace("_", "").replace("-", "").isalnum() or len(name) > 64:
            raise ConfigurationError(
                f"tool name {name!r} must be 1-64 letters, digits, '_' or '-' (what every "
                "provider accepts)"
            )
        self.name = name
        self.description = description
        self.requires_approval = requires_approval
        #: Running it again is harmless (it changes nothing outside Loom): see ``tool()``.
        self.read_only = read_only
        self.fatal: tuple[type[BaseException], ...] = (FatalToolError, *fatal)
        hints = _hints(fn)
        fields: dict[str, Any] = {}
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ConfigurationError(f"tool {name!r}: *args/**kwargs cannot be described")
            annotation = hints.get(param.name, Any)
            default = ... if param.default is param.empty else param.default
            fields[param.name] = (annotation, default)
        self._args_model = pydantic.create_model(
            f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
        )
        schema = self._args_model.model_json_schema()
        schema.pop("title", None)
        self.parameters: dict[str, Any] = schema

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        return ToolSpec(self.name, self.description, self.parameters)

    def validate_args(self, args: Any) -> dict[str, Any]:
        """The model's arguments as keyword arguments, or :class:`ToolArgumentsError`."""
        try:
            model = self._args_model.model_validate(args)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {problems}") from exc
        return {name: getattr(model, name) for name in type(model).model_fields}

    def is_fatal(self, error_type: str) -> bool:
        """Whether an error of this (recorded) type name fails the agent."""
        return any(t.__name__ == error_type for t in self.fatal) or error_type in {
            c.__name__ for t in self.fatal for c in _subclasses(t)
        }

    def __repr__(self) -> str:
        return f"<loom.Tool {self.name!r}>"


def _subclasses(cls: type[BaseException]) -> list[type[BaseException]]:
    out = []
    stack = list(cls.__subclasses__())
    while stack:
        sub = stack.pop()
        out.append(sub)
        stack.extend(sub.__subclasses__())
    return out


class _ToolDecorator:
    def __init__(self, **options: Any) -> None:
        self.options = options

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> Tool[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> Tool[P, R]: ...
    def __call__(self, fn: Callable[P, Any]) -> Tool[P, Any]:
        return _make(fn, **self.options)


def _make(
    fn: Callable[P, Any],
    *,
    id: str | None = None,
    name: str | None = None,
    description: str | None = None,
    retry: RetryPolicy | None = None,
    requires_approval: ApprovalPolicy | bool | None = None,
    fatal: tuple[type[BaseException], ...] = (),
    read_only: bool = False,
) -> Tool[P, Any]:
    from loom.agents._approval import ApprovalPolicy

    policy: ApprovalPolicy | None
    if requires_approval is True:
        policy = ApprovalPolicy()
    elif requires_approval is False or requires_approval is None:
        policy = None
    else:
        policy = requires_approval
    tool_name = name or fn.__name__
    return Tool(
        fn,
        id=id or f"tool:{tool_name}",
        name=tool_name,
        description=description if description is not None else _description(fn),
        retry=retry or RetryPolicy(),
        requires_approval=policy,
        fatal=fatal,
        read_only=read_only,
    )


@overload
def tool(fn: Callable[P, Coroutine[Any, Any, R]], /) -> Tool[P, R]: ...
@overload
def tool(fn: Callable[P, R], /) -> Tool[P, R]: ...
@overload
def tool(
    *,
    id: str | None = None,
    name: str | None = None,
    description: str | None = None,
    retry: RetryPolicy | None = None,
    requires_approval: ApprovalPolicy | bool | None = None,
    fatal: tuple[type[BaseException], ...] = (),
    read_only: bool = False,
) -> _ToolDecorator: ...
def tool(fn: Callable[P, Any] | None = None, /, **options: Any) -> Tool[P, Any] | _ToolDecorator:
    """Declare a tool: a durable step an agent's model may call.

    Its JSON schema comes from the function's type hints (through pydantic), its description
    from the docstring's first paragraph. ``requires_approval=True`` (one approver, anyone) or
    an :class:`ApprovalPolicy` puts a durable approval gate before every call. An exception
    the tool raises goes back to the model as an error observation, unless it is one of
    ``fatal`` (or a :class:`FatalToolError`), which fails the agent.

    ``read_only=True`` declares that the tool changes nothing outside Loom (a lookup, a
    search, a fetch), so running it again is harmless. A model call that asks only for such
    tools is then recorded in the same commit as the first tool's result: one commit per turn
    instead of two. The price: a crash while those tools run asks the model again for that
    turn (its earlier answer was not durable yet, and nothing it asked for had an effect).
    """
    if fn is not None:
        return _make(fn, **options)
    return _ToolDecorator(**options)
