"""The runtime's tools in the OpenAI Agents SDK, each call in its run's conversation.

    agent = Agent(name="planner", tools=openai_agents.tools(runtime))
    await Runner.run(agent, "plan my week", context=ToolContext(session_id="chat-42"))

The conversation is the run's ``context`` (what ``Runner.run(..., context=)`` was given): a
`ctxactors.ToolContext`, or any object or mapping with ``session_id`` (or
``conversation_id``) and optional ``assistant_id``, ``thread_id``. It travels as host
``_meta``, so a ``__sessionId`` the model writes into its arguments is dropped, never used.

Over MCP the SDK's own servers send that conversation with `meta_resolver`::

    MCPServerStdio(params, tool_meta_resolver=meta_resolver(), failure_error_function=None)

Errors, as ctxactors splits them (`ctxactors.errors`): arguments that don't fit the tool's
schema and a tool's own failure are tool outputs the model reads (and can act on); a run
without a conversation raises `NoConversationError` out of `Runner.run` (also an SDK
`UserError`, so the SDK lets it through as it is); other protocol errors (a closed
runtime, a timeout) raise out of the run as the SDK raises any tool's exception: a
`UserError` whose ``__cause__`` is the ctxactors error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from ctxactors._runtime import Runtime
from ctxactors.context import ToolContext
from ctxactors.errors import InvalidArgumentsError, NoConversationError
from ctxactors.integrations import _conversation
from ctxactors.results import ToolResult

# Before the SDK's imports below: without it, `import` fails naming the extra to install.
_conversation.require("agents", extra="openai-agents", integration="openai_agents")

from agents import FunctionTool, RunContextWrapper, UserError  # noqa: E402
from agents.mcp import MCPToolMetaContext  # noqa: E402
from agents.tool_context import ToolContext as _SDKToolContext  # noqa: E402

__all__ = ["meta_resolver", "tools"]

_HOW = (
    "pass the conversation as the run's context: "
    "Runner.run(agent, input, context=ctxactors.ToolContext(session_id=...)) "
    "(or an object or mapping with session_id, optional assistant_id and thread_id)"
)


class _NoConversation(NoConversationError, UserError):
    """A `NoConversationError` the SDK lets out of `Runner.run` as it is: it wraps any other
    exception a tool raises in a `UserError`, where ``except NoConversationError`` would
    miss it."""


def tools(runtime: Runtime, names: Iterable[str] | None = None) -> list[FunctionTool]:
    """The runtime's tools (all, or those named, in that order) as SDK function tools.

    Each call goes through `Runtime.acall` (it never blocks the run's event loop) in the
    conversation of the run's ``context``. An unknown name raises `UnknownToolError`.
    """
    return [_function_tool(runtime, d) for d in _conversation.definitions(runtime, names)]


def meta_resolver() -> Callable[[MCPToolMetaContext], dict[str, Any]]:
    """A ``tool_meta_resolver=`` for the SDK's MCP servers (`MCPServerStdio`,
    `MCPServerStreamableHttp`, ...): every call's ``_meta`` names the run's conversation
    (the ``ctxactors/*`` keys), so conversations sharing one connection stay apart.

    A run without a conversation raises `NoConversationError` before anything is sent.
    With ``failure_error_function=None`` (the server's argument, or the agent's
    ``mcp_config``) that raises out of `Runner.run`; with the SDK's default the model only
    reads the SDK's generic "An error occurred while running the tool" (the call still
    never reaches the server).
    """

    def resolve(call: MCPToolMetaContext) -> dict[str, Any]:
        return _conversation.meta_of(_context_of(call.run_context))

    return resolve


def _function_tool(runtime: Runtime, definition: dict[str, Any]) -> FunctionTool:
    name: str = definition["name"]

    async def invoke(run: RunContextWrapper[Any], input_json: str) -> str:
        ctx = _context_of(run)
        try:
            result = await _conversation.run(runtime, name, input_json or None, ctx)
        except InvalidArgumentsError as exc:  # the model's to fix: it reads this and retries
            return f"Error: {exc}. Fix the arguments and call {name} again."
        return _output(result)

    # Evaluated annotations, naming the SDK's ToolContext: the SDK reads the first
    # parameter's annotation on every call, re-evaluating string ones (this module's
    # `from __future__ import annotations`) and, for a `RunContextWrapper`, forking the
    # context first: about 100 µs a call (scripts/bench_integrations.py).
    invoke.__annotations__ = {"run": _SDKToolContext[Any], "input_json": str, "return": str}
    return FunctionTool(
        name=name,
        description=definition["description"],
        params_json_schema=definition["inputSchema"],
        on_invoke_tool=invoke,
        # Strict mode would rewrite our schemas: every property becomes required (a field
        # with a default, like mark_todo's `done`, can no longer be left out) and every
        # open object is closed (batch's `arguments`, run_preset's `params` could only be
        # `{}`). The runtime validates the arguments itself and the model reads its errors.
        strict_json_schema=False,
    )


def _context_of(run: RunContextWrapper[Any]) -> ToolContext:
    """The conversation the run's ``context`` names, or `_NoConversation` saying how."""
    try:
        ctx = _conversation.conversation_of(run.context)
    except NoConversationError as exc:  # an id that isn't one
        raise _NoConversation(f"{exc}; {_HOW}") from None
    if ctx is None:
        raise _NoConversation(f"no conversation for this tool call: {_HOW}")
    return ctx


def _output(result: ToolResult) -> str:
    """What the model reads: the result's text (a structured result's JSON), a failure's
    message after ``Error:``."""
    text = result.text
    if result.structured is not None and not text:
        text = msgspec.json.encode(result.structured).decode()
    return f"Error: {text}" if result.is_error else text
