"""The OpenAI Agents SDK integration: the real `Runner` driven by the SDK's own scripted
model (`agents.testing.ScriptedModel`, no network), embedded and over MCP against a real
``ctxactors serve``.

Each scripted model reads the tool outputs it was given (ids, errors) the way a model
would, so a test that passes proves the model saw them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from agents import Agent, Runner, UserError, set_tracing_disabled
from agents.mcp import MCPServer, MCPServerStdio, MCPServerStreamableHttp
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from mcp_support import Gate, host_meta, http_server, serve_env

from ctxactors import (
    CallTimeoutError,
    NoConversationError,
    Runtime,
    RuntimeClosedError,
    ToolContext,
    UnknownToolError,
    inject_context,
)
from ctxactors.integrations.openai_agents import meta_resolver, tools
from ctxactors.servers import Content, Planning
from ctxactors.testing import context_args

pytestmark = pytest.mark.timeout(90)

set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI


@dataclass
class Conversation:
    """A host's own conversation object: the integration reads its ``conversation_id``."""

    conversation_id: str
    assistant_id: str | None = None


# Four conversations, each carried another way; the second shares the first's session but
# is another planning thread, so it has planning state of its own.
CONVERSATIONS: list[tuple[str, Any]] = [
    ("alpha", ToolContext(session_id="alpha")),
    ("alpha-2", ToolContext(session_id="alpha", thread_id="second")),
    ("beta", Conversation(conversation_id="beta", assistant_id="helper")),
    ("gamma", {"session_id": "gamma", "assistant_id": "helper", "thread_id": "t1"}),
]


def as_context(carrier: Any) -> ToolContext:
    """The `ToolContext` a carrier of `CONVERSATIONS` stands for (written out, not read
    by the code under test)."""
    if isinstance(carrier, ToolContext):
        return carrier
    if isinstance(carrier, Conversation):
        return ToolContext(carrier.conversation_id, carrier.assistant_id)
    return ToolContext(carrier["session_id"], carrier["assistant_id"], carrier["thread_id"])


def outputs(call: ModelCall) -> list[str]:
    """The text of every tool output the model has been given so far, oldest first."""
    found = []
    for item in call.input if isinstance(call.input, list) else []:
        if isinstance(item, Mapping) and item.get("type") == "function_call_output":
            out = item["output"]  # a function tool's string, an MCP tool's text parts
            found.append(out if isinstance(out, str) else "".join(p["text"] for p in out))
    return found


def last_output(call: ModelCall) -> str:
    return outputs(call)[-1]


def answer_with_last_output(call: ModelCall) -> list[Any]:
    return [assistant_message(last_output(call))]


class Planner:
    """A scripted model that plans for `label`: a goal, a todo under it (the goal's id read
    from the tool's output), marks that todo done (its id read likewise), reads the
    planning state, and answers with it."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.goal: dict[str, Any] = {}
        self.todo: dict[str, Any] = {}
        self.model = ScriptedModel(
            [
                [function_call("create_goal", {"goal": f"goal of {label}"}, call_id="c1")],
                ModelStep.respond(self._add_todo),
                ModelStep.respond(self._mark_todo),
                ModelStep.respond(self._read_state),
                ModelStep.respond(answer_with_last_output),
            ]
        )

    def _add_todo(self, call: ModelCall) -> list[Any]:
        self.goal = json.loads(last_output(call))
        todo = {"name": f"todo of {self.label}", "goal_id": self.goal["id"]}
        return [function_call("add_todo", todo, call_id="c2")]

    def _mark_todo(self, call: ModelCall) -> list[Any]:
        self.todo = json.loads(last_output(call))
        return [function_call("mark_todo", {"todo_id": self.todo["id"]}, call_id="c3")]

    def _read_state(self, call: ModelCall) -> list[Any]:
        return [function_call("get_planning_state", {}, call_id="c4")]

    def expected(self) -> dict[str, Any]:
        """The conversation's planning state: exactly what this model created, nothing else."""
        return {
            "goals": [{"id": self.goal["id"], "goal": f"goal of {self.label}"}],
            "todos": [
                {
                    "id": self.todo["id"],
                    "name": f"todo of {self.label}",
                    "goal_id": self.goal["id"],
                    "done": True,
                }
            ],
        }


def scripted(*steps: Any) -> ScriptedModel:
    return ScriptedModel(list(steps))


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    # The servers the tests use (the workspace's sandbox is not needed here).
    with Runtime(servers=[Planning, Content]) as rt:
        yield rt


def planning_state(runtime: Runtime, ctx: ToolContext) -> dict[str, Any]:
    result = runtime.call("get_planning_state", inject_context({}, ctx))
    assert not result.is_error, result.text
    assert result.structured is not None
    return result.structured


def empty_state() -> dict[str, Any]:
    return {"goals": [], "todos": []}


# -- embedded ----------------------------------------------------------------------------


def test_concurrent_runs_each_keep_their_own_conversation(runtime: Runtime) -> None:
    function_tools = tools(runtime)
    planners = [Planner(label) for label, _ in CONVERSATIONS]

    async def main() -> list[Any]:
        return await asyncio.gather(
            *(
                Runner.run(
                    Agent(name=p.label, model=p.model, tools=function_tools), "plan", context=c
                )
                for p, (_, c) in zip(planners, CONVERSATIONS, strict=True)
            )
        )

    results = asyncio.run(main())
    for planner, (_, carrier), result in zip(planners, CONVERSATIONS, results, strict=True):
        assert planning_state(runtime, as_context(carrier)) == planner.expected()
        assert json.loads(result.final_output) == planner.expected()  # what the model read
        planner.model.assert_complete()


def test_tools_are_function_tools_of_the_runtime_s_tools(runtime: Runtime) -> None:
    chosen = tools(runtime, ["get_planning_state", "create_goal"])
    assert [t.name for t in chosen] == ["get_planning_state", "create_goal"]
    definition = runtime.tools["create_goal"].definition()
    assert chosen[1].params_json_schema == definition["inputSchema"]
    assert chosen[1].description == definition["description"]
    assert not chosen[1].strict_json_schema
    assert {t.name for t in tools(runtime)} == set(runtime.tools)
    with pytest.raises(UnknownToolError, match="nope"):
        tools(runtime, ["create_goal", "nope"])


@pytest.mark.parametrize("context", [None, {"user": "someone"}, object()])
def test_a_run_without_a_conversation_is_refused(runtime: Runtime, context: Any) -> None:
    model = scripted([function_call("create_goal", {"goal": "lost"}, call_id="c1")])
    agent = Agent(name="a", model=model, tools=tools(runtime))

    with pytest.raises(NoConversationError) as refused:
        asyncio.run(Runner.run(agent, "plan", context=context))

    assert "context=ctxactors.ToolContext(session_id=...)" in str(refused.value)
    assert isinstance(refused.value, UserError)  # the SDK's own kind: it lets it through
    # Never run under a shared default session.
    assert planning_state(runtime, ToolContext("default")) == empty_state()


def test_a_conversation_id_that_is_no_id_is_refused(runtime: Runtime) -> None:
    model = scripted([function_call("create_goal", {"goal": "lost"}, call_id="c1")])
    agent = Agent(name="a", model=model, tools=tools(runtime))

    with pytest.raises(NoConversationError, match="session_id must be a string, got int"):
        asyncio.run(Runner.run(agent, "plan", context={"session_id": 7}))


def test_bad_arguments_reach_the_model_which_corrects_them(runtime: Runtime) -> None:
    model = scripted(
        [function_call("create_goal", "{not json", call_id="c1")],
        [function_call("create_goal", {}, call_id="c2")],
        [function_call("create_goal", {"goal": 5}, call_id="c3")],
        [function_call("create_goal", {"goal": "ship it"}, call_id="c4")],
        ModelStep.respond(lambda call: [assistant_message("\n".join(outputs(call)))]),
    )
    agent = Agent(name="a", model=model, tools=tools(runtime))

    result = asyncio.run(Runner.run(agent, "plan", context=ToolContext("s1")))

    not_json, missing, not_text, created = result.final_output.split("\n")
    assert not_json.startswith("Error: arguments are not valid JSON")
    assert missing.startswith("Error: invalid arguments for 'create_goal'")
    assert "missing required field `goal`" in missing
    assert "Expected `str`, got `int` - at `$.goal`" in not_text
    assert not_text.endswith("Fix the arguments and call create_goal again.")
    goal = json.loads(created)
    assert goal == {"id": goal["id"], "goal": "ship it"}
    assert planning_state(runtime, ToolContext("s1")) == {"goals": [goal], "todos": []}


def test_a_tool_s_own_failure_is_an_output_the_model_reads(runtime: Runtime) -> None:
    model = scripted(
        [function_call("mark_todo", {"todo_id": "t404"}, call_id="c1")],
        ModelStep.respond(
            lambda call: [function_call("add_todo", {"name": last_output(call)}, call_id="c2")]
        ),
        ModelStep.respond(answer_with_last_output),
    )
    agent = Agent(name="a", model=model, tools=tools(runtime))

    result = asyncio.run(Runner.run(agent, "plan", context=ToolContext("s1")))

    todo = json.loads(result.final_output)  # the run went on after the failure
    assert todo["name"] == "Error: todo 't404' not found"
    assert planning_state(runtime, ToolContext("s1"))["todos"] == [todo]


def test_a_session_the_model_writes_is_dropped(runtime: Runtime) -> None:
    forged = {"goal": "mine", "__sessionId": "victim", "__assistantId": "x"}
    model = scripted(
        [function_call("create_goal", forged, call_id="c1")],
        ModelStep.respond(answer_with_last_output),
    )
    agent = Agent(name="a", model=model, tools=tools(runtime))

    result = asyncio.run(Runner.run(agent, "plan", context=ToolContext("owner")))

    goal = json.loads(result.final_output)
    assert planning_state(runtime, ToolContext("owner")) == {"goals": [goal], "todos": []}
    assert planning_state(runtime, ToolContext("victim")) == empty_state()
    assert planning_state(runtime, ToolContext("victim", "x")) == empty_state()


def test_a_closed_runtime_raises_out_of_the_run(runtime: Runtime) -> None:
    agent = Agent(
        name="a",
        model=scripted([function_call("get_planning_state", {}, call_id="c1")]),
        tools=tools(runtime),
    )
    runtime.close()

    with pytest.raises(UserError) as raised:  # how the SDK raises any tool's exception
        asyncio.run(Runner.run(agent, "plan", context=ToolContext("s1")))

    assert isinstance(raised.value.__cause__, RuntimeClosedError)


def test_a_call_that_times_out_raises_out_of_the_run() -> None:
    gate = f"openai-agents-timeout-{id(object())}"
    with Runtime(servers=[Gate], call_timeout=0.5) as rt:
        agent = Agent(
            name="a",
            model=scripted([function_call("wait_gate", {"gate": gate}, call_id="c1")]),
            tools=tools(rt),
        )
        try:
            with pytest.raises(UserError) as raised:
                asyncio.run(Runner.run(agent, "wait", context=ToolContext("s1")))
        finally:
            rt.call("open_gate", context_args("other", gate=gate))  # the waiting call ends

    assert isinstance(raised.value.__cause__, CallTimeoutError)


def test_without_the_sdk_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "agents", None)  # what a missing package looks like
    monkeypatch.delitem(sys.modules, "ctxactors.integrations.openai_agents")

    with pytest.raises(ImportError, match=r"pip install 'ctxactors\[openai-agents\]'"):
        importlib.import_module("ctxactors.integrations.openai_agents")


# -- over MCP ------------------------------------------------------------------------------

SERVE_ARGS = ["-m", "ctxactors.cli", "serve", "--store", "memory"]
TIMEOUT = 30.0  # the SDK's default of 5 s is short on a loaded machine


@contextlib.asynccontextmanager
async def stdio_server(**options: Any) -> AsyncIterator[MCPServer]:
    params = {"command": sys.executable, "args": SERVE_ARGS, "env": serve_env()}
    async with MCPServerStdio(
        params=params,
        client_session_timeout_seconds=TIMEOUT,
        **options,
    ) as server:
        yield server


@contextlib.contextmanager
def served(transport: str) -> Iterator[Any]:
    """An async context manager factory for an SDK MCP server of `transport`, connected to
    a fresh ``ctxactors serve``."""
    if transport == "stdio":
        yield stdio_server
        return
    with http_server("--store", "memory") as (url, _proc):

        def http(**options: Any) -> MCPServerStreamableHttp:
            return MCPServerStreamableHttp(
                params={"url": url, "timeout": TIMEOUT},
                client_session_timeout_seconds=TIMEOUT,
                **options,
            )

        yield http


async def mcp_state(server: MCPServer, ctx: ToolContext) -> dict[str, Any]:
    meta = host_meta(session=ctx.session_id, assistant=ctx.assistant_id, thread=ctx.thread_id)
    result = await server.call_tool("get_planning_state", {}, meta=dict(meta))
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return dict(result.structured_content)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_over_mcp_conversations_on_one_connection_stay_apart(transport: str) -> None:
    planners = [Planner(label) for label, _ in CONVERSATIONS]

    async def main(connect: Any) -> None:
        # One connection for all the conversations: only the _meta tells them apart.
        async with connect(
            tool_meta_resolver=meta_resolver(), failure_error_function=None
        ) as server:
            results = await asyncio.gather(
                *(
                    Runner.run(
                        Agent(name=p.label, model=p.model, mcp_servers=[server]), "plan", context=c
                    )
                    for p, (_, c) in zip(planners, CONVERSATIONS, strict=True)
                )
            )
            for planner, (_, carrier), result in zip(planners, CONVERSATIONS, results, strict=True):
                assert await mcp_state(server, as_context(carrier)) == planner.expected()
                assert json.loads(result.final_output) == planner.expected()
                planner.model.assert_complete()

    with served(transport) as connect:
        asyncio.run(main(connect))


def test_over_mcp_a_run_without_a_conversation_sends_nothing() -> None:
    def refused_run() -> ScriptedModel:
        return scripted(
            [function_call("create_goal", {"goal": "lost"}, call_id="c1")],
            ModelStep.respond(answer_with_last_output),
        )

    async def main() -> None:
        async with stdio_server(tool_meta_resolver=meta_resolver()) as server:
            # With failure_error_function=None the refusal raises out of the run ...
            strict = Agent(
                name="a",
                model=refused_run(),
                mcp_servers=[server],
                mcp_config={"failure_error_function": None},
            )
            with pytest.raises(NoConversationError, match=r"context=ctxactors\.ToolContext"):
                await Runner.run(strict, "plan")
            # ... with the SDK's default, the model reads the SDK's generic error.
            lenient = Agent(name="a", model=refused_run(), mcp_servers=[server])
            result = await Runner.run(lenient, "plan", context={"user": "someone"})
            assert result.final_output.startswith("An error occurred while running the tool")
            # Either way nothing reached the server (stdio would have run it as `default`).
            assert await mcp_state(server, ToolContext("default")) == empty_state()

    asyncio.run(main())
