"""A LangGraph agent driven by a scripted fake chat model, for the LangChain tests.

Imports only langchain-core and langgraph, so the embedded tests (main environment) and the
MCP client script (`.venv-mcp1`, mcp 1.x) share it. One compiled graph serves every
conversation: the model reads its script from the conversation's first message, so several
conversations can run through the same agent at once, each following its own script.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


class ScriptedChatModel(BaseChatModel):
    """A fake chat model whose n-th answer is the n-th step of the conversation's script.

    The script is the JSON of the first human message: a list of steps, each a list of tool
    calls ``{"name", "args"}``; after the last step the model answers "done". Its state is
    the conversation's messages alone, so one instance serves concurrent conversations.
    """

    def _generate(self, messages: list[BaseMessage], *_: Any, **__: Any) -> ChatResult:
        script = json.loads(str(messages[0].content))
        step = sum(isinstance(m, AIMessage) for m in messages)
        if step >= len(script):
            reply = AIMessage(content="done")
        else:
            calls = [
                {"name": c["name"], "args": c["args"], "id": f"call-{step}-{i}"}
                for i, c in enumerate(script[step])
            ]
            reply = AIMessage(content="", tool_calls=calls)
        return ChatResult(generations=[ChatGeneration(message=reply)])

    async def _agenerate(self, messages: list[BaseMessage], *_: Any, **__: Any) -> ChatResult:
        return self._generate(messages)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, Any]:
        return self

    @property
    def _llm_type(self) -> str:
        return "scripted"


def agent(tools: Sequence[BaseTool]) -> Any:
    """A tool-calling agent: the model, LangGraph's ToolNode, until the model stops."""
    model = ScriptedChatModel().bind_tools(tools)

    async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def script(*steps: list[dict[str, Any]]) -> dict[str, list[BaseMessage]]:
    """The agent's input: a conversation whose first message is this script."""
    return {"messages": [HumanMessage(content=json.dumps(list(steps)))]}


def call(tool: str, /, **args: Any) -> list[dict[str, Any]]:
    """One step of a script: a single tool call."""
    return [{"name": tool, "args": args}]


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    """The tool results the model was given, in order."""
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def result_of(message: ToolMessage) -> Any:
    """A tool message as the model read it: the result's JSON parsed, an error's text."""
    return message.text if message.status == "error" else json.loads(message.text)


def transcript(messages: list[ToolMessage]) -> list[list[Any]]:
    """``[tool, status, result]`` per tool message (`result_of`), comparable as JSON."""
    return [[m.name, m.status, result_of(m)] for m in messages]


async def planning_state(tools: Sequence[BaseTool], config: RunnableConfig) -> Any:
    """The conversation's planning state now, read through its tools as a model would."""
    planning = next(t for t in tools if t.name == "get_planning_state")
    request = {"type": "tool_call", "id": "read", "name": planning.name, "args": {}}
    return result_of(await planning.ainvoke(request, config))


@dataclass(frozen=True)
class Conversation:
    """A scripted conversation and exactly what it must end with if no other touched it."""

    config: RunnableConfig
    steps: tuple[list[dict[str, Any]], ...]
    transcript: list[list[Any]]

    @property
    def script(self) -> dict[str, list[BaseMessage]]:
        return script(*self.steps)

    @property
    def final(self) -> Any:
        return self.transcript[-1][2]


def _todo(id: str, name: str, goal_id: str | None, done: bool) -> dict[str, Any]:
    return {"id": id, "name": name, "goal_id": goal_id, "done": done}


def _conversations() -> tuple[Conversation, ...]:
    """Three conversations for one agent at once. Each key numbers its items from 1 (g1,
    then t2), so a call that landed in another conversation shows as a wrong id as well as
    a wrong state. The second passes bad arguments, then retries, and hits a tool's own
    failure; the third's model writes another conversation's ``__sessionId`` (dropped: the
    config decides)."""
    bad = "invalid arguments for 'create_goal': Expected `str`, got `int` - at `$.goal`"
    rust = {"id": "g1", "goal": "Learn Rust"}
    ship = {"id": "g1", "goal": "Ship v2"}
    mine = {"id": "g1", "goal": "Mine"}
    return (
        Conversation(
            {"configurable": {"thread_id": "lc-a"}},
            (
                call("create_goal", goal="Learn Rust"),
                call("add_todo", name="read the book", goal_id="g1"),
                call("mark_todo", todo_id="t2"),
                call("get_planning_state"),
            ),
            [
                ["create_goal", "success", rust],
                ["add_todo", "success", _todo("t2", "read the book", "g1", False)],
                ["mark_todo", "success", _todo("t2", "read the book", "g1", True)],
                [
                    "get_planning_state",
                    "success",
                    {"goals": [rust], "todos": [_todo("t2", "read the book", "g1", True)]},
                ],
            ],
        ),
        Conversation(
            {"configurable": {"thread_id": "lc-b", "assistant_id": "planner"}},
            (
                call("create_goal", goal=5),
                call("create_goal", goal="Ship v2"),
                call("mark_todo", todo_id="t9"),
                call("add_todo", name="write notes"),
                call("get_planning_state"),
            ),
            [
                ["create_goal", "error", bad],
                ["create_goal", "success", ship],
                ["mark_todo", "error", "todo 't9' not found"],
                ["add_todo", "success", _todo("t2", "write notes", None, False)],
                [
                    "get_planning_state",
                    "success",
                    {"goals": [ship], "todos": [_todo("t2", "write notes", None, False)]},
                ],
            ],
        ),
        Conversation(
            {"configurable": {"thread_id": "lc-c", "ctxactors_thread_id": "t-9"}},
            (
                call("create_goal", goal="Mine", __sessionId="lc-a"),
                call("get_planning_state", __sessionId="lc-a"),
            ),
            [
                ["create_goal", "success", mine],
                ["get_planning_state", "success", {"goals": [mine], "todos": []}],
            ],
        ),
    )


CONVERSATIONS = _conversations()
