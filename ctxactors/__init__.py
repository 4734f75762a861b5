"""ctxactors: one pykka actor per session key for MCP tool calls.

No global "current session": the context travels with each call's arguments, and the
router sends the call to the actor that owns that key's state.
"""

from ctxactors._runtime import Runtime
from ctxactors.context import ToolContext, clean_args, inject_context
from ctxactors.results import (
    CallTimeoutError,
    CtxActorsError,
    InvalidArgumentsError,
    RuntimeClosedError,
    ToolError,
    ToolResult,
    UnknownToolError,
)
from ctxactors.tools import Scope, Server, pick, tool

__all__ = [
    "CallTimeoutError",
    "CtxActorsError",
    "InvalidArgumentsError",
    "Runtime",
    "RuntimeClosedError",
    "Scope",
    "Server",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "UnknownToolError",
    "clean_args",
    "inject_context",
    "pick",
    "tool",
]
