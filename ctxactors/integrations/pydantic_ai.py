"""The runtime's tools in pydantic-ai, one conversation per key (``ctxactors[pydantic-ai]``).

Embedded (the tools run in this process, through `Runtime.acall`)::

    agent = Agent(model, toolsets=[toolset(runtime)])
    await agent.run(prompt, deps=ToolContext(session_id=chat_id))

Over MCP (the tools run in ``ctxactors serve``), the hook that sends the conversation as the
call's ``_meta``::

    MCPToolset(server, process_tool_call=process_tool_call)

The conversation of a call is, first found:

1. ``RunContext.deps`` when it is a `ctxactors.ToolContext`, or a mapping or object with a
   ``session_id`` (or ``conversation_id``) and optional ``assistant_id``, ``thread_id``;
2. else ``RunContext.conversation_id``. pydantic-ai 2 resolves one for every run: the
   ``conversation_id=`` given to ``Agent.run``, else the latest one on ``message_history``,
   else a fresh UUID7. So a run that passes neither is a conversation of its own that no
   later run sees: a host continuing a conversation passes its id (``conversation_id=``, or
   the previous run's ``message_history``, which carries it; the id is
   ``result.conversation_id``).

A call whose context names neither (a `RunContext` built by hand) raises
`ctxactors.NoConversationError`: it never runs under a shared ``default`` session.

Errors, in pydantic-ai's idiom: arguments that don't fit the tool (`InvalidArgumentsError`)
raise `ModelRetry`, so the model reads why and calls again; a tool's own failure
(``ToolResult.is_error``) raises `ToolFailed`, a failed tool result the model reads without
spending its retries; unknown tools, timeouts and a closed runtime raise as they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ctxactors.context import ToolContext
from ctxactors.errors import InvalidArgumentsError, NoConversationError
from ctxactors.integrations._conversation import conversation_of, definitions, meta_of, require, run

require("pydantic_ai", extra="pydantic-ai", integration="pydantic_ai")

from pydantic_ai import RunContext  # noqa: E402
from pydantic_ai.exceptions import ModelRetry, ToolFailed  # noqa: E402
from pydantic_ai.tools import ToolDefinition  # noqa: E402
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool  # noqa: E402
from pydantic_core import SchemaValidator, core_schema  # noqa: E402

if TYPE_CHECKING:  # pydantic_ai.mcp needs fastmcp, which the embedded toolset does not
    from pydantic_ai.mcp import CallToolFunc
    from pydantic_ai.mcp import ToolResult as MCPToolResult

__all__ = ["CtxActorsToolset", "process_tool_call", "toolset"]

# The arguments go to the runtime as the model wrote them: it validates them against the
# tool's own schema (msgspec) and drops model-written ``__*`` context fields, so pydantic-ai
# only checks they are an object (as its MCP toolset does).
_ARGS = SchemaValidator(core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))

_HOW = (
    "pass the conversation as the run's deps (deps=ToolContext(session_id=...), or deps "
    "with a session_id) or as Agent.run(..., conversation_id=...)"
)


def toolset(
    runtime: Any, names: Iterable[str] | None = None, *, id: str | None = None
) -> CtxActorsToolset:
    """The runtime's tools (all, or those named) as a pydantic-ai toolset.

    `id` names the toolset for durable execution (pydantic-ai's `AbstractToolset.id`). An
    unknown name raises `ctxactors.UnknownToolError`.
    """
    return CtxActorsToolset(runtime, names, id=id)


class CtxActorsToolset(AbstractToolset[Any]):
    """A runtime's tools for a pydantic-ai agent, each call in its run's conversation.

    Made by `toolset`; the tools are fixed when it is made (a runtime's tools never change).
    """

    def __init__(self, runtime: Any, names: Iterable[str] | None = None, *, id: str | None = None):
        self._runtime = runtime
        self._id = id
        self._definitions = [
            ToolDefinition(
                name=d["name"],
                description=d["description"],
                parameters_json_schema=d["inputSchema"],
                metadata={"annotations": d["annotations"]},
            )
            for d in definitions(runtime, names)
        ]

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            d.name: ToolsetTool(
                toolset=self, tool_def=d, max_retries=ctx.max_retries, args_validator=_ARGS
            )
            for d in self._definitions
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        conversation = _conversation(ctx)
        try:
            result = await run(self._runtime, name, tool_args, conversation)
        except InvalidArgumentsError as exc:
            raise ModelRetry(str(exc)) from exc
        if result.is_error:
            # `ToolFailed`, not `ModelRetry`: the tool ran and refused ("goal 'g9' not found"),
            # so the model should read that and adapt, not be told to fix its arguments and
            # repeat them; it reaches the model as a failed tool result (the provider's error
            # channel), the run goes on, and it spends none of the tool's retries.
            raise ToolFailed(result.text)
        return result.structured if result.structured is not None else result.text


async def process_tool_call(
    ctx: RunContext[Any], call_tool: CallToolFunc, name: str, tool_args: dict[str, Any]
) -> MCPToolResult:
    """pydantic-ai's ``process_tool_call`` hook: the call goes out with its run's conversation
    as the request's ``_meta`` (the ``ctxactors/*`` keys), so ``ctxactors serve`` keeps each
    conversation's state apart (stdio would otherwise run them all under ``default``, and
    stateless HTTP refuse them). ``ctxactors serve`` then drops any ``__*`` context argument
    the model wrote.

    Pass it as ``MCPToolset(..., process_tool_call=process_tool_call)``. Over MCP, arguments
    that don't fit and a tool's own failure both come back as an ``isError`` result, which
    that toolset turns into `ModelRetry` (its default ``tool_error_behavior='retry'``: keep
    it, so the model can fix its arguments); unknown tools and a closed runtime raise.
    """
    return await call_tool(name, tool_args, metadata=meta_of(_conversation(ctx)))


def _conversation(ctx: RunContext[Any]) -> ToolContext:
    """The run's conversation: its deps', else its ``conversation_id``; else refused."""
    found = conversation_of(ctx.deps)
    if found is None and ctx.conversation_id is not None:
        found = conversation_of({"session_id": ctx.conversation_id})
    if found is None:
        raise NoConversationError(f"this pydantic-ai run names no conversation: {_HOW}")
    return found


if TYPE_CHECKING:  # the hook is one: mypy checks it against pydantic-ai's own type
    from pydantic_ai.mcp import ProcessToolCallback

    _HOOK: ProcessToolCallback = process_tool_call
