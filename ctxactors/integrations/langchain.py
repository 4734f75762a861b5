"""The runtime's tools in LangChain and LangGraph; LangGraph's ``thread_id`` is the session.

Embedded, two lines of glue::

    agent_tools = ctxactors.integrations.langchain.tools(runtime)
    await graph.ainvoke(inputs, config={"configurable": {"thread_id": conversation_id}})

The conversation comes from the `RunnableConfig` each tool call runs under (LangGraph hands
every node and tool its run's config): ``configurable["thread_id"]`` is the session,
``configurable["assistant_id"]`` the assistant and ``configurable["ctxactors_thread_id"]``
the ctxactors thread (both optional). A call whose config names no ``thread_id`` raises
`NoConversationError`; it never runs under a shared ``default`` session.

Over MCP, langchain-mcp-adapters' tools send the same context as host ``__*`` arguments::

    MultiServerMCPClient(connections, tool_interceptors=[interceptor()])

This module imports nothing from ``ctxactors[serve]`` (no ``mcp``): langchain-mcp-adapters
needs ``mcp<2`` and ``[serve]`` ``mcp>=2.3``, so a host installs ``ctxactors[langchain]``
beside the adapter and runs ``ctxactors serve`` from another environment.

Errors, as LangChain expects them: arguments that don't fit the tool's schema and a tool's
own failure are a `ToolException` each tool handles (``handle_tool_error=True``) into a
``ToolMessage`` with ``status="error"``, so the model reads the message and can retry;
protocol errors (unknown tool, timeout, closed runtime) and `NoConversationError` raise.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from ctxactors.context import ToolContext, inject_context
from ctxactors.errors import InvalidArgumentsError, NoConversationError
from ctxactors.integrations import _conversation
from ctxactors.integrations._conversation import conversation_of, definitions, meta_of, require
from ctxactors.results import ToolResult

require("langchain_core", extra="langchain", integration="langchain")

from langchain_core.runnables import RunnableConfig, ensure_config  # noqa: E402
from langchain_core.tools import BaseTool, ToolException  # noqa: E402
from pydantic import PrivateAttr  # noqa: E402

__all__ = ["ContextInterceptor", "RuntimeTool", "conversation", "interceptor", "tools"]

NO_CONVERSATION = (
    "no conversation given: run the tool (or the graph) with "
    'config={"configurable": {"thread_id": <the conversation\'s id>}}; '
    '"assistant_id" and "ctxactors_thread_id" there are optional'
)


def tools(runtime: Any, names: Iterable[str] | None = None) -> list[BaseTool]:
    """The runtime's tools (all, or those named, in that order) as async LangChain tools.

    Each call runs through `Runtime.acall` in the conversation its `RunnableConfig` names
    (see `conversation`). An unknown name raises `UnknownToolError`.
    """
    return [RuntimeTool.of(runtime, definition) for definition in definitions(runtime, names)]


def conversation(config: Mapping[str, Any] | None) -> ToolContext:
    """The context a `RunnableConfig` names: ``configurable["thread_id"]`` is the session,
    ``assistant_id`` the assistant, ``ctxactors_thread_id`` the thread.

    Raises `NoConversationError` when it names no ``thread_id``. An int or UUID id is
    taken as its text, as LangGraph's own checkpointers take it.
    """
    configurable = (config or {}).get("configurable") or {}
    ctx = conversation_of(
        {
            "session_id": _text(configurable.get("thread_id")),
            "assistant_id": _text(configurable.get("assistant_id")),
            "thread_id": _text(configurable.get("ctxactors_thread_id")),
        }
    )
    if ctx is None:
        raise NoConversationError(NO_CONVERSATION)
    return ctx


def _text(value: Any) -> Any:
    if isinstance(value, uuid.UUID) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    return value


class RuntimeTool(BaseTool):
    """One runtime tool as a LangChain tool; make them with `tools`.

    Its ``args_schema`` is the tool's MCP ``inputSchema`` (a JSON schema dict, which
    LangChain passes through unvalidated: the runtime validates, once). It reads its
    conversation from the config it runs under (`ensure_config`), not from a ``config``
    parameter, so a tool argument named ``config`` stays the model's.
    """

    handle_tool_error: bool = True
    _runtime: Any = PrivateAttr()

    @classmethod
    def of(cls, runtime: Any, definition: Mapping[str, Any]) -> RuntimeTool:
        made = cls(
            name=definition["name"],
            description=definition.get("description") or "",
            args_schema=definition["inputSchema"],
        )
        made._runtime = runtime
        return made

    async def _arun(self, /, **arguments: Any) -> Any:
        ctx = conversation(ensure_config())
        try:
            result = await _conversation.run(self._runtime, self.name, arguments, ctx)
        except InvalidArgumentsError as exc:
            raise ToolException(str(exc)) from exc
        return _output(result)

    def _run(self, /, **arguments: Any) -> Any:
        # LangChain's sync path (`invoke`); the caller's thread waits for the reply.
        ctx = conversation(ensure_config())
        try:
            result = self._runtime.call(
                self.name, arguments, meta=meta_of(ctx), session_fallback=None
            )
        except InvalidArgumentsError as exc:
            raise ToolException(str(exc)) from exc
        return _output(result)


def _output(result: ToolResult) -> Any:
    """What the tool returns: the structured result (LangChain gives the model its JSON
    text in the ``ToolMessage``) or the text; a tool's own failure as a ToolException."""
    if result.is_error:
        raise ToolException(result.text)
    return result.structured if result.structured is not None else result.text


# langchain-mcp-adapters' handler: the next interceptor or the MCP call itself.
Handler = Callable[[Any], Awaitable[Any]]


class ContextInterceptor:
    """A langchain-mcp-adapters ``ToolCallInterceptor`` that adds the conversation to each
    call's arguments as host ``__sessionId``/``__assistantId``/``__threadId`` (dropping any
    ``__*`` the model wrote). Make one with `interceptor`.

    The adapter's client can't set ``_meta``, so the context travels as arguments, which
    `ctxactors serve` reads when ``_meta`` carries none. Duck-typed against the adapter's
    ``MCPToolCallRequest`` (``args``, ``runtime``, ``override``): importing the adapter
    here would tie this module to its ``mcp<2``.
    """

    async def __call__(self, request: Any, handler: Handler) -> Any:
        ctx = conversation(_config_of(request))
        return await handler(request.override(args=inject_context(request.args, ctx)))


def _config_of(request: Any) -> RunnableConfig:
    """The call's config: LangGraph's injected ``ToolRuntime`` carries it inside a graph;
    outside one, the config the tool was invoked with is the current one."""
    config = getattr(getattr(request, "runtime", None), "config", None)
    return config if isinstance(config, Mapping) else ensure_config()  # type: ignore[return-value]


def interceptor() -> ContextInterceptor:
    """The interceptor for ``MultiServerMCPClient(..., tool_interceptors=[interceptor()])``
    (or ``load_mcp_tools(..., tool_interceptors=...)``)."""
    return ContextInterceptor()
