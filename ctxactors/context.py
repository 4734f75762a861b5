"""The call context (session, assistant, thread) and how it travels with the arguments.

The LLM never sees the context: its tool schemas are clean. The host's middleware
(`inject_context`) appends ``__sessionId``/``__assistantId``/``__threadId`` to the arguments
the LLM produced, and the router reads them back (`ToolContext.from_args`) and strips them
(`clean_args`) before validation. Any ``__*`` field the LLM wrote itself is dropped on the
way in, so a model can't spoof another session or assistant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ctxactors.logs import get_logger
from ctxactors.results import InvalidArgumentsError

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

_decode = msgspec.json.Decoder().decode


class ToolContext(msgspec.Struct, frozen=True):
    """Who is calling: the conversation (session), the assistant, and an optional thread.

    Immutable and hashable, so it can be a dict key and be shared between threads.
    """

    session_id: str = DEFAULT_SESSION
    assistant_id: str | None = None
    thread_id: str | None = None

    @classmethod
    def from_args(
        cls, arguments: Mapping[str, Any] | str | None, meta: Mapping[str, Any] | None = None
    ) -> ToolContext:
        """Read the context from reserved argument fields, then from MCP ``_meta``.

        Raises `InvalidArgumentsError` when a reserved field holds anything but a string.
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
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, Mapping):
        return dict(arguments)
    kind = "null" if arguments is None else type(arguments).__name__
    raise InvalidArgumentsError(f"arguments must be a JSON object, got {kind}")


def read_context(
    arguments: Mapping[str, Any], meta: Mapping[str, Any] | None = None
) -> tuple[ToolContext, bool]:
    """The context of a call and whether a session was given at all.

    Arguments win over ``_meta``; a missing session falls back to ``"default"`` (the caller
    decides whether to warn about it, so the flag is returned).
    """
    found: dict[str, str] = {}
    for attr, names in RESERVED_FIELDS.items():
        for name in names:
            if name in arguments:
                value = arguments[name]
                if not isinstance(value, str):
                    raise InvalidArgumentsError(
                        f"reserved field {name!r} must be a string, got {type(value).__name__}"
                    )
                found[attr] = value
                break
        else:
            if meta and (value := meta.get(META_KEYS[attr])) is not None:
                if not isinstance(value, str):
                    raise InvalidArgumentsError(
                        f"_meta field {META_KEYS[attr]!r} must be a string, "
                        f"got {type(value).__name__}"
                    )
                found[attr] = value
    if not found:
        return _DEFAULT_CONTEXT, False
    return ToolContext(**found), "session_id" in found


_DEFAULT_CONTEXT = ToolContext()


def clean_args(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments without any top-level ``__*`` field."""
    # A non-string key is kept for validation to refuse (it has no `startswith`).
    return {k: v for k, v in arguments.items() if not (isinstance(k, str) and k.startswith("__"))}


def inject_context(
    ai_arguments: Mapping[str, Any] | str | None, ctx: ToolContext
) -> dict[str, Any]:
    """Host-side middleware: the LLM's arguments plus the caller's context.

    The LLM's own keys and values are kept as they are; any ``__*`` field the LLM supplied
    is dropped with a warning (it is a spoofing attempt or a mistake, never trusted).
    """
    args = parse_arguments(ai_arguments)
    injected = clean_args(args)
    if len(injected) != len(args):
        # get_logger configures logging (to stderr) in a host that never made a Runtime.
        get_logger("ctxactors.context").warning(
            "spoofed_context_dropped",
            fields=sorted(k for k in args if k.startswith("__")),
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
