"""Every error ctxactors raises, in one tree.

    CtxActorsError                      the base; `code` is its JSON-RPC error code
    ├── UnknownToolError                no tool of that name (-32602)
    ├── InvalidArgumentsError           arguments that aren't a JSON object or don't fit (-32602)
    ├── NoConversationError             a framework call that names no conversation (-32602)
    ├── CallTimeoutError                no reply in time (-32001)
    ├── RuntimeClosedError              the runtime takes no more calls (-32014)
    ├── ToolError                       raised by a handler: fails its call with this message
    ├── ServerDefinitionError (TypeError)   a server class that can't be registered
    │   └── DuplicateToolError (ValueError)  two tools of one name
    ├── SandboxUnavailableError (RuntimeError)  no bubblewrap sandbox, or an unsafe root
    ├── StoreError                      the state store could not do what was asked (-32010)
    │   ├── StaleStateError             another writer saved first: reload (-32011)
    │   └── StoreUnavailableError       the store is down, full or unreachable (-32012)
    ├── ShardUnavailableError           a Ray shard died during the call; retryable (-32013)
    ├── ContextBudgetError (ValueError)  a conversation window can't hold its minimum
    └── ModelError (RuntimeError)       the model gave no usable reply

The split follows MCP: a problem with the *call* (unknown tool, arguments that don't fit the
schema, a timeout, a closed runtime) raises; a problem inside the *tool* (not found, access
denied, a handler that raised, a `ToolError`) is an ordinary `ToolResult` with
``is_error=True``, so the model can read the message and act on it. The built-in base in
parentheses is the one each error had before it joined the tree, kept so that an
``except TypeError`` (say) written against it still catches it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CallTimeoutError",
    "ContextBudgetError",
    "CtxActorsError",
    "DuplicateToolError",
    "InvalidArgumentsError",
    "ModelError",
    "NoConversationError",
    "RuntimeClosedError",
    "SandboxUnavailableError",
    "ServerDefinitionError",
    "ShardUnavailableError",
    "StaleStateError",
    "StoreError",
    "StoreUnavailableError",
    "ToolError",
    "UnknownToolError",
]


class CtxActorsError(Exception):
    """Base of every error ctxactors raises; `code` is its JSON-RPC error code."""

    code: int = -32000

    def to_jsonrpc(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self)}


class UnknownToolError(CtxActorsError):
    """No tool of that name is registered.

    -32602 (invalid params), as in the MCP specification's own example: -32601 would say the
    method (``tools/call``) is unknown.
    """

    code = -32602


class InvalidArgumentsError(CtxActorsError):
    """The arguments are not a JSON object, or don't fit the tool's schema."""

    code = -32602


class NoConversationError(CtxActorsError):
    """A host framework called a tool without saying which conversation it belongs to.

    Raised by `ctxactors.integrations`, never run under a shared ``default`` session: the
    message says where that framework carries the conversation's id. Not an
    `InvalidArgumentsError`, because the model can't fix it by retrying; the host must.
    """

    code = -32602


class CallTimeoutError(CtxActorsError):
    """The call got no reply in time. A late reply is discarded, never misdelivered."""

    code = -32001


class RuntimeClosedError(CtxActorsError):
    """The runtime was closed; it takes no more calls.

    -32014, beside the store and shard codes: the MCP specification reserves -32002 (and
    everything from -32020 to -32099) for its own errors.
    """

    code = -32014


class ToolError(CtxActorsError):
    """Raise from a handler to fail the call with exactly this message (no type prefix).

    Use it for the tool's own refusals ("goal g9 not found"); anything else a handler raises
    is reported as ``"<ExceptionType>: <text>"``. It never leaves the runtime: the call's
    result carries it.
    """


class ServerDefinitionError(CtxActorsError, TypeError):
    """A server class that can't be registered: a tool whose signature or schema is wrong
    (a parameter that would carry the call context, say), or not a `Server` at all."""


class DuplicateToolError(ServerDefinitionError, ValueError):
    """Two tools of one name, in one server class or across the servers of a runtime."""


class SandboxUnavailableError(CtxActorsError, RuntimeError):
    """bubblewrap is missing or can't create its namespaces here, or the workspace root is
    unsafe (a symlink, another user's, writable by others); the message says why."""


class StoreError(CtxActorsError):
    """The state store could not do what was asked."""

    code = -32010


class StaleStateError(StoreError):
    """A save named a revision the store no longer holds: another writer got there first.

    The writer's state is out of date; it must reload before it may save again.
    """

    code = -32011

    def __init__(self, key: tuple[str | None, ...], expected: int, current: int) -> None:
        super().__init__(
            f"state {list(key)} changed under this writer: it loaded revision {expected}, "
            f"the store holds {current}; reload before saving"
        )
        self.key = key
        self.expected = expected
        self.current = current


class StoreUnavailableError(StoreError):
    """The store is down, full or unreachable; nothing of the failed batch was written.

    Its message is for the operator (it may say where the store is: a Redis address);
    a transport answers a client `tenant_message` instead and logs the message."""

    code = -32012
    tenant_message = "the state store is unavailable; retry later"


class ShardUnavailableError(CtxActorsError):
    """The Ray shard that owns the session died or could not be reached during the call.

    Retryable: Ray restarts the shard and the session's state loads from the store on its
    next call. A call that changes state may or may not have been applied (it is in doubt:
    retry it only if doing it twice is harmless, or read the state first); the Ray backend
    retries a read-only call itself until its timeout.
    """

    # Not -32020..-32099: MCP reserves them, and the SDK client silently sends a call again
    # when refused with -32020 (HEADER_MISMATCH), which would run an in-doubt call twice.
    code = -32013
    retryable = True


class ContextBudgetError(CtxActorsError, ValueError):
    """The budget cannot hold even the system message and the newest step, shortened."""


class ModelError(CtxActorsError, RuntimeError):
    """The model could not give a reply: an HTTP error, a malformed body, a spent script."""
