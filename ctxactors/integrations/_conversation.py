"""What every integration shares: the conversation read from a framework's object, the
host ``_meta`` that carries it, the tools chosen by name, and the import of the framework.

Kept free of any framework import, so each integration module pulls in only its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from ctxactors.context import META_KEYS, ToolContext, check_id
from ctxactors.errors import InvalidArgumentsError, NoConversationError, UnknownToolError
from ctxactors.results import ToolResult

__all__ = [
    "conversation_of",
    "definitions",
    "meta_of",
    "require",
    "run",
]


def require(module: str, *, extra: str, integration: str) -> ModuleType:
    """Import `module`, or raise `ImportError` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"ctxactors.integrations.{integration} needs {module.split('.')[0]!r}, which is "
            f"not installed: pip install 'ctxactors[{extra}]'"
        ) from exc


# The attribute (or mapping key) names each context part is read from, first found wins.
_SESSION_NAMES = ("session_id", "conversation_id")


def conversation_of(source: Any) -> ToolContext | None:
    """The context a framework object names, or None when it names no session.

    `source` is a `ToolContext` (used as it is), a mapping, or any object with a
    ``session_id`` (or ``conversation_id``) and optional ``assistant_id``, ``thread_id``.
    A value that is not a usable id raises `NoConversationError` saying which.
    """
    if source is None:
        return None
    if isinstance(source, ToolContext):
        return source
    if isinstance(source, Mapping):
        get = source.get
    else:

        def get(name: str, default: Any = None) -> Any:
            return getattr(source, name, default)

    session = next((v for name in _SESSION_NAMES if (v := get(name)) is not None), None)
    if session is None:
        return None
    return ToolContext(
        _id(session, "session_id"),
        _id(get("assistant_id"), "assistant_id"),
        _id(get("thread_id"), "thread_id"),
    )


def _id(value: Any, what: str) -> Any:
    if value is None:
        return None
    if not isinstance(value, str):
        raise NoConversationError(
            f"the conversation's {what} must be a string, got {type(value).__name__}"
        )
    try:
        return check_id(value, f"the conversation's {what}")
    except InvalidArgumentsError as exc:
        raise NoConversationError(str(exc)) from None


def meta_of(ctx: ToolContext) -> dict[str, str]:
    """The host ``_meta`` that carries `ctx` (the ``ctxactors/*`` keys)."""
    meta = {META_KEYS["session_id"]: ctx.session_id}
    if ctx.assistant_id is not None:
        meta[META_KEYS["assistant_id"]] = ctx.assistant_id
    if ctx.thread_id is not None:
        meta[META_KEYS["thread_id"]] = ctx.thread_id
    return meta


def definitions(runtime: Any, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The MCP definitions of the runtime's tools: all, or those named (in that order).

    Every tool, whatever the runtime's listing mode (``tools="unified"`` only shortens
    what an MCP client is shown). An unknown name raises `UnknownToolError`.
    """
    tools = runtime.tools
    if names is None:
        return [spec.definition() for spec in tools.values()]
    chosen = []
    for name in names:
        spec = tools.get(name)
        if spec is None:
            raise UnknownToolError(f"unknown tool {name!r}")
        chosen.append(spec.definition())
    return chosen


async def run(
    runtime: Any, name: str, arguments: Mapping[str, Any] | str | None, ctx: ToolContext
) -> ToolResult:
    """One call through `Runtime.acall`, the context as host ``_meta`` (no fallback).

    A `ToolContext`'s principal is passed on: the host is trusted code, and a host serving
    several tenants namespaces their keys with it as an authenticating transport does.
    """
    result: ToolResult = await runtime.acall(
        name, arguments, meta=meta_of(ctx), session_fallback=None, principal=ctx.principal
    )
    return result
