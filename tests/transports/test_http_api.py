"""The REST API through a real uvicorn on a loopback port."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from test_history import Survey

from ctxactors import Runtime
from ctxactors.conversation import Message, ScriptedModel, ToolCall
from ctxactors.servers import BUILTIN
from ctxactors.testing import serve_app
from ctxactors.transports.http import create_app

WAIT = 20.0
SERVERS = [*BUILTIN, Survey]


@pytest.fixture
def rt() -> Iterator[Runtime]:
    with Runtime(servers=SERVERS) as runtime:
        yield runtime


@pytest.fixture
def client(rt: Runtime) -> Iterator[httpx.Client]:
    with (
        serve_app(create_app(rt, max_body=64 * 1024)) as url,
        httpx.Client(base_url=url, timeout=WAIT) as http,
    ):
        yield http


def call(
    http: httpx.Client, tool: str, body: Any = None, session: str | None = "s1", **headers: str
) -> httpx.Response:
    h = {"X-Session-Id": session} if session is not None else {}
    h["Content-Type"] = "application/json"  # also without a body: every POST needs it
    h.update({f"X-{k.title()}-Id": v for k, v in headers.items()})
    return http.post(f"/api/v1/tools/{tool}", json=body, headers=h)


def error_of(response: httpx.Response, status: int) -> dict[str, str]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    detail: dict[str, str] = response.json()["error"]
    assert set(detail) == {"code", "message"}
    return detail


def test_health_and_tool_list(client: httpx.Client, rt: Runtime) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "tools": len(rt.tools)}
    assert client.get("/api/v1/tools").json() == {"tools": rt.list_tools()}
    assert client.get("/api/v1/stats").json()["actors"] == 0


def test_a_tool_call_returns_the_mcp_result_and_the_session(client: httpx.Client) -> None:
    r = call(client, "create_goal", {"goal": "Learn Rust"}, assistant="a1")
    assert r.status_code == 200 and r.headers["X-Session-Id"] == "s1"
    assert r.json() == {
        "session_id": "s1",
        "content": [{"type": "text", "text": '{"id":"g1","goal":"Learn Rust"}'}],
        "structuredContent": {"id": "g1", "goal": "Learn Rust"},
        "isError": False,
    }
    # Planning is per assistant and thread: the same ones see the goal, another doesn't.
    state = call(client, "get_planning_state", None, assistant="a1").json()
    assert state["structuredContent"]["goals"] == [{"id": "g1", "goal": "Learn Rust"}]
    other = call(client, "get_planning_state", {}, assistant="a2").json()
    assert other["structuredContent"]["goals"] == []


def test_a_missing_session_gets_a_new_one_that_can_be_reused(client: httpx.Client) -> None:
    first = call(client, "add_content", {"filename": "a.txt", "content": "hi"}, session=None)
    session = first.json()["session_id"]
    assert first.headers["X-Session-Id"] == session and len(session) >= 16
    again = call(client, "list_content", {}, session=session).json()
    assert again["structuredContent"]["count"] == 1
    fresh = call(client, "list_content", {}, session=None).json()
    assert fresh["session_id"] != session and fresh["structuredContent"]["count"] == 0


def test_a_session_in_the_body_is_ignored(client: httpx.Client) -> None:
    call(client, "add_content", {"filename": "secret", "content": "x"}, session="victim")
    r = call(client, "list_content", {"__sessionId": "victim", "__session_id": "victim"})
    assert r.json()["session_id"] == "s1" and r.json()["structuredContent"]["count"] == 0


def test_bad_input_gets_clear_4xx_errors_and_the_server_keeps_serving(
    client: httpx.Client,
) -> None:
    headers = {"X-Session-Id": "s1", "content-type": "application/json"}
    bad_json = client.post("/api/v1/tools/create_goal", content=b'{"goal": ', headers=headers)
    assert error_of(bad_json, 400)["code"] == "malformed_json"
    deep = client.post(
        "/api/v1/tools/create_goal", content=b"[" * 20_000 + b"]" * 20_000, headers=headers
    )
    assert "nested too deeply" in error_of(deep, 400)["message"]
    null = client.post("/api/v1/tools/list_content", content=b"null", headers=headers)
    assert "got null" in error_of(null, 400)["message"]
    not_object = call(client, "create_goal", ["Learn Rust"])
    assert "JSON object" in error_of(not_object, 400)["message"]
    wrong_type = error_of(call(client, "create_goal", {"goal": 5}), 400)
    assert wrong_type["code"] == "invalid_arguments" and "$.goal" in wrong_type["message"]
    unknown_arg = error_of(call(client, "create_goal", {"goal": "x", "extra": 1}), 400)
    assert "extra" in unknown_arg["message"]
    assert error_of(call(client, "no_such_tool", {}), 404)["code"] == "unknown_tool"
    assert error_of(client.get("/api/v1/nowhere"), 404)["code"] == "not_found"
    assert error_of(client.get("/api/v1/tools/create_goal"), 405)["code"] == "method_not_allowed"
    long_id = error_of(call(client, "list_content", {}, session="x" * 300), 400)
    assert "X-Session-Id" in long_id["message"]
    # A tool's own refusal is a result, as in MCP, not an HTTP error.
    refused = call(client, "mark_todo", {"todo_id": "t9"})
    assert refused.status_code == 200
    assert refused.json()["isError"] is True
    assert refused.json()["content"][0]["text"] == "todo 't9' not found"
    assert call(client, "create_goal", {"goal": "still fine"}).status_code == 200


def test_bodies_over_the_limit_get_413_with_or_without_a_length(client: httpx.Client) -> None:
    big = {"filename": "big", "content": "x" * 70_000}
    detail = error_of(call(client, "add_content", big), 413)
    assert detail["code"] == "body_too_large" and "65536" in detail["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        yield b'{"filename": "big", "content": "'
        for _ in range(10):
            yield b"x" * 10_000
        yield b'"}'

    streamed = client.post(
        "/api/v1/tools/add_content",
        content=chunks(),
        headers={"X-Session-Id": "s1", "Content-Type": "application/json"},
    )
    assert error_of(streamed, 413)["code"] == "body_too_large"
    under = call(client, "add_content", {"filename": "ok", "content": "x" * 60_000})
    assert under.status_code == 200 and not under.json()["isError"]


def test_session_context_and_ending_a_session(client: httpx.Client) -> None:
    call(client, "create_goal", {"goal": "one"})
    call(client, "create_goal", {"goal": "two"})
    call(client, "create_playbook", {"name": "deploy"}, assistant="a1")
    call(client, "create_goal", {"goal": "other session"}, session="s2")

    # Without an assistant: the calls made without one; a1 sees its own as well.
    ctx = client.get("/api/v1/sessions/s1/context").json()
    assert ctx["session_id"] == "s1" and ctx["count"] == 2
    assert [op["tool"] for op in ctx["operations"]] == ["create_goal", "create_goal"]
    a1 = {"X-Assistant-Id": "a1"}
    ctx = client.get("/api/v1/sessions/s1/context", headers=a1).json()
    assert [op["tool"] for op in ctx["operations"]] == ["create_playbook"]
    limited = client.get("/api/v1/sessions/s1/context", params={"limit": 1}).json()
    assert [op["arguments"] for op in limited["operations"]] == [{"goal": "two"}]
    filtered = client.get(
        "/api/v1/sessions/s1/context", params=[("tool_filter", "create_goal")]
    ).json()
    assert [op["arguments"]["goal"] for op in filtered["operations"]] == ["two", "one"]
    both = client.get(
        "/api/v1/sessions/s1/context",
        params=[("tool_filter", "create_goal"), ("tool_filter", "create_playbook")],
    ).json()
    assert both["count"] == 2
    assert "limit" in error_of(client.get("/api/v1/sessions/s1/context?limit=x"), 400)["message"]
    assert error_of(client.get("/api/v1/sessions/s1/context?limit=0"), 400)["code"] == (
        "invalid_arguments"
    )
    assert error_of(client.get("/api/v1/sessions/nobody/context"), 404)["code"] == (
        "unknown_session"
    )

    ended = client.delete("/api/v1/sessions/s1")
    assert ended.status_code == 200
    assert ended.json()["session_id"] == "s1" and ended.json()["actors_stopped"] == 3
    assert error_of(client.get("/api/v1/sessions/s1/context"), 404)["code"] == "unknown_session"
    again = client.delete("/api/v1/sessions/s1")  # idempotent: a retry is the same success
    assert (again.status_code, again.json()) == (200, {"session_id": "s1", "actors_stopped": 0})
    state = call(client, "get_planning_state", {}).json()["structuredContent"]
    assert state == {"goals": [], "todos": []}  # the state went with the session
    assert client.get("/api/v1/sessions/s2/context").json()["count"] == 1


def test_follow_up_question_over_http(client: httpx.Client) -> None:
    """The issue's scenario through the REST API a host would use."""
    first = call(client, "add_survey_answers", {"project_id": "123", "answers": ["a4", "a5"]})
    assert first.json()["structuredContent"]["deselected"] == ["a1", "a2", "a3"]
    for i in range(6):
        call(client, "create_goal", {"goal": f"g{i}"})
    r = call(client, "get_recent_context", {"tool_filter": "add_survey_answers", "limit": 1})
    [op] = r.json()["structuredContent"]["operations"]
    assert op["metadata"]["deselected"] == ["a1", "a2", "a3"]
    assert op["arguments"] == {"project_id": "123", "answers": ["a4", "a5"]}


def test_query_without_a_model_is_503_with_a_clear_message(client: httpx.Client) -> None:
    detail = error_of(client.post("/api/v1/query", json={"query": "hello"}), 503)
    assert detail["code"] == "no_model" and "no chat model is configured" in detail["message"]


def test_query_runs_the_agent_loop_with_a_model(rt: Runtime) -> None:
    model = ScriptedModel(
        [
            Message.assistant(None, [ToolCall.new("create_goal", {"goal": "Ship it"})]),
            Message.assistant("Created goal g1."),
        ]
    )
    with serve_app(create_app(rt, model=model)) as url, httpx.Client(base_url=url) as http:
        bad = http.post("/api/v1/query", json={"query": ""})
        assert "$.query" in error_of(bad, 400)["message"]
        long_header = http.post(
            "/api/v1/query",
            json={"query": "hi", "session_id": "q1"},
            headers={"X-Session-Id": "x" * 300},
        )
        assert error_of(long_header, 400)["code"] == "invalid_header"
        r = http.post(
            "/api/v1/query",
            json={"query": "make a goal", "session_id": "q1"},
            headers={"X-Assistant-Id": "a1"},
        )
        assert r.status_code == 200, r.text
        assert r.json() == {"session_id": "q1", "answer": "Created goal g1."}
    state = rt.call("get_planning_state", {"__sessionId": "q1", "__assistantId": "a1"})
    assert state.structured == {"goals": [{"id": "g1", "goal": "Ship it"}], "todos": []}


def test_concurrent_sessions_over_http_keep_their_state_apart(client: httpx.Client) -> None:
    sessions, per_session = 12, 10
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(per_session):
                r = call(client, "create_goal", {"goal": f"s{n}-{i}"}, session=f"c{n}")
                assert r.status_code == 200 and r.json()["session_id"] == f"c{n}"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 2)
    assert not errors
    for n in range(sessions):
        state = call(client, "get_planning_state", {}, session=f"c{n}").json()
        goals = state["structuredContent"]["goals"]
        assert [g["goal"] for g in goals] == [f"s{n}-{i}" for i in range(per_session)]
        assert [g["id"] for g in goals] == [f"g{i + 1}" for i in range(per_session)]
        ctx = client.get(
            f"/api/v1/sessions/c{n}/context", params={"limit": 50, "tool_filter": "create_goal"}
        ).json()
        assert sorted(op["arguments"]["goal"] for op in ctx["operations"]) == sorted(
            f"s{n}-{i}" for i in range(per_session)
        )


def test_extra_routes_and_lifespan_join_the_app(rt: Runtime) -> None:
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        events.append("start")
        yield
        events.append("stop")

    async def mcp(request: Request) -> PlainTextResponse:
        return PlainTextResponse("mcp here")

    app = create_app(rt, routes=[Route("/mcp", mcp, methods=["GET", "POST"])], lifespan=lifespan)
    with serve_app(app) as url:
        assert httpx.get(f"{url}/mcp").text == "mcp here"
        assert httpx.get(f"{url}/healthz").status_code == 200
    assert events == ["start", "stop"]


def test_openapi_document_describes_every_tool_and_response(client: httpx.Client) -> None:
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    tool = doc["paths"]["/api/v1/tools/create_goal"]["post"]
    schema = tool["requestBody"]["content"]["application/json"]["schema"]
    assert schema["properties"]["goal"]["type"] == "string"
    assert tool["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ToolCallResponse"
    }
    assert "isError" in doc["components"]["schemas"]["ToolCallResponse"]["properties"]
    # The batch tool's nested types moved to components, so every $ref resolves.
    text = json.dumps(doc)
    for ref in {part.split('"')[0] for part in text.split('"$ref": "')[1:]}:
        name = ref.removeprefix("#/components/schemas/")
        assert name in doc["components"]["schemas"], ref


# Bounds that only stop a hang: the run takes 10-30 s alone, several times that beside the
# suite's other workers on the same cores.
@pytest.mark.timeout(240)
def test_schemathesis_finds_no_server_errors_or_schema_violations() -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "schemathesis_check.py"
    run = subprocess.run(
        [sys.executable, str(script), "--max-examples", "8", "--phases", "fuzzing,stateful"],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


NOT_UTF8 = [
    (b'{"goal": "\xff"}', "invalid start byte at byte 10"),
    (b'{"goal": "caf\xc3"}', "invalid continuation byte at byte 13"),
    (b'{"goal": "\xed\xa0\x80"}', "invalid continuation byte at byte 10"),  # a surrogate
    (b'{"\xfe": "x"}', "invalid start byte at byte 2"),
]


@pytest.mark.parametrize(("body", "where"), NOT_UTF8)
def test_a_body_that_is_not_utf8_is_a_400_on_every_endpoint_that_reads_one(
    rt: Runtime, body: bytes, where: str
) -> None:
    model = ScriptedModel([])  # never asked: the body is refused first
    headers = {"X-Session-Id": "u8", "content-type": "application/json"}
    with serve_app(create_app(rt, model=model)) as url, httpx.Client(base_url=url) as http:
        for path in ("/api/v1/tools/create_goal", "/api/v1/query"):
            detail = error_of(http.post(path, content=body, headers=headers), 400)
            assert detail == {
                "code": "malformed_json",
                "message": f"the request body is not valid UTF-8 ({where})",
            }, path
        ok = http.post("/api/v1/tools/create_goal", json={"goal": "fine"}, headers=headers)
        assert ok.status_code == 200 and ok.json()["structuredContent"]["goal"] == "fine"
    assert model.prompts == []


@pytest.mark.parametrize(
    ("session_id", "message"),
    [
        ("a\r\nX-Injected: 1", "session_id contains the character '\\r', which no header carries"),
        ("nul\x00", "session_id contains the character '\\x00', which no header carries"),
        ("tab\tin", "session_id contains the character '\\t', which no header carries"),
        ("del\x7f", "session_id contains the character '\\x7f', which no header carries"),
        ("nel\x85", "session_id contains the character '\\x85', which no header carries"),
        (" lead", "session_id starts or ends with a space or tab"),
        ("trail ", "session_id starts or ends with a space or tab"),
    ],
)
def test_a_query_session_id_no_header_can_carry_is_refused_before_the_model_runs(
    rt: Runtime, session_id: str, message: str
) -> None:
    model = ScriptedModel([Message.assistant("never sent")])
    body = json.dumps({"query": "make a goal", "session_id": session_id}).encode()
    with serve_app(create_app(rt, model=model)) as url, httpx.Client(base_url=url) as http:
        refused = http.post(
            "/api/v1/query", content=body, headers={"content-type": "application/json"}
        )
        assert error_of(refused, 400) == {"code": "invalid_request", "message": message}
        assert http.get("/healthz").status_code == 200
    assert model.prompts == [] and rt.stats()["actors"] == 0


def test_a_query_session_id_beyond_latin1_comes_back_intact_in_the_header(rt: Runtime) -> None:
    session_id = "会话-Ω-café"
    model = ScriptedModel(
        [
            Message.assistant(None, [ToolCall.new("create_goal", {"goal": "Ship it"})]),
            Message.assistant("Created goal g1."),
        ]
    )
    with serve_app(create_app(rt, model=model)) as url, httpx.Client(base_url=url) as http:
        r = http.post("/api/v1/query", json={"query": "make a goal", "session_id": session_id})
        assert r.status_code == 200, r.text
        assert r.json() == {"session_id": session_id, "answer": "Created goal g1."}
        assert (
            r.headers.raw[[k.lower() for k, _ in r.headers.raw].index(b"x-session-id")][1]
            == session_id.encode()
        )
        again = http.post(
            "/api/v1/tools/get_planning_state",
            json={},
            headers=[(b"X-Session-Id", session_id.encode())],
        )
        assert again.json()["structuredContent"]["goals"] == [{"id": "g1", "goal": "Ship it"}]


def test_id_headers_are_utf8_and_refused_when_they_are_not_or_cannot_be_ids(
    client: httpx.Client,
) -> None:
    session = [(b"X-Session-Id", "café".encode())]
    created = client.post("/api/v1/tools/create_goal", json={"goal": "g"}, headers=session)
    assert created.status_code == 200 and created.json()["session_id"] == "café"
    assert created.headers["X-Session-Id"] == "café"  # sent back as UTF-8
    state = client.post("/api/v1/tools/get_planning_state", json={}, headers=session).json()
    assert state["structuredContent"]["goals"] == [{"id": "g1", "goal": "g"}]
    assistant = [*session, (b"X-Assistant-Id", "ä".encode())]
    other = client.post("/api/v1/tools/create_goal", json={"goal": "ä's"}, headers=assistant)
    assert other.json()["structuredContent"] == {"id": "g1", "goal": "ä's"}  # its own planning
    assert client.get("/api/v1/sessions/café/context").json()["count"] == 2
    for header in (b"X-Session-Id", b"X-Assistant-Id", b"X-Thread-Id"):
        bad = client.post("/api/v1/tools/list_content", json={}, headers=[(header, b"caf\xe9")])
        assert error_of(bad, 400) == {
            "code": "invalid_header",
            "message": f"{header.decode()} is not valid UTF-8",
        }
    control = client.post(
        "/api/v1/tools/list_content", json={}, headers=[(b"X-Session-Id", "a\x85b".encode())]
    )
    assert error_of(control, 400) == {
        "code": "invalid_header",
        "message": "X-Session-Id contains the character '\\x85', which no header carries",
    }
    assert rt_actors(client) == 3  # two planning keys and history; the refused started none


def rt_actors(client: httpx.Client) -> int:
    actors: int = client.get("/api/v1/stats").json()["actors"]
    return actors
