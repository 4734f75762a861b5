"""`ctxactors.integrations.langchain`: the runtime's tools in a real LangGraph agent (a
scripted fake chat model, LangGraph's ToolNode), and langchain-mcp-adapters with
`interceptor()` against `ctxactors serve` over stdio and streamable HTTP.

The adapter needs ``mcp<2`` while `serve` needs ``mcp>=2.3``: its client runs from
`.venv-mcp1`, which ``python3 scripts/dev.py test`` builds.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_support import (
    CONVERSATIONS,
    agent,
    call,
    planning_state,
    script,
    tool_messages,
    transcript,
)
from mcp_support import TESTS_DIR, Whoami, http_server, serve_env

from ctxactors import NoConversationError, Runtime, ToolContext, UnknownToolError
from ctxactors.errors import RuntimeClosedError
from ctxactors.integrations._conversation import meta_of
from ctxactors.integrations.langchain import tools
from ctxactors.servers import BUILTIN

pytestmark = pytest.mark.timeout(120)

PLANNING = ["create_goal", "add_todo", "mark_todo", "get_planning_state"]


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    with Runtime([*BUILTIN, Whoami]) as rt:
        yield rt


def conversation(thread_id: Any, **more: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, **more}}


def test_three_conversations_through_one_agent_at_once_each_end_with_exactly_their_own_plan(
    runtime: Runtime,
) -> None:
    agent_tools = tools(runtime, PLANNING)
    graph = agent(agent_tools)

    async def main() -> tuple[list[Any], list[Any]]:
        ends = await asyncio.gather(
            *(graph.ainvoke(c.script, config=c.config) for c in CONVERSATIONS)
        )
        after = [await planning_state(agent_tools, c.config) for c in CONVERSATIONS]
        return list(ends), after

    ends, after = asyncio.run(main())
    for c, end, now in zip(CONVERSATIONS, ends, after, strict=True):
        assert transcript(tool_messages(end)) == c.transcript
        assert now == c.final  # after every conversation ran: still only its own
        assert end["messages"][-1].content == "done"


def test_a_call_without_thread_id_is_refused_saying_how_to_pass_one(runtime: Runtime) -> None:
    graph = agent(tools(runtime, PLANNING))
    with pytest.raises(NoConversationError) as refused:
        asyncio.run(graph.ainvoke(script(call("create_goal", goal="x"))))
    assert 'config={"configurable": {"thread_id": ' in str(refused.value)
    planning = tools(runtime, ["get_planning_state"])[0]
    with pytest.raises(NoConversationError):  # the sync path too
        planning.invoke({}, {"configurable": {"assistant_id": "a1"}})
    assert runtime.stats()["calls"] == 0  # nothing ran, not even under "default"


def test_bad_arguments_reach_the_model_as_an_error_message_and_its_retry_succeeds(
    runtime: Runtime,
) -> None:
    graph = agent(tools(runtime, PLANNING))
    end = asyncio.run(
        graph.ainvoke(
            script(call("create_goal", goal=5), call("create_goal", goal="fixed")),
            config=conversation("retry"),
        )
    )
    rejected, created = tool_messages(end)
    assert rejected.status == "error"
    assert rejected.content == (
        "invalid arguments for 'create_goal': Expected `str`, got `int` - at `$.goal`"
    )
    assert created.status == "success"
    assert json.loads(str(created.content)) == {"id": "g1", "goal": "fixed"}  # g1: nothing ran


def test_a_tools_own_failure_is_an_error_tool_message_and_the_run_goes_on(
    runtime: Runtime,
) -> None:
    graph = agent(tools(runtime, ["read_content", "list_content"]))
    end = asyncio.run(
        graph.ainvoke(
            script(call("read_content", id="c404"), call("list_content")),
            config=conversation("failing"),
        )
    )
    assert transcript(tool_messages(end)) == [
        ["read_content", "error", "content 'c404' not found"],
        ["list_content", "success", {"items": [], "count": 0}],
    ]
    assert end["messages"][-1].content == "done"


def test_a_session_id_the_model_writes_is_ignored(runtime: Runtime) -> None:
    graph = agent(tools(runtime, PLANNING))
    end = asyncio.run(
        graph.ainvoke(
            script(call("create_goal", goal="planted", __sessionId="victim")),
            config=conversation("attacker"),
        )
    )
    assert transcript(tool_messages(end)) == [
        ["create_goal", "success", {"id": "g1", "goal": "planted"}]
    ]
    for session, goals in (("attacker", [{"id": "g1", "goal": "planted"}]), ("victim", [])):
        state = runtime.call("get_planning_state", meta=meta_of(ToolContext(session)))
        assert state.structured == {"goals": goals, "todos": []}


def test_the_config_names_session_assistant_and_thread_async_and_sync(runtime: Runtime) -> None:
    whoami = tools(runtime, ["whoami"])[0]
    config = conversation("s1", assistant_id="a1", ctxactors_thread_id="t1")
    expected = {"session": "s1", "assistant": "a1", "thread": "t1", "principal": None}
    assert asyncio.run(whoami.ainvoke({}, config)) == expected
    assert whoami.invoke({}, config) == expected
    # LangGraph's checkpointers take an int or a UUID thread_id as its text; so does this
    thread = uuid.uuid4()
    assert whoami.invoke({}, conversation(thread))["session"] == str(thread)
    assert whoami.invoke({}, conversation(7))["session"] == "7"


def test_tools_are_the_runtimes_definitions_and_protocol_errors_raise(runtime: Runtime) -> None:
    all_tools = tools(runtime)
    assert [t.name for t in all_tools] == [d["name"] for d in runtime.list_tools()]
    create_goal = next(t for t in all_tools if t.name == "create_goal")
    definition = next(d for d in runtime.list_tools() if d["name"] == "create_goal")
    assert create_goal.args_schema == definition["inputSchema"]
    assert create_goal.description == definition["description"]
    with pytest.raises(UnknownToolError):
        tools(runtime, ["create_goal", "no_such_tool"])
    runtime.close()
    message = {"type": "tool_call", "id": "c1", "name": "create_goal", "args": {"goal": "x"}}
    with pytest.raises(RuntimeClosedError):  # raised, not a ToolMessage for the model
        asyncio.run(create_goal.ainvoke(message, conversation("s1")))


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_importing_the_integration_pulls_in_no_mcp() -> None:
    done = _python(
        "import sys, ctxactors.integrations.langchain\n"
        "print([m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')])"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_without_langchain_core_the_import_error_names_the_extra() -> None:
    done = _python(
        "import sys; sys.modules['langchain_core'] = None\nimport ctxactors.integrations.langchain"
    )
    assert done.returncode == 1
    assert "ImportError: ctxactors.integrations.langchain needs 'langchain_core'" in done.stderr
    assert "pip install 'ctxactors[langchain]'" in done.stderr


# -- over MCP: langchain-mcp-adapters (mcp 1.x) from .venv-mcp1, `serve` from this venv ---

MCP1_PYTHON = TESTS_DIR.parent / ".venv-mcp1" / "bin" / "python"


def _run_adapter_client(connection: dict[str, Any]) -> dict[str, Any]:
    if not MCP1_PYTHON.exists():
        if os.environ.get("CTXACTORS_SKIP_MCP1") == "1":
            pytest.skip("CTXACTORS_SKIP_MCP1=1: no .venv-mcp1")
        pytest.fail(
            f"{MCP1_PYTHON.parent.parent} is missing: run `python3 scripts/dev.py test`, which "
            "builds it (langchain-mcp-adapters needs mcp<2), or set CTXACTORS_SKIP_MCP1=1"
        )
    done = subprocess.run(
        [str(MCP1_PYTHON), str(TESTS_DIR / "langchain_mcp_client.py"), json.dumps(connection)],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # its own ctxactors
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _check_adapter_report(report: dict[str, Any]) -> None:
    assert report["transcripts"] == [c.transcript for c in CONVERSATIONS]
    assert report["after"] == [c.final for c in CONVERSATIONS]
    assert report["refused"].startswith("NoConversationError: no conversation given: run")


SERVE_MEMORY = [sys.executable, "-m", "ctxactors.cli", "serve", "--store", "memory"]


def test_langchain_mcp_adapters_over_stdio_keep_three_conversations_apart() -> None:
    connection = {
        "transport": "stdio",
        "command": SERVE_MEMORY[0],
        "args": SERVE_MEMORY[1:],
        "env": serve_env(),
    }
    _check_adapter_report(_run_adapter_client(connection))


def test_langchain_mcp_adapters_over_streamable_http_keep_three_conversations_apart() -> None:
    with http_server("--store", "memory") as (url, _proc):
        report = _run_adapter_client({"transport": "streamable_http", "url": url})
    _check_adapter_report(report)


def test_the_tool_message_of_a_structured_result_is_its_json(runtime: Runtime) -> None:
    create_goal = tools(runtime, ["create_goal"])[0]
    message = asyncio.run(
        create_goal.ainvoke(
            {"type": "tool_call", "id": "c1", "name": "create_goal", "args": {"goal": "x"}},
            conversation("s1"),
        )
    )
    assert isinstance(message, ToolMessage)
    assert json.loads(str(message.content)) == {"id": "g1", "goal": "x"}
    # called directly (no tool call), the tool gives the structured result itself
    assert asyncio.run(create_goal.ainvoke({"goal": "y"}, conversation("s1"))) == {
        "id": "g2",
        "goal": "y",
    }
