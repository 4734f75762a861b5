"""ctxactors: one pykka actor per session key for MCP tool calls.

No global "current session": the context travels with each call's arguments, and the
router sends the call to the actor that owns that key's state.

This module only re-exports the public names; the core behind them is private
(`_runtime`, `_registry`, `_actors`, `_call`). Errors are drawn as a tree in
`ctxactors.errors`.
"""

from ctxactors._call import caller_deadline
from ctxactors._runtime import Runtime
from ctxactors.context import ToolContext, clean_args, inject_context
from ctxactors.errors import (
    CallTimeoutError,
    ContextBudgetError,
    CtxActorsError,
    DuplicateToolError,
    InvalidArgumentsError,
    ModelError,
    NoConversationError,
    RuntimeClosedError,
    SandboxUnavailableError,
    ServerDefinitionError,
    ShardUnavailableError,
    StaleStateError,
    StoreError,
    StoreUnavailableError,
    ToolError,
    UnknownToolError,
)
from ctxactors.results import ToolResult
from ctxactors.settings import Settings
from ctxactors.tools import Scope, Server, pick, tool

__all__ = [
    "CallTimeoutError",
    "ContextBudgetError",
    "CtxActorsError",
    "DuplicateToolError",
    "InvalidArgumentsError",
    "ModelError",
    "NoConversationError",
    "Runtime",
    "RuntimeClosedError",
    "SandboxUnavailableError",
    "Scope",
    "Server",
    "ServerDefinitionError",
    "Settings",
    "ShardUnavailableError",
    "StaleStateError",
    "StoreError",
    "StoreUnavailableError",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "UnknownToolError",
    "caller_deadline",
    "clean_args",
    "inject_context",
    "pick",
    "tool",
]
