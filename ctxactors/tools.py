"""How a server declares its tools.

A tool server is a plain class: one instance holds the state of one key and lives inside that
key's actor. Its tools are methods marked with `@tool`; their typed parameters (after
``self`` and ``ctx``) become a msgspec args type, which is the single source of truth for both
validation and the published ``inputSchema``. The docstring is the description.

The context never appears in a schema: registration refuses any property that would let the
model name a session, assistant or thread itself.
"""

from __future__ import annotations

import enum
import inspect
import typing
from collections.abc import Callable
from typing import Any, ClassVar

import msgspec

from ctxactors import _attribute_state
from ctxactors._tool_loop import Cancelled, CancelledResult, ToolLoop
from ctxactors.context import SessionKey, ToolContext
from ctxactors.encodable import argument_problem, may_hold_untyped, printable, result_problem
from ctxactors.errors import (
    DuplicateToolError,
    InvalidArgumentsError,
    ServerDefinitionError,
    ToolError,
)
from ctxactors.logs import lazy_logger
from ctxactors.results import ToolResult

_asdict = msgspec.structs.asdict
# What `ToolResult.ok` passes on without encoding it (so without finding out if it can be).
_UNENCODED = (str, ToolResult)

# Property names (lower-cased, underscores removed) that would carry the context.
_CONTEXT_NAMES = frozenset({"sessionid", "assistantid", "threadid"})
# Where a handler's exception is logged (only ever on a failing call's path).
_log = lazy_logger("ctxactors.tools")


class Key(tuple[Any, ...]):
    """An actor key: ``(server, (principal, session_id), *the scope's parts)``.

    A tuple, so it compares, hashes and logs as one (and the store keys its rows by the
    same items); a tuple subclass rather than a NamedTuple because its length follows the
    scope. Read it by name: `server`, `session`, `principal`.
    """

    __slots__ = ()

    @property
    def server(self) -> str:
        name: str = self[0]
        return name

    @property
    def session(self) -> SessionKey:
        session: SessionKey = self[1]
        return session

    @property
    def principal(self) -> str | None:
        principal: str | None = self[1][0]
        return principal


class Scope(enum.Enum):
    """Which part of the context picks a server's actor (and so its state)."""

    SESSION = "session"
    ASSISTANT = "assistant"  # session + assistant
    THREAD = "thread"  # session + assistant + thread

    def key(self, server: str, ctx: ToolContext) -> Key:
        """The actor key: ``(server, (principal, session_id), ...)``, so the principal is
        part of every key. Tuples, never joined strings: ``a::b`` + ``c`` can't collide."""
        session = (ctx.principal, ctx.session_id)
        if self is Scope.SESSION:
            return Key((server, session))
        if self is Scope.ASSISTANT:
            return Key((server, session, ctx.assistant_id))
        return Key((server, session, ctx.assistant_id, ctx.thread_id))


class ToolSpec:
    """Everything the runtime knows about one tool. Built at class definition; immutable."""

    __slots__ = (
        "name",
        "server",
        "fn",
        "args_type",
        "field_names",
        "description",
        "annotations",
        "input_schema",
        "extract",
        "compensate",
        "is_async",
        "blocking",
        "_validate",
        "_untyped",
    )

    def __init__(
        self,
        server: type[Server],
        fn: Callable[..., Any],
        options: _ToolOptions,
    ) -> None:
        self.name = options.name or fn.__name__
        self.server = server
        self.fn = fn
        if inspect.isasyncgenfunction(fn):
            raise ServerDefinitionError(
                f"tool {self.name!r} of {server.__name__} is an async generator: a tool "
                "returns one result; make it an `async def` that returns it"
            )
        # Awaited on the runtime's own loop (`ctxactors._tool_loop`), its key's actor
        # waiting: one key's calls stay one at a time and in order.
        self.is_async = inspect.iscoroutinefunction(fn)
        # Run apart from the actors' small worker pool (`ctxactors._scheduler`), so a tool
        # that waits (a subprocess, a file, another key's answer) holds none of its workers.
        self.blocking = options.blocking
        self.description = inspect.cleandoc(fn.__doc__ or "").strip() or self.name
        self.args_type = _args_type(server, fn, self.name)
        self.field_names = tuple(f.name for f in msgspec.structs.fields(self.args_type))
        self.input_schema = input_schema(self.args_type)
        refuse_context_fields(self.input_schema, f"{server.__name__}.{self.name}")
        self.annotations = options.annotations()
        self.extract = options.extract
        self.compensate = options.compensate
        args_type = self.args_type
        # Strict is convert's default; passing it as a keyword doubles the call's cost.
        self._validate = lambda args: msgspec.convert(args, args_type)
        self._untyped = may_hold_untyped(args_type)

    @property
    def read_only(self) -> bool:
        return bool(self.annotations.get("readOnlyHint"))

    def validate(self, arguments: dict[str, Any]) -> Any:
        """The clean arguments as the args type, or `InvalidArgumentsError` naming the field.

        Every surface, batch operation and preset run comes through here, so this is where
        anything the JSON encoder could not write back is refused (see `ctxactors.encodable`).
        """
        problem = argument_problem(arguments, untyped=self._untyped)
        if problem is not None:
            raise InvalidArgumentsError(f"invalid arguments for {self.name!r}: {problem}")
        try:
            return self._validate(arguments)
        except msgspec.ValidationError as exc:
            raise InvalidArgumentsError(f"invalid arguments for {self.name!r}: {exc}") from None

    def invoke(
        self,
        instance: Server,
        ctx: ToolContext,
        args: Any,
        loop: ToolLoop | None = None,
        deadline: float | None = None,
    ) -> ToolResult:
        """Run the handler on a server instance; whatever it raises becomes an error result.

        An async handler's coroutine runs on `loop` until it is done, or is cancelled at
        `deadline` (`time.monotonic`). A result the encoder can't write becomes an error
        result too: it would otherwise fail at the transport, or be recorded and break
        every later history answer.
        """
        try:
            value = self.fn(instance, ctx, **_asdict(args))
            if self.is_async:
                if loop is None:
                    value.close()  # never started: no "never awaited" warning
                    raise RuntimeError("an async tool needs its runtime's event loop")
                value = loop.run(value, deadline)
            result = ToolResult.ok(value)
        except BaseException as exc:  # noqa: BLE001 - a tool must never take its actor down
            return self.failed(exc, ctx)
        if type(value) is dict or not isinstance(value, _UNENCODED):
            return result  # `ToolResult.ok` has encoded it already
        return self._checked(result)

    def start(self, instance: Server, ctx: ToolContext, args: Any) -> Any:
        """An async handler's coroutine, not started yet (a scheduler awaits it while its
        actor is parked), or the error result when the handler could not even make one."""
        try:
            return self.fn(instance, ctx, **_asdict(args))
        except BaseException as exc:  # noqa: BLE001
            return self.failed(exc, ctx)

    def returned(self, value: Any) -> ToolResult:
        """What `invoke` makes of a handler's value (an awaited coroutine's, here)."""
        try:
            result = ToolResult.ok(value)
        except BaseException as exc:  # noqa: BLE001
            return self.failed(exc, None)
        if type(value) is dict or not isinstance(value, _UNENCODED):
            return result
        return self._checked(result)

    def failed(self, exc: BaseException, ctx: ToolContext | None) -> ToolResult:
        """What `invoke` makes of what a handler raised (logged with its traceback, at
        debug, unless it is a `ToolError`: a refusal's traceback would say nothing)."""
        if isinstance(exc, Cancelled):
            return CancelledResult.error(str(exc))
        if ctx is not None and not isinstance(exc, ToolError):
            _raised(self.name, ctx, exc)
        result = ToolResult.from_exception(exc)
        text = result.text
        return result if text.isascii() else ToolResult.error(printable(text))

    def _checked(self, result: ToolResult) -> ToolResult:
        problem = result_problem(result)
        if problem is None:
            return result
        return ToolResult.error(f"tool {self.name!r} returned a bad result: {problem}")

    def definition(self) -> dict[str, Any]:
        """The MCP tool definition."""
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "annotations": dict(self.annotations),
        }

    def __repr__(self) -> str:
        return f"<ToolSpec {self.server.name}.{self.name}>"


def _raised(tool: str, ctx: ToolContext, exc: BaseException) -> None:
    """Log a handler's exception with its traceback, at debug: the call's ``tool_call``
    line already says that it failed and why; this is for whoever has to find the bug."""
    _log.debug(
        "tool_raised",
        tool=tool,
        principal=ctx.principal,
        session_id=ctx.session_id,
        assistant_id=ctx.assistant_id,
        thread_id=ctx.thread_id,
        exc_info=exc,
    )


class _ToolOptions(msgspec.Struct, frozen=True):
    name: str | None = None
    title: str | None = None
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False
    extract: Callable[..., Any] | None = None
    compensate: Callable[..., Any] | None = None
    blocking: bool = False

    def annotations(self) -> dict[str, Any]:
        hints: dict[str, Any] = {"readOnlyHint": self.read_only}
        if not self.read_only:
            hints["destructiveHint"] = self.destructive
            hints["idempotentHint"] = self.idempotent
        hints["openWorldHint"] = self.open_world
        if self.title:
            hints["title"] = self.title
        return hints


_MARK = "__ctxactors_tool__"

# ``fn(args, result) -> metadata``: what the operation history keeps of a successful call.
Extractor = Callable[[dict[str, Any], ToolResult], "dict[str, Any] | None"]


def pick(**fields: str) -> Extractor:
    """An extractor copying result fields under metadata names, skipping absent/None ones.

    ``@tool(extract=pick(created_goal="id"))`` records ``{"created_goal": "g1"}``.
    """

    def extract(args: dict[str, Any], result: ToolResult) -> dict[str, Any]:
        structured = result.structured or {}
        return {
            name: structured[field]
            for name, field in fields.items()
            if structured.get(field) is not None
        }

    return extract


@typing.overload
def tool(fn: Callable[..., Any], /) -> Callable[..., Any]: ...
@typing.overload
def tool(
    *,
    name: str | None = None,
    title: str | None = None,
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    open_world: bool = False,
    extract: Extractor | None = None,
    compensate: Callable[..., Any] | None = None,
    blocking: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
def tool(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Mark a server method as a tool: ``@tool`` or ``@tool(read_only=True, ...)``.

    The options become MCP annotations (``readOnlyHint``, ``destructiveHint``,
    ``idempotentHint``, ``openWorldHint``, ``title``). `extract` is a per-tool metadata
    extractor for the operation history and `compensate` the undo used by transactional
    batches; see those servers for their signatures. ``blocking=True`` says a sync tool
    waits on something outside Python (a subprocess, a file, the network, another key's
    answer): it then runs on a separate, elastic pool of threads instead of the actors'
    small worker pool (an ``async def`` tool never needs it: it awaits instead).
    """
    opts = _ToolOptions(**options)

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        setattr(f, _MARK, opts)
        return f

    return mark(fn) if fn is not None else mark


class Server:
    """Base class of tool servers. Subclass it, set `name` and `scope`, add `@tool` methods.

    One instance holds the state of one key and is only ever touched from that key's actor
    thread, so handlers need no locks. The instance is created inside the actor's thread
    (which matters for thread-bound resources such as SQLite connections).

    With a store, a server is durable: one that declares a `State` saves what its
    `snapshot` returns; one that doesn't, its public attributes (see
    `ctxactors._attribute_state`: a runtime with a store makes one instance at
    registration to check that they can be saved, and refuses the server if not).
    """

    name: ClassVar[str]
    scope: ClassVar[Scope] = Scope.SESSION
    tools: ClassVar[dict[str, ToolSpec]] = {}
    # The msgspec type `snapshot` returns and `restore` takes. Set it (with both methods)
    # to choose what is saved; without it, a store saves the public attributes.
    State: ClassVar[type[Any] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__.lower()
        # By method first: a subclass that overrides a tool's method replaces that tool.
        methods: dict[str, ToolSpec] = {}
        for klass in reversed(cls.__mro__):
            for attr_name, attr in vars(klass).items():
                opts = getattr(attr, _MARK, None)
                if opts is not None:
                    methods[attr_name] = ToolSpec(cls, attr, opts)
        specs: dict[str, ToolSpec] = {}
        owner: dict[str, str] = {}  # tool name -> the method that declared it
        for attr_name, spec in methods.items():
            if spec.name in specs:
                raise DuplicateToolError(
                    f"duplicate tool name {spec.name!r} in {cls.__name__}: declared by both "
                    f"its methods {owner[spec.name]!r} and {attr_name!r}"
                )
            specs[spec.name] = spec
            owner[spec.name] = attr_name
        cls.tools = specs

    @classmethod
    def create(cls, runtime: Any) -> Server:
        """Make the instance for one key (inside its actor's thread).

        Override to take what the instance needs from the runtime (the batch server keeps
        the runtime to run operations); the default ignores it.
        """
        return cls()

    @classmethod
    def attach(cls, runtime: Any) -> None:  # noqa: B027 - optional hook
        """Called once when a runtime registers this server (e.g. to add an observer)."""

    @classmethod
    def detach(cls, runtime: Any) -> None:  # noqa: B027 - optional hook
        """Called once when a runtime that attached this server closes, after its actors
        stopped (e.g. to release what `attach` made for the runtime)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the instance holds. Runs in the actor thread when it stops."""

    def snapshot(self) -> Any:
        """The whole state of this key as a `State` value (durable servers only); by
        default its public attributes, for a server that declares no `State`."""
        return _attribute_state.snapshot(self)

    def restore(self, state: Any) -> None:
        """Replace the whole state of this key with a `snapshot` (durable servers only); by
        default its public attributes, for a server that declares no `State`."""
        _attribute_state.restore(self, state)

    def is_busy(self) -> bool:
        """True while the instance must not be reaped (e.g. it has running processes).

        Called from the reaper's thread: keep it cheap and safe to read concurrently.
        """
        return False


def _args_type(server: type, fn: Callable[..., Any], tool_name: str) -> type[msgspec.Struct]:
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].name != "self":
        raise ServerDefinitionError(
            f"tool {tool_name!r} of {server.__name__} must take (self, ctx, ...arguments)"
        )
    hints = typing.get_type_hints(fn, include_extras=True)
    if len(params) < 2 or not _is_context(params[1], hints):
        # Without it the call's context would land in the first argument, and every call
        # fail with "unknown field" on it.
        raise ServerDefinitionError(
            f"tool {tool_name!r} of {server.__name__}: its second parameter must be the call "
            f"context, `ctx: ToolContext`; write `{_with_context(fn, params)}`"
        )
    fields: list[Any] = []
    for p in params[2:]:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise ServerDefinitionError(
                f"tool {tool_name!r}: parameter {p.name!r} must be a named one"
            )
        annotation = hints.get(p.name, Any)
        fields.append(
            (p.name, annotation) if p.default is p.empty else (p.name, annotation, p.default)
        )
    return msgspec.defstruct(
        f"{server.__name__}_{tool_name}_args",
        fields,
        kw_only=True,
        forbid_unknown_fields=True,
        module=server.__module__,
    )


def _is_context(param: inspect.Parameter, hints: dict[str, Any]) -> bool:
    """The parameter after ``self`` is the context: annotated `ToolContext`, or unannotated
    and named ``ctx``."""
    if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
        return False
    if param.annotation is param.empty:
        return param.name == "ctx"
    hint = hints.get(param.name)
    return isinstance(hint, type) and issubclass(hint, ToolContext)


def _with_context(fn: Callable[..., Any], params: list[inspect.Parameter]) -> str:
    """The handler's signature with ``ctx: ToolContext`` second, for the refusal to show."""
    rest = params[2:] if len(params) > 1 and params[1].name == "ctx" else params[1:]
    ctx = params[0].replace(name="ctx", annotation=_Shown("ToolContext"))
    shown = [
        p.replace(annotation=_Shown(p.annotation)) if isinstance(p.annotation, str) else p
        for p in rest
    ]
    prefix = "async def" if inspect.iscoroutinefunction(fn) else "def"
    return f"{prefix} {fn.__name__}{inspect.Signature([params[0], ctx, *shown])}"


class _Shown(str):
    """An annotation as written (``from __future__ import annotations`` keeps it a string,
    which a signature would show quoted)."""

    def __repr__(self) -> str:
        return str(self)


def input_schema(args_type: Any) -> dict[str, Any]:
    """The JSON schema of an args type, with msgspec's top-level ``$ref`` inlined.

    MCP wants ``inputSchema`` itself to be ``{"type": "object", ...}``.
    """
    schema = msgspec.json.schema(args_type)
    defs: dict[str, Any] = dict(schema.get("$defs", {}))
    ref = schema.get("$ref")
    if ref is not None:
        root = dict(defs.pop(ref.rsplit("/", 1)[-1]))
    else:
        root = {k: v for k, v in schema.items() if k != "$defs"}
    root.pop("title", None)
    root.setdefault("type", "object")
    root.setdefault("properties", {})
    if defs:
        root["$defs"] = defs
    return root


def refuse_context_fields(schema: Any, where: str) -> None:
    """Raise `TypeError` if any property in the schema could carry the call context."""
    if isinstance(schema, dict):
        for prop in (schema.get("properties") or {}).keys():
            if prop.startswith("__") or prop.replace("_", "").lower() in _CONTEXT_NAMES:
                raise ServerDefinitionError(
                    f"{where}: property {prop!r} is reserved for the call context; "
                    "take the context from the handler's ctx parameter instead"
                )
        for value in schema.values():
            refuse_context_fields(value, where)
    elif isinstance(schema, list):
        for value in schema:
            refuse_context_fields(value, where)


def collect_tools(servers: typing.Iterable[type[Server]]) -> dict[str, ToolSpec]:
    """All tools of the servers by name; duplicate names fail with both owners named."""
    table: dict[str, ToolSpec] = {}
    for server in servers:
        if not (isinstance(server, type) and issubclass(server, Server)):
            raise ServerDefinitionError(f"{server!r} is not a Server subclass")
        for name, spec in server.tools.items():
            if name in table:
                raise DuplicateToolError(
                    f"duplicate tool name {name!r}: declared by both "
                    f"{table[name].server.__name__} and {server.__name__}"
                )
            table[name] = spec
    return table
