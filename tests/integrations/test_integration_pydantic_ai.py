"""pydantic-ai agents on the runtime's tools, driven by pydantic-ai's own `FunctionModel`.

Embedded (`toolset`) and over MCP (pydantic-ai's `MCPToolset` against a real ``ctxactors
serve``, stdio and streamable HTTP, with `process_tool_call`): several conversations at
once, each ending with exactly its own planning state.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from fastmcp.client.transports import StdioTransport
from mcp_support import SERVE, http_server, serve_env
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RunUsage

from ctxactors import (
    NoConversationError,
    Runtime,
    RuntimeClosedError,
    ToolContext,
    UnknownToolError,
)
from ctxactors.integrations._conversation import meta_of
from ctxactors.integrations.pydantic_ai import process_tool_call, toolset
from ctxactors.servers import Planning

pytestmark = pytest.mark.timeout(120)

Call = tuple[str, dict[str, Any]]
Turns = list[list[Call] | str]  # each turn's tool calls; the last turn, the final answer


class Script:
    """The model of every run in a test: a `FunctionModel` function scripted by the prompt.

    `turns(prompt)` is a run's script; turn i answers the i-th model request since the
    prompt, so concurrent runs, and runs that continue a history, each follow their own.
    `seen[prompt]` keeps what the model read back after each turn: (content, outcome) of
    every tool return. With `meet`, every run waits there before its second turn, so all of
    them are in flight at once (proved by order, not timed).
    """

    def __init__(self, turns: Callable[[str], Turns], meet: asyncio.Barrier | None = None):
        self.turns = turns
        self.meet = meet
        self.seen: dict[str, list[list[tuple[Any, str]]]] = defaultdict(list)

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        start = max(
            i
            for i, m in enumerate(messages)
            if isinstance(m, ModelRequest) and any(isinstance(p, UserPromptPart) for p in m.parts)
        )
        prompt = next(p for p in messages[start].parts if isinstance(p, UserPromptPart)).content
        assert isinstance(prompt, str)
        turn = sum(isinstance(m, ModelResponse) for m in messages[start:])
        if turn:
            returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
            self.seen[prompt].append([(p.content, p.outcome) for p in returns])
        if turn == 1 and self.meet is not None:
            await asyncio.wait_for(self.meet.wait(), 60)
        step = self.turns(prompt)[turn]
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        return ModelResponse(parts=[ToolCallPart(name, args) for name, args in step])


def plan(name: str) -> Turns:
    """A conversation plans: a goal, a todo under it (by the id its key gave), a look."""
    return [
        [("create_goal", {"goal": f"{name}'s goal"})],
        [("add_todo", {"name": f"{name}'s todo", "goal_id": "g1"})],
        [("get_planning_state", {})],
        "done",
    ]


def planned(name: str) -> dict[str, Any]:
    """The planning state of a conversation that ran `plan(name)` alone."""
    return {
        "goals": [{"id": "g1", "goal": f"{name}'s goal"}],
        "todos": [{"id": "t2", "name": f"{name}'s todo", "goal_id": "g1", "done": False}],
    }


EMPTY: dict[str, Any] = {"goals": [], "todos": []}


def state(runtime: Runtime, ctx: ToolContext) -> Any:
    """The conversation's planning state, asked of the runtime as a host would."""
    arguments = {"__sessionId": ctx.session_id}
    if ctx.assistant_id is not None:
        arguments["__assistantId"] = ctx.assistant_id
    if ctx.thread_id is not None:
        arguments["__threadId"] = ctx.thread_id
    return runtime.call("get_planning_state", arguments).structured


@dataclass
class Deps:
    """A host's own deps object, naming the conversation among its other fields."""

    session_id: str
    user: str


@pytest.fixture
def rt() -> Any:
    with Runtime([Planning]) as runtime:
        yield runtime


# -- embedded ------------------------------------------------------------------------------


def test_five_conversations_at_once_each_end_with_exactly_their_own_plan(rt: Runtime) -> None:
    # Each names its conversation another way pydantic-ai hosts do.
    runs: dict[str, dict[str, Any]] = {
        "alice": {"deps": ToolContext(session_id="alice")},
        "bob": {"deps": Deps(session_id="bob", user="b")},
        "carol": {"conversation_id": "carol"},
        "dave": {"deps": ToolContext("dave", "helper", "t1")},
        "erin": {"deps": {"session_id": "erin"}},
    }
    script = Script(plan, meet=asyncio.Barrier(len(runs)))
    agent = Agent(FunctionModel(script), toolsets=[toolset(rt)])

    async def main() -> list[Any]:
        return await asyncio.gather(*(agent.run(name, **how) for name, how in runs.items()))

    results = asyncio.run(main())

    assert [r.output for r in results] == ["done"] * len(runs)
    for name in runs:
        assert script.seen[name][2] == [(planned(name), "success")], name
    contexts = {
        "alice": ToolContext("alice"),
        "bob": ToolContext("bob"),
        "carol": ToolContext("carol"),
        "dave": ToolContext("dave", "helper", "t1"),
        "erin": ToolContext("erin"),
    }
    for name, ctx in contexts.items():
        assert state(rt, ctx) == planned(name), name
    # dave's assistant and thread went along: his session alone holds nothing.
    assert state(rt, ToolContext("dave")) == EMPTY
    assert state(rt, ToolContext("default")) == EMPTY


def test_runs_without_a_conversation_id_are_each_their_own_conversation(rt: Runtime) -> None:
    # pydantic-ai gives a run that names none a fresh conversation_id; a host continues one
    # by passing its id, or the history that carries it.
    def turns(prompt: str) -> Turns:
        if prompt == "first":
            return [[("create_goal", {"goal": "first's goal"})], "done"]
        return [[("get_planning_state", {})], "done"]

    script = Script(turns)
    agent = Agent(FunctionModel(script), toolsets=[toolset(rt)])

    async def main() -> list[Any]:
        first = await agent.run("first")
        second = await agent.run("second")
        by_history = await agent.run("by history", message_history=first.all_messages())
        by_id = await agent.run("by id", conversation_id=first.conversation_id)
        return [first, second, by_history, by_id]

    first, second, by_history, by_id = asyncio.run(main())

    assert first.conversation_id != second.conversation_id
    first_plan = {"goals": [{"id": "g1", "goal": "first's goal"}], "todos": []}
    assert script.seen["second"][0] == [(EMPTY, "success")]
    assert state(rt, ToolContext(first.conversation_id)) == first_plan
    assert state(rt, ToolContext(second.conversation_id)) == EMPTY
    assert by_history.conversation_id == by_id.conversation_id == first.conversation_id
    assert script.seen["by history"][0] == [(first_plan, "success")]
    assert script.seen["by id"][0] == [(first_plan, "success")]


def test_a_call_that_names_no_conversation_is_refused_saying_how_to_pass_one(
    rt: Runtime,
) -> None:
    # Agent.run always resolves a conversation_id; a RunContext built by hand may have none.
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())
    tools = toolset(rt)

    async def call_tool(name: str, args: dict[str, Any], *, metadata: Any = None) -> Any:
        raise AssertionError("the hook must not call the server")

    async def main() -> None:
        tool = (await tools.get_tools(ctx))["create_goal"]
        with pytest.raises(NoConversationError) as embedded:
            await tools.call_tool("create_goal", {"goal": "orphan"}, ctx, tool)
        with pytest.raises(NoConversationError) as over_mcp:
            await process_tool_call(ctx, call_tool, "create_goal", {"goal": "orphan"})
        for refused in (embedded, over_mcp):
            message = str(refused.value)
            assert "deps=ToolContext(session_id=...)" in message
            assert "conversation_id=" in message

    asyncio.run(main())
    assert state(rt, ToolContext("default")) == EMPTY


def test_bad_arguments_come_back_as_a_retry_and_the_corrected_call_succeeds(
    rt: Runtime,
) -> None:
    turns: Turns = [
        [("create_goal", {"goal": ""})],
        [("create_goal", {"goal": "fixed"})],
        "done",
    ]
    script = Script(lambda _: turns)
    agent = Agent(FunctionModel(script), toolsets=[toolset(rt)])

    result = asyncio.run(agent.run("retry", deps=ToolContext("alice")))

    assert result.output == "done"
    problem = "invalid arguments for 'create_goal': Expected `str` of length >= 1 - at `$.goal`"
    assert script.seen["retry"] == [
        [(problem, "retried")],
        [({"id": "g1", "goal": "fixed"}, "success")],
    ]
    assert state(rt, ToolContext("alice")) == {
        "goals": [{"id": "g1", "goal": "fixed"}],
        "todos": [],
    }


def test_a_tools_own_failure_is_read_by_the_model_and_a_written_session_is_dropped(
    rt: Runtime,
) -> None:
    turns: Turns = [
        [("add_todo", {"name": "orphan", "goal_id": "g9"})],
        [("create_goal", {"goal": "mine", "__sessionId": "mallory"})],
        "done",
    ]
    script = Script(lambda _: turns)
    # No retries at all: a tool's failure is a result, not a retry, so the run goes on.
    agent = Agent(FunctionModel(script), toolsets=[toolset(rt)], retries=0)

    result = asyncio.run(agent.run("failure", deps=ToolContext("alice")))

    assert result.output == "done"
    assert script.seen["failure"] == [
        [("goal 'g9' not found", "failed")],
        [({"id": "g1", "goal": "mine"}, "success")],
    ]
    assert state(rt, ToolContext("alice")) == {
        "goals": [{"id": "g1", "goal": "mine"}],
        "todos": [],
    }
    assert state(rt, ToolContext("mallory")) == EMPTY


def test_the_model_is_offered_the_named_tools_with_the_runtimes_schemas(rt: Runtime) -> None:
    offered: list[Any] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered.extend(info.function_tools)
        return ModelResponse(parts=[TextPart("done")])

    names = ["get_planning_state", "create_goal"]
    agent = Agent(FunctionModel(model), toolsets=[toolset(rt, names)])
    asyncio.run(agent.run("tools", deps=ToolContext("alice")))

    assert [(t.name, t.description, t.parameters_json_schema) for t in offered] == [
        (d["name"], d["description"], d["inputSchema"])
        for d in (rt.tools[name].definition() for name in names)
    ]
    with pytest.raises(UnknownToolError, match="'nope'"):
        toolset(rt, ["create_goal", "nope"])


def test_protocol_errors_raise_out_of_the_run(rt: Runtime) -> None:
    script = Script(lambda _: [[("create_goal", {"goal": "late"})], "done"])
    agent = Agent(FunctionModel(script), toolsets=[toolset(rt)])
    ctx = RunContext(deps=ToolContext("alice"), model=TestModel(), usage=RunUsage())
    tools = toolset(rt)

    async def unknown() -> None:
        tool = (await tools.get_tools(ctx))["create_goal"]
        await tools.call_tool("no_such_tool", {}, ctx, tool)

    with pytest.raises(UnknownToolError, match="no_such_tool"):
        asyncio.run(unknown())
    rt.close()
    with pytest.raises(RuntimeClosedError):
        asyncio.run(agent.run("closed", deps=ToolContext("alice")))


def test_without_pydantic_ai_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)  # what a missing package imports as
    monkeypatch.delitem(sys.modules, "ctxactors.integrations.pydantic_ai")
    with pytest.raises(ImportError, match=r"pip install 'ctxactors\[pydantic-ai\]'"):
        importlib.import_module("ctxactors.integrations.pydantic_ai")


# -- over MCP ------------------------------------------------------------------------------

# `ctxactors serve` (with the test servers of mcp_support), its state in memory.
SERVED = ("--store", "memory", "--server", "mcp_support:Whoami")


@asynccontextmanager
async def served_toolset(transport: str) -> AsyncIterator[MCPToolset[Any]]:
    """pydantic-ai's MCP toolset, with `process_tool_call`, on a fresh ``ctxactors serve``."""
    # init_timeout: a server starting on a busy machine can take longer than the default 5 s.
    options = {"process_tool_call": process_tool_call, "init_timeout": 60}
    if transport == "stdio":
        # keep_alive=False: the server process ends with the connection, not with pytest.
        client = StdioTransport(SERVE[0], [*SERVE[1:], *SERVED], env=serve_env(), keep_alive=False)
        async with MCPToolset(client, **options) as tools:
            yield tools
        return
    with http_server(*SERVED) as (url, _proc):
        async with MCPToolset(url, **options) as tools:
            yield tools


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_over_mcp_three_conversations_on_one_client_each_end_with_their_own_plan(
    transport: str,
) -> None:
    contexts = {
        "alice": ToolContext("alice"),
        "bob": ToolContext("bob"),
        "dave": ToolContext("dave", "helper", "t1"),
    }

    def turns(name: str) -> Turns:
        steps = plan(name)
        if name == "bob":  # a session the model wrote is dropped: _meta decides
            steps[0] = [("create_goal", {"goal": "bob's goal", "__sessionId": "alice"})]
        return [*steps[:-1], [("whoami", {})], steps[-1]]

    script = Script(turns, meet=asyncio.Barrier(len(contexts)))

    async def check(tools: MCPToolset[Any]) -> None:
        agent = Agent(FunctionModel(script), toolsets=[tools])
        results = await asyncio.gather(
            *(agent.run(name, deps=ctx) for name, ctx in contexts.items())
        )
        assert [r.output for r in results] == ["done"] * len(contexts)
        for name, ctx in contexts.items():
            assert script.seen[name][2] == [(planned(name), "success")], name
            who = {
                "session": ctx.session_id,
                "assistant": ctx.assistant_id,
                "thread": ctx.thread_id,
                "principal": None,
            }
            assert script.seen[name][3] == [(who, "success")], name
            mine = await tools.direct_call_tool("get_planning_state", {}, metadata=meta_of(ctx))
            assert mine == planned(name), name
        dave_session = meta_of(ToolContext("dave"))
        assert await tools.direct_call_tool("get_planning_state", {}, metadata=dave_session) == (
            EMPTY
        )
        # Without _meta: stdio runs it under `default`, where none of the above went;
        # stateless HTTP refuses it (which MCPToolset gives the model as a retry).
        if transport == "stdio":
            assert await tools.direct_call_tool("get_planning_state", {}) == EMPTY
        else:
            with pytest.raises(ModelRetry, match="no session given"):
                await tools.direct_call_tool("get_planning_state", {})

    async def main() -> None:
        async with served_toolset(transport) as tools:
            await check(tools)

    asyncio.run(main())
