"""What a tool call gives back: a `ToolResult`.

A problem inside the *tool* (not found, access denied, a handler that raised) is an ordinary
`ToolResult` with `is_error=True`, so the model can read the message and act on it; a
problem with the *call* raises (see `ctxactors.errors`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ctxactors.errors import ToolError

_json_encode = msgspec.json.Encoder().encode


class JSONText(dict[str, Any]):
    """The text block `ToolResult.ok` makes of a dict: a plain text block that also says its
    text is the JSON of the result's `structured` as it was then (the operation history
    keeps that text instead of the dict, which the server may change later)."""

    __slots__ = ()


class ToolResult(msgspec.Struct, frozen=True):
    """The result of one tool call, in MCP's shape.

    `content` holds MCP content blocks (``{"type": "text", "text": ...}``); `structured` is
    the machine-readable result (MCP's ``structuredContent``) when the tool returned one.
    """

    content: list[dict[str, Any]] = msgspec.field(default_factory=list)
    structured: dict[str, Any] | None = None
    is_error: bool = False

    @classmethod
    def ok(cls, value: Any = None) -> ToolResult:
        """Wrap what a handler returned: a dict is structured, a string is text."""
        if type(value) is dict:  # the common result first; positional (keywords cost more)
            return cls([JSONText(type="text", text=_json_encode(value).decode())], value)
        if isinstance(value, ToolResult):
            return value
        if value is None:
            return cls(content=[])
        if isinstance(value, str):
            return cls(content=[{"type": "text", "text": value}])
        if isinstance(value, msgspec.Struct):
            value = msgspec.to_builtins(value)
        if isinstance(value, dict):
            return cls([JSONText(type="text", text=_json_encode(value).decode())], value)
        return cls(content=[{"type": "text", "text": _json_encode(value).decode()}])

    @classmethod
    def error(cls, message: str) -> ToolResult:
        return cls(content=[{"type": "text", "text": message}], is_error=True)

    @classmethod
    def from_exception(cls, exc: BaseException) -> ToolResult:
        if isinstance(exc, ToolError):
            return cls.error(str(exc))
        return cls.error(f"{type(exc).__name__}: {exc}")

    @property
    def text(self) -> str:
        """All text blocks joined by newlines."""
        return "\n".join(b.get("text", "") for b in self.content if b.get("type") == "text")

    def to_mcp(self) -> dict[str, Any]:
        return {
            "content": list(self.content),
            "structuredContent": self.structured,
            "isError": self.is_error,
        }
