"""ChatSession: the agent loop, sync and async, on a fake runtime and on the real one."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from ctxactors import Runtime, RuntimeClosedError, ToolResult
from ctxactors.conversation import (
    ChatSession,
    HeuristicTokenCounter,
    Message,
    ModelError,
    ScriptedModel,
    ToolCall,
)

pytestmark = pytest.mark.timeout(20)


WAIT = 10.0  # bound for waits that pass at once unless the code is broken


class FakeRuntime:
    """A stand-in runtime that records every call.

    With ``meet=n`` each call waits at a barrier until `n` parties are there at once, so
    calls only get through when they really run concurrently; `peak` is the most calls
    seen inside together. `abarrier` is the asyncio barrier `acall` waits at (set it to let
    the test itself be a party).
    """

    def __init__(self, meet: int = 0) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.peak = 0
        self._inside = 0
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(meet, timeout=WAIT) if meet else None
        self.abarrier: asyncio.Barrier | None = None

    def list_tools(self) -> list[dict[str, Any]]:
        return [{"name": "wait", "description": "Wait.", "inputSchema": {"type": "object"}}]

    def call(self, tool: str, arguments: Mapping[str, Any] | str | None = None) -> ToolResult:
        with self._entered():
            if self._barrier is not None:
                self._barrier.wait()
        return self._record(tool, arguments)

    async def acall(
        self, tool: str, arguments: Mapping[str, Any] | str | None = None
    ) -> ToolResult:
        with self._entered():
            if self.abarrier is not None:
                await asyncio.wait_for(self.abarrier.wait(), WAIT)
        return self._record(tool, arguments)

    @contextlib.contextmanager
    def _entered(self) -> Iterator[None]:
        with self._lock:
            self._inside += 1
            self.peak = max(self.peak, self._inside)
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1

    def _record(self, tool: str, arguments: Any) -> ToolResult:
        with self._lock:
            self.calls.append((tool, dict(arguments or {})))
        return ToolResult.ok({"tool": tool, "n": len(self.calls)})


def session(runtime: Any, model: ScriptedModel, **kwargs: Any) -> ChatSession:
    options: dict[str, Any] = dict(
        session_id="s1",
        assistant_id="a1",
        system_prompt="You help.",
        max_context_tokens=4000,
        counter=HeuristicTokenCounter(),
    )
    return ChatSession(runtime, model, **{**options, **kwargs})


def calls(*names: str) -> Message:
    return Message.assistant(None, [ToolCall.new(name, {"x": i}) for i, name in enumerate(names)])


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    with Runtime() as rt:
        yield rt


def test_calls_of_one_reply_run_concurrently() -> None:
    runtime = FakeRuntime(meet=3)  # each call passes only once all three are inside
    model = ScriptedModel([calls("wait", "wait", "wait"), Message.assistant("ok")])
    chat = session(runtime, model)
    assert chat.send("go") == "ok"
    assert runtime.peak == 3 and len(runtime.calls) == 3
    step = chat.history[1]
    assert step.tool_calls is not None
    assert [m.tool_call_id for m in chat.history[2:5]] == [c.id for c in step.tool_calls]


def test_asend_runs_calls_concurrently_without_blocking_the_loop() -> None:
    asyncio.run(asend_concurrently())


async def asend_concurrently() -> None:
    # Four parties: the three calls and this coroutine. It only reaches the barrier if the
    # loop keeps running while the calls wait, and they only pass if all three wait at once.
    runtime = FakeRuntime()
    runtime.abarrier = asyncio.Barrier(4)
    model = ScriptedModel([calls("wait", "wait", "wait"), Message.assistant("ok")])
    sending = asyncio.create_task(session(runtime, model).asend("go"))
    await asyncio.wait_for(runtime.abarrier.wait(), WAIT)
    assert await sending == "ok"
    assert runtime.peak == 3 and len(runtime.calls) == 3


def test_context_is_injected_and_spoofing_dropped() -> None:
    runtime = FakeRuntime()
    spoof = Message.assistant(
        None, [ToolCall.new("wait", {"x": 1, "__sessionId": "victim", "__assistantId": "root"})]
    )
    chat = session(runtime, ScriptedModel([spoof, Message.assistant("ok")]), thread_id="t9")
    chat.send("go")
    assert runtime.calls == [
        ("wait", {"x": 1, "__sessionId": "s1", "__assistantId": "a1", "__threadId": "t9"})
    ]


def test_model_sees_the_runtime_tools_and_the_prompt() -> None:
    runtime = FakeRuntime()
    model = ScriptedModel([Message.assistant("hello")])
    chat = session(runtime, model, system_prompt="Base.", extension="Be brief.")
    assert chat.send("hi") == "hello"
    assert model.tools == runtime.list_tools()
    assert model.prompts == [[Message.system("Base.\n\nBe brief."), Message.user("hi")]]
    assert chat.history == [Message.user("hi"), Message.assistant("hello")]


def test_max_steps_stops_the_loop_and_says_so() -> None:
    model = ScriptedModel([calls("wait")] * 3)
    chat = session(FakeRuntime(), model, max_steps=3)
    answer = chat.send("loop forever")
    assert answer.startswith("Stopped after 3 model calls")
    assert len(model.prompts) == 3 and model.remaining == 0
    assert chat.history[-1] == Message.assistant(answer)
    assert chat.history[-2].role == "tool"  # the last calls ran and were answered
    with pytest.raises(ValueError):
        session(FakeRuntime(), model, max_steps=0)


def test_missing_and_duplicate_call_ids_are_filled_in() -> None:
    reply = Message.assistant(
        None,
        [
            ToolCall(id="", function=ToolCall.new("wait").function),
            ToolCall(id="same", function=ToolCall.new("wait").function),
            ToolCall(id="same", function=ToolCall.new("wait").function),
        ],
    )
    chat = session(FakeRuntime(), ScriptedModel([reply, Message.assistant("ok")]))
    chat.send("go")
    step = chat.history[1]
    assert step.tool_calls is not None
    ids = [c.id for c in step.tool_calls]
    assert len(set(ids)) == 3 and all(ids) and ids[1] == "same"
    assert [m.tool_call_id for m in chat.history[2:5]] == ids


def test_a_reply_that_is_not_an_assistant_message_is_refused() -> None:
    chat = session(FakeRuntime(), ScriptedModel([Message.user("I am the model")]))
    with pytest.raises(ModelError, match="assistant message"):
        chat.send("go")


def test_spent_script_raises() -> None:
    with pytest.raises(ModelError, match="only 0 steps"):
        session(FakeRuntime(), ScriptedModel([])).send("go")


def test_real_runtime_planning_tools_end_to_end(runtime: Runtime) -> None:
    def read_back(prompt: list[Message], tools: list[dict[str, Any]]) -> Message:
        # The model reads the id of the goal it created from the last tool result.
        assert "g1" in prompt[-1].text
        return Message.assistant(None, [ToolCall.new("get_planning_state", {})])

    model = ScriptedModel(
        [
            Message.assistant(
                "Creating it.", [ToolCall.new("create_goal", {"goal": "Learn Rust"})]
            ),
            read_back,
            Message.assistant("You have one goal: Learn Rust."),
        ]
    )
    chat = session(runtime, model)
    assert chat.send("Help me learn Rust") == "You have one goal: Learn Rust."
    assert {t["name"] for t in model.tools} >= {"create_goal", "get_planning_state"}
    assert all("__sessionId" not in str(t["inputSchema"]) for t in model.tools)
    state = chat.history[-2]
    assert state.role == "tool"
    assert '"goals":[{"id":"g1","goal":"Learn Rust"}]' in state.text
    # The goal belongs to this session and assistant only.
    mine = runtime.call("get_planning_state", {"__sessionId": "s1", "__assistantId": "a1"})
    other = runtime.call("get_planning_state", {"__sessionId": "s2", "__assistantId": "a1"})
    assert len(mine.structured["goals"]) == 1 and other.structured["goals"] == []  # type: ignore[index]


def test_bad_calls_become_error_results_the_model_can_read(runtime: Runtime) -> None:
    broken = Message.assistant(
        None,
        [
            ToolCall.new("no_such_tool", {}),
            ToolCall(id="bad_json", function=ToolCall.new("create_goal", "{not json").function),
            ToolCall.new("create_goal", {"goal": 42}),
            ToolCall.new("add_todo", {"name": "x", "goal_id": "g404"}),
        ],
    )
    chat = session(runtime, ScriptedModel([broken, Message.assistant("sorry")]))
    assert chat.send("go") == "sorry"
    results = [m.text for m in chat.history if m.role == "tool"]
    assert len(results) == 4 and all(r.startswith("Error: ") for r in results)
    assert "no_such_tool" in results[0]
    assert "not valid JSON" in results[1]
    assert "Expected `str`, got `int`" in results[2]
    assert "g404" in results[3] and "not found" in results[3]


def test_concurrent_sessions_stay_apart(runtime: Runtime) -> None:
    asyncio.run(concurrent_sessions(runtime))


async def concurrent_sessions(runtime: Runtime) -> None:
    def chat_for(user: str) -> ChatSession:
        model = ScriptedModel(
            [
                Message.assistant(None, [ToolCall.new("create_goal", {"goal": f"goal of {user}"})]),
                Message.assistant(None, [ToolCall.new("get_planning_state", {})]),
                lambda prompt, tools: Message.assistant(prompt[-1].text),
            ]
        )
        return session(runtime, model, session_id=user)

    chats = [chat_for(f"user{i}") for i in range(8)]
    answers = await asyncio.gather(*(c.asend("make my goal") for c in chats))
    for i, answer in enumerate(answers):
        assert answer == f'{{"goals":[{{"id":"g1","goal":"goal of user{i}"}}],"todos":[]}}'


def test_a_closed_runtime_propagates_and_the_history_stays_sendable() -> None:
    rt = Runtime()
    rt.close()
    goal = Message.assistant(None, [ToolCall.new("create_goal", {"goal": "x"})])
    model = ScriptedModel([goal, Message.assistant("recovered")])
    chat = session(rt, model)
    with pytest.raises(RuntimeClosedError):
        chat.send("go")
    # The unanswered call is in the history but never sent: the next prompt drops it.
    assert chat.history[-1].tool_calls
    with Runtime() as live:
        chat.runtime = live
        assert chat.send("again") == "recovered"
    assert [m.role for m in model.prompts[-1]] == ["system", "user", "user"]


def test_resume_from_a_saved_history() -> None:
    saved = [Message.user("first"), Message.assistant("first answer")]
    model = ScriptedModel([Message.assistant("second answer")])
    chat = session(FakeRuntime(), model, history=saved)
    chat.send("second")
    assert model.prompts[0][1:] == [*saved, Message.user("second")]
