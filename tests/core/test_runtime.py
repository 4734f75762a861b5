"""Routing, validation, failure isolation and tool declaration."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from structlog.testing import capture_logs

from ctxactors import (
    CallTimeoutError,
    InvalidArgumentsError,
    Runtime,
    RuntimeClosedError,
    Scope,
    Server,
    ToolContext,
    UnknownToolError,
    inject_context,
    tool,
)
from ctxactors.errors import ShardUnavailableError
from ctxactors.servers import BUILTIN
from ctxactors.state import MemoryStore
from ctxactors.testing import ManualClock, wait_until
from ctxactors.testing import context_args as ctx_args
from ctxactors.tools import ToolSpec


class Flaky(Server):
    """A server whose tools fail in every way a handler can."""

    name = "flaky"
    scope = Scope.SESSION

    def __init__(self) -> None:
        self.count = 0

    @tool
    def bump(self, ctx: ToolContext) -> dict[str, Any]:
        """Count one."""
        self.count += 1
        return {"count": self.count}

    @tool
    def boom(self, ctx: ToolContext, kind: str = "value") -> dict[str, Any]:
        """Raise."""
        if kind == "exit":
            raise SystemExit(3)
        if kind == "keyboard":
            raise KeyboardInterrupt
        raise ValueError("bad thing")

    @tool
    def slow(self, ctx: ToolContext, seconds: float, tag: str = "") -> dict[str, Any]:
        """Sleep, then answer with the tag."""
        time.sleep(seconds)
        return {"tag": tag}


@pytest.fixture
def rt() -> Any:
    with Runtime([*BUILTIN, Flaky], call_timeout=10) as runtime:
        yield runtime


def state(
    rt: Runtime, session: str, assistant: str | None = None, thread: str | None = None
) -> dict[str, Any]:
    result = rt.call("get_planning_state", ctx_args(session, assistant, thread))
    assert not result.is_error
    assert result.structured is not None
    return result.structured


def test_three_sessions_two_assistants_each_see_exactly_their_own_state(rt: Runtime) -> None:
    contexts = [(s, a) for s in ("s1", "s2", "s3") for a in ("a1", "a2")]
    for s, a in contexts:
        for i in range(3):
            rt.call("create_goal", ctx_args(s, a, goal=f"{s}/{a}/{i}"))
    for s, a in contexts:
        goals = [g["goal"] for g in state(rt, s, a)["goals"]]
        assert goals == [f"{s}/{a}/{i}" for i in range(3)]
    # Threads split planning state further; sessions split playbooks.
    rt.call("create_goal", ctx_args("s1", "a1", "t9", goal="threaded"))
    assert [g["goal"] for g in state(rt, "s1", "a1", "t9")["goals"]] == ["threaded"]
    rt.call("create_playbook", ctx_args("s1", "a1", name="p"))
    assert rt.call("list_playbooks", ctx_args("s2", "a1")).structured == {"playbooks": []}


def test_playbooks_are_owned_by_their_assistant(rt: Runtime) -> None:
    pb = rt.call(
        "create_playbook", ctx_args("s1", "a1", name="deploy", steps=["build", "ship"])
    ).structured
    assert pb == {"id": pb["id"], "name": "deploy", "agent_id": "a1", "steps": ["build", "ship"]}
    rt.call("create_playbook", ctx_args("s1", "a2", name="other"))
    assert [
        p["name"] for p in rt.call("list_playbooks", ctx_args("s1", "a1")).structured["playbooks"]
    ] == ["deploy"]
    ok = rt.call("select_playbook", ctx_args("s1", "a1", id=pb["id"]))
    assert not ok.is_error and ok.structured["selected"]["id"] == pb["id"]
    refused = rt.call("select_playbook", ctx_args("s1", "a2", id=pb["id"]))
    assert refused.is_error and "does not belong to assistant" in refused.text


def test_a_caller_without_an_assistant_sees_only_playbooks_no_assistant_owns(
    rt: Runtime,
) -> None:
    secret = rt.call("create_playbook", ctx_args("s1", "a1", name="a1's", steps=["secret"]))
    shared = rt.call("create_playbook", ctx_args("s1", name="session's", steps=["open"]))
    assert rt.call("list_playbooks", ctx_args("s1")).structured == {
        "playbooks": [
            {
                "id": shared.structured["id"],
                "name": "session's",
                "agent_id": None,
                "steps": ["open"],
            }
        ]
    }
    refused = rt.call("select_playbook", ctx_args("s1", id=secret.structured["id"]))
    assert refused.is_error
    assert refused.text == f"playbook {secret.structured['id']!r} does not belong to assistant None"
    ok = rt.call("select_playbook", ctx_args("s1", id=shared.structured["id"]))
    assert not ok.is_error and ok.structured["selected"]["name"] == "session's"
    # And an assistant sees only its own, never the session's unowned ones.
    listed = rt.call("list_playbooks", ctx_args("s1", "a1")).structured["playbooks"]
    assert [p["name"] for p in listed] == ["a1's"]
    refused = rt.call("select_playbook", ctx_args("s1", "a1", id=shared.structured["id"]))
    assert refused.is_error and "does not belong to assistant 'a1'" in refused.text


def test_llm_spoofing_another_assistant_through_inject_context_is_refused(rt: Runtime) -> None:
    pb = rt.call("create_playbook", ctx_args("s1", "victim", name="secret")).structured
    llm_args = {"id": pb["id"], "__assistantId": "victim", "__sessionId": "s1"}
    host_args = inject_context(llm_args, ToolContext("s1", "attacker"))
    result = rt.call("select_playbook", host_args)
    assert result.is_error and "does not belong to assistant 'attacker'" in result.text
    # And the JSON-string form the LLM really produces.
    host_args = inject_context(
        '{{"id": "{}", "__assistant_id": "victim"}}'.format(pb["id"]), ToolContext("s1", "attacker")
    )
    assert rt.call("select_playbook", host_args).is_error


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ({"goal": 5}, "$.goal"),
        ({}, "`goal`"),
        ({"goal": "x", "extra": 1}, "`extra`"),
        ("[1, 2]", "JSON object"),
        ("null", "got null"),
        ("42", "got int"),
        ('{"goal": ', "not valid JSON"),
        ('{"goal": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ({"goal": "x", "__sessionId": 7}, "__sessionId"),
        ({"goal": "x", "__threadId": ["t"]}, "__threadId"),
        ({"goal": ""}, "$.goal"),
    ],
)
def test_bad_input_raises_invalid_arguments_naming_the_problem(
    rt: Runtime, arguments: Any, needle: str
) -> None:
    with pytest.raises(InvalidArgumentsError) as info:
        rt.call("create_goal", arguments)
    assert needle in str(info.value)
    assert info.value.code == -32602
    # Nothing ran, and the runtime keeps serving.
    assert rt.stats()["calls"] == 0
    assert rt.call("create_goal", ctx_args("s", goal="fine")).structured["goal"] == "fine"


def test_unknown_tool(rt: Runtime) -> None:
    with pytest.raises(UnknownToolError, match="'nope'") as info:
        rt.call("nope", {})
    assert info.value.code == -32602  # invalid params, as in the MCP spec
    assert not rt.call("bump", ctx_args("s")).is_error


def test_no_session_falls_back_to_default_with_a_warning(rt: Runtime) -> None:
    with capture_logs() as logs:
        rt.call("create_playbook", {"name": "p"})
    assert any(e["event"] == "no_session_id" for e in logs)
    assert len(rt.call("list_playbooks", ctx_args("default")).structured["playbooks"]) == 1


@pytest.mark.parametrize("kind", ["value", "exit", "keyboard"])
def test_a_failing_handler_gives_an_error_result_and_keeps_the_state(
    rt: Runtime, kind: str
) -> None:
    rt.call("bump", ctx_args("s1"))
    rt.call("bump", ctx_args("s2"))
    result = rt.call("boom", ctx_args("s1", kind=kind))
    assert result.is_error
    expected = {
        "value": "ValueError: bad thing",
        "exit": "SystemExit: 3",
        "keyboard": "KeyboardInterrupt",
    }[kind]
    assert result.text.startswith(expected)
    # The same actor kept its state; other keys are untouched.
    assert rt.call("bump", ctx_args("s1")).structured == {"count": 2}
    assert rt.call("bump", ctx_args("s2")).structured == {"count": 2}
    assert rt.stats()["spawned"] == 2


def test_timeout_raises_and_the_late_reply_never_reaches_a_later_call(rt: Runtime) -> None:
    with pytest.raises(CallTimeoutError) as info:
        rt.call("slow", ctx_args("s", seconds=0.5, tag="late"), timeout=0.05)
    assert info.value.code in range(-32099, -31999)
    # The next call to the same key queues behind the slow one and gets its own answer.
    assert rt.call("slow", ctx_args("s", seconds=0, tag="next")).structured == {"tag": "next"}


def test_closed_runtime_refuses_calls() -> None:
    rt = Runtime()
    rt.call("create_goal", ctx_args("s", goal="x"))
    rt.close()
    rt.close()  # idempotent
    with pytest.raises(RuntimeClosedError):
        rt.call("create_goal", ctx_args("s", goal="x"))
    assert rt.stats()["actors"] == 0


def test_list_tools_has_clean_schemas_descriptions_and_annotations(rt: Runtime) -> None:
    tools = {t["name"]: t for t in rt.list_tools()}
    assert {
        "create_goal",
        "add_todo",
        "mark_todo",
        "get_planning_state",
        "create_playbook",
        "list_playbooks",
        "select_playbook",
    } <= set(tools)
    for t in tools.values():
        schema = t["inputSchema"]
        assert schema["type"] == "object" and "$ref" not in schema
        assert not any(k.startswith("__") or "session" in k.lower() for k in schema["properties"])
        assert t["description"]
        assert isinstance(t["annotations"]["readOnlyHint"], bool)
    assert tools["create_goal"]["inputSchema"]["required"] == ["goal"]
    assert tools["create_goal"]["description"].startswith("Create a goal")
    assert tools["get_planning_state"]["annotations"]["readOnlyHint"] is True
    assert tools["create_goal"]["annotations"]["readOnlyHint"] is False


@pytest.mark.parametrize("param", ["session_id", "sessionId", "assistant_id", "threadId"])
def test_registration_refuses_a_schema_with_a_context_field(param: str) -> None:
    source = f"""
class Leaky(Server):
    name = "leaky"
    @tool
    def peek(self, ctx: ToolContext, {param}: str) -> dict:
        '''Leak.'''
        return {{}}
"""
    with pytest.raises(TypeError, match="reserved for the call context"):
        exec(source, {"Server": Server, "tool": tool, "ToolContext": ToolContext})


def test_registration_refuses_duplicate_tool_names() -> None:
    class Again(Server):
        name = "again"

        @tool
        def create_goal(self, ctx: ToolContext, goal: str) -> dict[str, Any]:
            """Shadow planning's tool."""
            return {}

    with pytest.raises(ValueError, match="duplicate tool name 'create_goal'.*Planning.*Again"):
        Runtime([*BUILTIN, Again])


def test_concurrent_first_calls_for_one_key_spawn_exactly_one_actor(rt: Runtime) -> None:
    barrier = threading.Barrier(64)
    errors: list[BaseException] = []

    def first_call() -> None:
        try:
            barrier.wait()
            rt.call("bump", ctx_args("one-key"))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=first_call) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert rt.stats()["spawned"] == 1
    assert rt.call("bump", ctx_args("one-key")).structured == {"count": 65}


def test_one_json_log_line_per_call_with_the_context() -> None:
    with Runtime() as rt, capture_logs() as logs:
        rt.call("create_goal", ctx_args("s1", "a1", "t1", goal="x"))
        rt.call("select_playbook", ctx_args("s1", "a1", id="missing"))
        wait_until(lambda: sum(e["event"] == "tool_call" for e in logs) >= 2, 5)
    calls = [e for e in logs if e["event"] == "tool_call"]
    assert [(c["tool"], c["outcome"]) for c in calls] == [
        ("create_goal", "ok"),
        ("select_playbook", "error"),
    ]
    assert (
        calls[0]["session_id"] == "s1"
        and calls[0]["assistant_id"] == "a1"
        and calls[0]["thread_id"] == "t1"
    )
    assert all(isinstance(c["duration_ms"], float) for c in calls)


def test_list_tools_returns_copies_the_caller_may_change(rt: Runtime) -> None:
    first = rt.list_tools()
    first[0]["inputSchema"]["properties"]["__sessionId"] = {"type": "string"}
    first[0]["annotations"]["readOnlyHint"] = "changed"
    again = rt.list_tools()[0]
    assert "__sessionId" not in again["inputSchema"]["properties"]
    assert isinstance(again["annotations"]["readOnlyHint"], bool)


# -- the backend seam (what `serve --backend ray` plugs in), without Ray -----------------


class LocalBackend:
    """Runs the key actors in a second runtime of this process, as a Ray shard would."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.inner: Runtime | None = None
        self.started: list[str] = []
        self.failure: Exception | None = None  # what every call gets instead, when set
        self.closed = False

    def start(self, servers: list[type[Server]]) -> None:
        self.started = [s.name for s in servers]
        self.inner = Runtime(servers, clock=self.clock, ttl=60)

    def runtime(self) -> Runtime:
        assert self.inner is not None
        return self.inner

    def submit(self, spec: ToolSpec, ctx: ToolContext, args: dict[str, Any], reply: Any) -> None:
        if self.failure is not None:
            reply.set(self.failure)
            return
        mine = self.runtime().tool_spec(spec.name)
        self.runtime()._submit(mine, ctx, mine.validate(args), args, reply, deadline=None)

    def end_session(self, session_id: str, principal: str | None) -> int:
        return self.runtime().end_session(session_id, principal=principal)

    def has_session(self, session_id: str, principal: str | None) -> bool:
        return self.runtime().has_session(session_id, principal=principal)

    def reap(self) -> int:
        return self.runtime().reap()

    def stats(self) -> dict[str, int]:
        return self.runtime().stats()

    def close(self) -> None:
        self.runtime().close()
        self.closed = True


class Attached(Server):
    """Records the runtimes it is attached to."""

    runtimes: list[Runtime] = []

    @classmethod
    def attach(cls, runtime: Any) -> None:
        cls.runtimes.append(runtime)

    @tool
    def noop(self, ctx: ToolContext) -> dict[str, Any]:
        """Nothing."""
        return {}


def test_a_backend_runs_the_calls_and_answers_for_the_sessions(clock: ManualClock) -> None:
    with pytest.raises(ValueError) as refused:
        Runtime(backend=LocalBackend(clock), store=MemoryStore())
    assert str(refused.value) == (
        "a backend keeps key state in its own store: give the store to it"
    )
    backend = LocalBackend(clock)
    Attached.runtimes.clear()
    with Runtime([Flaky, Attached], backend=backend, clock=clock) as rt:
        assert backend.started == ["flaky", "attached", "history", "batch", "presets"]
        assert Attached.runtimes == [backend.inner]  # the servers run there, not here
        assert rt.call("bump", ctx_args("s1"), principal="p").structured == {"count": 1}
        assert rt.call("bump", ctx_args("s1"), principal="p").structured == {"count": 2}
        assert rt.has_session("s1", principal="p") is True
        assert rt.has_session("s1", principal="q") is False
        stats = rt.stats()
        assert (stats["actors"], stats["calls"]) == (1, 2)
        clock.advance(61)
        assert rt.reap() == 1
        assert rt.call("bump", ctx_args("s1"), principal="p").structured == {"count": 1}
        assert rt.end_session("s1", principal="q") == 0
        assert rt.end_session("s1", principal="p") == 1
        assert rt.has_session("s1", principal="p") is False
        backend.failure = ShardUnavailableError("shard 0 went away")
        with pytest.raises(ShardUnavailableError, match="shard 0 went away"):
            rt.call("bump", ctx_args("s1"))
        with pytest.raises(ShardUnavailableError, match="shard 0 went away"):
            asyncio.run(rt.acall("bump", ctx_args("s1")))
        assert not backend.closed
    assert backend.closed and backend.runtime().closed
