"""The call context (principal, session, assistant, thread) and where it comes from.

The LLM never sees the context: its tool schemas are clean. The host passes it either in
the request's MCP ``_meta`` (``ctxactors/sessionId``, ``ctxactors/assistantId``,
``ctxactors/threadId``), which the model can never write, or through its middleware
(`inject_context`), which appends ``__sessionId``/``__assistantId``/``__threadId`` to the
arguments the LLM produced after dropping any ``__*`` field the LLM wrote itself.

Precedence (`read_context`), strongest first:

1. the principal, from an authenticated transport only: it namespaces every key, and no
   argument or ``_meta`` field can name or change it;
2. ``_meta``: when it carries any context key (``ctxactors/*``, or a carrier: a key a host
   sends its own conversation id in, `Carriers`), the context comes from ``_meta`` alone and
   every ``__*`` argument is dropped as spoofing (the host did not inject it, the model did);
   for each part of the context the first key present, ``ctxactors/*`` before the carriers
   in their configured order, gives it;
3. otherwise the ``__*`` arguments (camelCase before snake_case);
4. for the session only, the caller's fallback: the MCP session id over streamable HTTP,
   ``"default"`` for stdio and the embedded runtime, or none at all (the call is refused).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, TypeGuard

import msgspec

from ctxactors.errors import InvalidArgumentsError
from ctxactors.logs import get_logger
from ctxactors.settings import HOST_CONTEXT_META

SESSION_ID = "__sessionId"
ASSISTANT_ID = "__assistantId"
THREAD_ID = "__threadId"

# Every accepted spelling, camelCase first: when both are given, camelCase wins.
RESERVED_FIELDS: dict[str, tuple[str, ...]] = {
    "session_id": (SESSION_ID, "__session_id"),
    "assistant_id": (ASSISTANT_ID, "__assistant_id"),
    "thread_id": (THREAD_ID, "__thread_id"),
}
META_KEYS: dict[str, str] = {
    "session_id": "ctxactors/sessionId",
    "assistant_id": "ctxactors/assistantId",
    "thread_id": "ctxactors/threadId",
}
DEFAULT_SESSION = "default"
# What a refused context-less call is told (over HTTP there is no shared default session).
NO_SESSION_MESSAGE = (
    "no session given: pass the conversation's id in the request's _meta under "
    f"{META_KEYS['session_id']!r} or a key the server reads (ctxactors serve --context-meta "
    f"KEY=session), or as the {SESSION_ID!r} argument that the host's inject_context adds, "
    "or use a stateful MCP session"
)
# What the first call that falls back to the session `default` logs (once per runtime).
SHARED_SESSION_FIX = (
    f"calls that name no conversation all share the session {DEFAULT_SESSION!r}: have the "
    f"host send its conversation's id in _meta under {META_KEYS['session_id']!r} (or a key "
    "given to ctxactors serve --context-meta KEY=session), or add it to the arguments with "
    "inject_context; ctxactors serve --session-fallback refuse refuses such calls instead. "
    "Logged once."
)


class Carriers(NamedTuple):
    """The ``_meta`` keys read for each part of the context, strongest first: the
    ``ctxactors/*`` key, then the carriers a host sends (`Settings.context_meta`) in order.

    Build it with `Carriers.of` once (a runtime does, from its settings), not per call.
    """

    session: tuple[str, ...]
    assistant: tuple[str, ...]
    thread: tuple[str, ...]

    @classmethod
    def of(cls, context_meta: Iterable[tuple[str, str]]) -> Carriers:
        """The carriers of ``(key, role)`` pairs (role: session, assistant or thread), each
        role's after its ``ctxactors/*`` key."""
        keys: dict[str, list[str]] = {"session": [], "assistant": [], "thread": []}
        for key, role in context_meta:
            if role not in keys:
                raise ValueError(
                    f"{key!r}: role must be session, assistant or thread, not {role!r}"
                )
            if key not in keys[role]:
                keys[role].append(key)
        return cls(
            (META_KEYS["session_id"], *keys["session"]),
            (META_KEYS["assistant_id"], *keys["assistant"]),
            (META_KEYS["thread_id"], *keys["thread"]),
        )


# What `read_context` reads unless told otherwise: as a runtime with default settings.
DEFAULT_CARRIERS = Carriers.of(HOST_CONTEXT_META)

# A session's identity: (principal, session_id). Principal A's "s1" is not B's "s1".
SessionKey = tuple[str | None, str]

_decode = msgspec.json.Decoder().decode


class ToolContext(msgspec.Struct, frozen=True):
    """Who is calling: the conversation (session), the assistant, an optional thread, and
    the authenticated principal that owns them (None without authentication).

    Immutable and hashable, so it can be a dict key and be shared between threads. The
    principal comes last so that positional use of the first three stays as it was.
    """

    session_id: str = DEFAULT_SESSION
    assistant_id: str | None = None
    thread_id: str | None = None
    principal: str | None = None

    @property
    def session_key(self) -> SessionKey:
        """The session's identity: it namespaces the session's actors and shared state."""
        return (self.principal, self.session_id)

    @classmethod
    def from_args(
        cls, arguments: Mapping[str, Any] | str | None, meta: Mapping[str, Any] | None = None
    ) -> ToolContext:
        """Read the context as `Runtime.call` does (see `read_context`), without principal.

        Raises `InvalidArgumentsError` when a context field holds anything but a string.
        """
        return read_context(parse_arguments(arguments), meta)[0]


def parse_arguments(arguments: Mapping[str, Any] | str | bytes | None) -> dict[str, Any]:
    """Turn call arguments into a dict: None is ``{}``, a string is parsed as JSON.

    Anything that is not a JSON object raises `InvalidArgumentsError` saying what it was.
    """
    if arguments is None:
        return {}
    if isinstance(arguments, str | bytes):
        try:
            arguments = _decode(arguments)
        except msgspec.DecodeError as exc:
            raise InvalidArgumentsError(f"arguments are not valid JSON: {exc}") from None
        except RecursionError:  # msgspec's answer to nesting deeper than the stack allows
            raise InvalidArgumentsError("arguments are nested too deeply to decode") from None
        except UnicodeEncodeError as exc:  # a str with a lone surrogate has no UTF-8 form
            raise InvalidArgumentsError(
                f"arguments are not valid text: {exc.reason} at character {exc.start}"
            ) from None
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, Mapping):
        return dict(arguments)
    kind = "null" if arguments is None else type(arguments).__name__
    raise InvalidArgumentsError(f"arguments must be a JSON object, got {kind}")


def logged_fields(names: Iterable[str]) -> list[str]:
    """Spoofed field names as a log line shows them: a model chose them, so at most 16, each
    cut to 64 characters (a body of megabytes must not become a line of megabytes)."""
    return [name[:64] for name in sorted(names)[:16]]


def read_context(
    arguments: Mapping[str, Any],
    meta: Mapping[str, Any] | None = None,
    *,
    principal: str | None = None,
    fallback: str | None = DEFAULT_SESSION,
    carriers: Carriers = DEFAULT_CARRIERS,
) -> tuple[ToolContext, list[str] | None, bool]:
    """The context of a call, the ``__*`` arguments dropped as spoofing, and whether the
    session is the `fallback`.

    ``_meta`` with any context key of `carriers` decides the whole context (each part from
    the first of its keys present) and every ``__*`` argument is dropped (returned, for the
    caller to log); otherwise the ``__*`` arguments decide. A session named by neither is
    `fallback`; with ``fallback=None`` that raises `InvalidArgumentsError` saying how to
    pass one. A context value that is not a string, or not an id (`check_id`), raises too.
    """
    if meta and (from_meta := _from_meta(meta, carriers)) is not None:
        session, assistant, thread = from_meta
        spoofed = [name for name in arguments if _reserved(name)] or None
    else:
        session = _argument(arguments, SESSION_ID, "__session_id")
        assistant = _argument(arguments, ASSISTANT_ID, "__assistant_id")
        thread = _argument(arguments, THREAD_ID, "__thread_id")
        spoofed = None
    if session is None:
        if fallback is None:
            raise InvalidArgumentsError(NO_SESSION_MESSAGE)
        return ToolContext(fallback, assistant, thread, principal), spoofed, True
    return ToolContext(session, assistant, thread, principal), spoofed, False


MAX_ID = 256
# What no id may hold: control characters (C0, DEL, C1) and lone surrogates. Such an id
# could not travel in an HTTP header or be stored as text, so it would name a session that
# exists on one surface only.
_NOT_IN_IDS = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def check_id(value: str, what: str) -> str:
    """`value` if it can be a session, assistant or thread id on every surface, else
    `InvalidArgumentsError` naming `what` and the reason."""
    if not 0 < len(value) <= MAX_ID:
        raise InvalidArgumentsError(f"{what} must be 1 to {MAX_ID} characters")
    if not value.isascii() or not value.isprintable():  # fast path: printable ASCII
        bad = _NOT_IN_IDS.search(value)
        if bad is not None:
            raise InvalidArgumentsError(
                f"{what} contains the character {bad[0]!r}, which no header carries"
            )
    if value != value.strip(" \t"):
        raise InvalidArgumentsError(f"{what} starts or ends with a space or tab")
    return value


def _argument(arguments: Mapping[str, Any], camel: str, snake: str) -> str | None:
    """A context argument, camelCase first; a non-string value is refused naming it."""
    value = arguments.get(camel, _ABSENT)
    name = camel
    if value is _ABSENT:
        value = arguments.get(snake, _ABSENT)
        if value is _ABSENT:
            return None
        name = snake
    return _as_id(value, "reserved field", name)


def _as_id(value: Any, source: str, name: str) -> str:
    """A context value as an id: a plain one at once, another string through `check_id`;
    anything else is refused naming it (the message is built only then)."""
    if _plain_id(value):
        return value
    if isinstance(value, str):
        return check_id(value, f"{source} {name!r}")
    raise InvalidArgumentsError(f"{source} {name!r} must be a string, got {type(value).__name__}")


def _from_meta(
    meta: Mapping[str, Any], carriers: Carriers
) -> tuple[str | None, str | None, str | None] | None:
    """The context in ``_meta``, or None when it carries no context key (null is none)."""
    found = (
        _meta_value(meta, carriers.session),
        _meta_value(meta, carriers.assistant),
        _meta_value(meta, carriers.thread),
    )
    return None if found == (None, None, None) else found


def _meta_value(meta: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    """The first of `keys` present (not null) in `meta`, checked as an id; the later ones
    are not read (another host's key can't break a call whose context is already named)."""
    for key in keys:
        value = meta.get(key)
        if value is not None:
            return _as_id(value, "_meta field", key)
    return None


_ABSENT = object()


def split_context(
    arguments: Mapping[str, Any],
    meta: Mapping[str, Any] | None = None,
    *,
    principal: str | None = None,
    fallback: str | None = DEFAULT_SESSION,
    carriers: Carriers = DEFAULT_CARRIERS,
) -> tuple[ToolContext, dict[str, Any], list[str] | None, bool]:
    """`read_context` and `clean_args` at once, as the router needs them: the context, the
    clean arguments, the ``__*`` arguments dropped as spoofing, and whether the session is
    the `fallback`.

    The common call (no ``_meta``; ``__*`` fields only the camelCase ids, each a plain
    id) is read here in one pass; anything else goes through `read_context`, which decides.
    """
    # A plain loop: no call per key (and no comprehension's function, on every call's
    # path). A non-string key is kept, for validation to refuse.
    clean = {}
    given = 0  # how many ``__*`` fields
    for key, value in arguments.items():
        if isinstance(key, str) and key[:2] == "__":
            given += 1
        else:
            clean[key] = value
    if not meta:
        if not given:
            if fallback is None:
                raise InvalidArgumentsError(NO_SESSION_MESSAGE)
            return ToolContext(fallback, None, None, principal), clean, None, True
        get = arguments.get
        session, assistant, thread = get(SESSION_ID), get(ASSISTANT_ID), get(THREAD_ID)
        if (
            _plain_id(session)
            and (assistant is None or _plain_id(assistant))
            and (thread is None or _plain_id(thread))
            # no other ``__*`` field (a snake_case id, an explicit null): read_context decides
            and given == 1 + (assistant is not None) + (thread is not None)
        ):
            return ToolContext(session, assistant, thread, principal), clean, None, False
    ctx, spoofed, defaulted = read_context(
        arguments, meta, principal=principal, fallback=fallback, carriers=carriers
    )
    return ctx, clean, spoofed, defaulted


def _plain_id(value: Any) -> TypeGuard[str]:
    """An id `check_id` lets through, found without building its error message: printable
    ASCII with no space at either end (most ids; the others go to `check_id`)."""
    return (
        type(value) is str
        and 0 < len(value) <= MAX_ID
        and value.isascii()
        and value.isprintable()
        and value[0] != " "
        and value[-1] != " "
    )


def clean_args(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments without any top-level ``__*`` field."""
    return {k: v for k, v in arguments.items() if not _reserved(k)}


def _reserved(name: Any) -> bool:
    """A ``__*`` field. A non-string key (the embedded API allows one) is not: it is kept
    for validation to refuse."""
    return isinstance(name, str) and name.startswith("__")


def inject_context(
    ai_arguments: Mapping[str, Any] | str | None, ctx: ToolContext
) -> dict[str, Any]:
    """Host-side middleware: the LLM's arguments plus the caller's context.

    The LLM's own keys and values are kept as they are; any ``__*`` field the LLM supplied
    is dropped with a warning (it is a spoofing attempt or a mistake, never trusted).
    The principal is not injected: only the transport that authenticated it passes it.
    """
    args = parse_arguments(ai_arguments)
    injected = clean_args(args)
    if len(injected) != len(args):
        get_logger("ctxactors.context").warning(
            "spoofed_context_dropped",
            fields=logged_fields(k for k in args if _reserved(k)),
            session_id=ctx.session_id,
            assistant_id=ctx.assistant_id,
            thread_id=ctx.thread_id,
        )
    injected[SESSION_ID] = ctx.session_id
    if ctx.assistant_id is not None:
        injected[ASSISTANT_ID] = ctx.assistant_id
    if ctx.thread_id is not None:
        injected[THREAD_ID] = ctx.thread_id
    return injected
