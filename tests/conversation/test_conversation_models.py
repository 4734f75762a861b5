"""OpenAICompatibleModel against a small OpenAI-compatible stub server on loopback."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ctxactors import Runtime
from ctxactors.conversation import (
    ChatSession,
    HeuristicTokenCounter,
    Message,
    ModelError,
    OpenAICompatibleModel,
    openai_tools,
)

pytestmark = pytest.mark.timeout(20)


class Stub(BaseHTTPRequestHandler):
    """``POST /v1/chat/completions`` as an OpenAI-compatible server answers it.

    The "model" calls create_goal with the user's text, then get_planning_state, then
    answers with the last tool result. Model names pick failures: ``http-500``,
    ``not-json``, ``no-choices``.
    """

    requests: list[dict[str, Any]] = []

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if self.path != "/v1/chat/completions":
            return self.reply(404, {"error": {"message": "not found"}})
        if self.headers.get("Authorization") != "Bearer sk-test":
            return self.reply(401, {"error": {"message": "bad key"}})
        model = body["model"]
        if model == "http-500":
            return self.reply(500, {"error": {"message": "overloaded"}})
        if model == "not-json":
            return self.reply(200, None, raw=b"<html>gateway</html>")
        if model == "no-choices":
            return self.reply(200, {"id": "x", "choices": []})
        messages = body["messages"]
        last = messages[-1]
        if last["role"] == "user":
            message = self.call("create_goal", {"goal": last["content"]})
        elif sum(m["role"] == "tool" for m in messages) == 1:
            message = self.call("get_planning_state", {})
        else:
            message = {"role": "assistant", "content": f"State: {last['content']}"}
        finish = "tool_calls" if "tool_calls" in message else "stop"
        self.reply(
            200,
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            },
        )

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        call_id = f"call_{len(self.requests)}"
        return {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        }

    def reply(self, status: int, payload: Any, raw: bytes | None = None) -> None:
        data = raw if raw is not None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    Stub.requests.clear()
    with Runtime() as rt:
        yield rt


def chat(runtime: Runtime, model: OpenAICompatibleModel) -> ChatSession:
    return ChatSession(
        runtime,
        model,
        session_id="s1",
        assistant_id="a1",
        system_prompt="You plan.",
        max_context_tokens=4000,
        counter=HeuristicTokenCounter(),
    )


def check_wire(requests: list[dict[str, Any]], runtime: Runtime) -> None:
    assert [r["path"] for r in requests] == ["/v1/chat/completions"] * 3
    first, _, last = (r["body"] for r in requests)
    assert first["model"] == "planner" and first["temperature"] == 0
    assert first["tools"] == openai_tools(runtime.list_tools())
    assert first["tools"][0]["type"] == "function"
    assert "__sessionId" not in json.dumps(first["tools"])
    assert first["messages"] == [
        {"role": "system", "content": "You plan."},
        {"role": "user", "content": "Learn Rust"},
    ]
    assistant, tool = last["messages"][2:4]
    assert assistant["tool_calls"][0]["type"] == "function"
    assert assistant["tool_calls"][0]["function"]["name"] == "create_goal"
    assert tool == {
        "role": "tool",
        "content": '{"id":"g1","goal":"Learn Rust"}',
        "tool_call_id": assistant["tool_calls"][0]["id"],
    }
    assert requests[0]["headers"]["Authorization"] == "Bearer sk-test"


def test_session_over_http_sync(stub: str, runtime: Runtime) -> None:
    model = OpenAICompatibleModel(f"{stub}/v1", "planner", "sk-test", options={"temperature": 0})
    answer = chat(runtime, model).send("Learn Rust")
    model.close()
    assert answer == 'State: {"goals":[{"id":"g1","goal":"Learn Rust"}],"todos":[]}'
    check_wire(Stub.requests, runtime)


def test_session_over_http_async(stub: str, runtime: Runtime) -> None:
    async def run() -> str:
        model = OpenAICompatibleModel(stub, "planner", "sk-test", options={"temperature": 0})
        try:
            return await chat(runtime, model).asend("Learn Rust")
        finally:
            await model.aclose()

    answer = asyncio.run(run())
    assert answer == 'State: {"goals":[{"id":"g1","goal":"Learn Rust"}],"todos":[]}'
    check_wire(Stub.requests, runtime)


def test_reply_decodes_to_a_message(stub: str) -> None:
    model = OpenAICompatibleModel(stub + "/", "planner", "sk-test")
    reply = model.complete([Message.user("Ship it")], [])
    model.close()
    assert reply.role == "assistant" and reply.content is None and reply.tool_calls
    assert reply.tool_calls[0].function.arguments == '{"goal": "Ship it"}'
    assert "tools" not in Stub.requests[-1]["body"]  # no tools: the field is left out


@pytest.mark.parametrize(
    ("model", "key", "match"),
    [
        ("http-500", "sk-test", "answered 500: .*overloaded"),
        ("planner", "wrong", "answered 401"),
        ("not-json", "sk-test", "unexpected body"),
        ("no-choices", "sk-test", "no choices"),
    ],
)
def test_server_failures_are_model_errors(stub: str, model: str, key: str, match: str) -> None:
    client = OpenAICompatibleModel(stub, model, key)
    with pytest.raises(ModelError, match=match):
        client.complete([Message.user("hi")], [])
    with pytest.raises(ModelError, match=match):
        asyncio.run(client.acomplete([Message.user("hi")], []))
    client.close()


def test_unreachable_server_is_a_model_error() -> None:
    with socket.socket() as s:  # a port that was free a moment ago, with nobody on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = OpenAICompatibleModel(f"http://127.0.0.1:{port}", "m", timeout=2)
    with pytest.raises(ModelError, match="ConnectError"):
        model.complete([Message.user("hi")], [])
