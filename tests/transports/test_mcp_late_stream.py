"""``/mcp`` answers a call as JSON, and as an SSE stream with pings once it runs long
(``http.ping_interval``): a real ``ctxactors serve`` process, raw HTTP and the SDK's client."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp_support import http_server

pytestmark = pytest.mark.timeout(60)

PING_S = 0.2
MODERN = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "Mcp-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call",
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with http_server(env={"CTXACTORS_HTTP_PING_INTERVAL": str(PING_S)}) as (address, _proc):
        yield address


def call(tool: str, arguments: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }


def post(client: httpx.Client, url: str, tool: str, arguments: dict[str, Any]) -> httpx.Response:
    return client.post(url, json=call(tool, arguments), headers={**MODERN, "Mcp-Name": tool})


def test_a_quick_call_answers_as_one_json_body(url: str) -> None:
    with httpx.Client() as client:
        answer = post(client, url, "create_goal", {"goal": "g", "__sessionId": "quick"})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["result"]["structuredContent"] == {"id": "g1", "goal": "g"}


def test_a_long_call_becomes_a_stream_of_pings_then_its_answer(url: str) -> None:
    """The call waits on a gate the test opens only once it has read two pings."""
    gate = {"gate": "late-raw", "__sessionId": "late-raw"}
    with httpx.Client(timeout=30) as client:
        request = client.build_request(
            "POST", url, json=call("wait_gate", gate), headers={**MODERN, "Mcp-Name": "wait_gate"}
        )
        response = client.send(request, stream=True)
        try:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            assert response.headers["cache-control"] == "no-cache, no-transform"
            lines = response.iter_lines()
            pings = 0
            while pings < 2:
                line = next(lines)
                assert line in (": ping", ""), line
                pings += line == ": ping"
            opened = post(client, url, "open_gate", {"gate": "late-raw", "__sessionId": "o"})
            assert opened.headers["content-type"] == "application/json"
            rest = [line for line in lines if line and line != ": ping"]
        finally:
            response.close()
    assert rest[0] == "event: message" and rest[1].startswith("data: ")
    assert len(rest) == 2, rest
    answer = json.loads(rest[1].removeprefix("data: "))
    assert answer["id"] == 1
    assert answer["result"]["structuredContent"] == {"opened": True}


def test_a_client_that_takes_no_stream_waits_for_its_json(url: str) -> None:
    with httpx.Client(timeout=30) as client:
        answer = client.post(
            url,
            json=call("slow", {"marker": "/dev/null", "seconds": 3 * PING_S, "__sessionId": "j"}),
            headers={**MODERN, "Accept": "application/json", "Mcp-Name": "slow"},
        )
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["result"]["structuredContent"] == {"slept": 3 * PING_S}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_sdk_client_reads_a_long_call_from_the_stream(url: str, mode: Any) -> None:
    """Stateless (2026-07-28) and in an MCP session (whose stream carries its id)."""
    arguments = {"marker": "/dev/null", "seconds": 4 * PING_S, "__sessionId": f"sdk-{mode}"}

    async def main() -> Any:
        async with Client(url, mode=mode) as client:
            slow = await client.call_tool("slow", arguments)
            quick = await client.call_tool("create_goal", {"goal": "after", "__sessionId": mode})
            return slow, quick

    slow, quick = anyio.run(main)
    assert slow.structured_content == {"slept": 4 * PING_S}
    assert quick.structured_content == {"id": "g1", "goal": "after"}


def test_the_stream_of_a_session_names_it(url: str) -> None:
    """In an MCP session, a call that outlasts the interval gets a stream whose headers
    carry the session's id, as the SDK's own streams do."""
    headers = {"Accept": MODERN["Accept"], "Content-Type": "application/json"}
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    with httpx.Client(timeout=30) as client:
        opened = client.post(url, json=initialize, headers=headers)
        assert opened.headers["content-type"] == "application/json"
        session = {
            **headers,
            "Mcp-Session-Id": opened.headers["mcp-session-id"],
            "Mcp-Protocol-Version": "2025-11-25",
        }
        slow = {"marker": "/dev/null", "seconds": 3 * PING_S, "__sessionId": "named"}
        answer = client.post(url, json=call("slow", slow, 7), headers=session)
    assert answer.headers["content-type"] == "text/event-stream"
    assert answer.headers["mcp-session-id"] == session["Mcp-Session-Id"]
    lines = re.split(r"\r\n|\r|\n", answer.text)
    data = [json.loads(line[5:]) for line in lines if line.startswith("data:")]
    assert lines.count(": ping") >= 1
    assert [d["id"] for d in data] == [7]
    assert data[0]["result"]["structuredContent"] == {"slept": 3 * PING_S}


def test_an_mcp_body_over_the_cap_gets_the_apis_413(url: str) -> None:
    """``/mcp`` POSTs skip Starlette's router; the body cap still answers as for the API,
    whether the client declared the length or streams the body."""
    big = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "x": "' + b"x" * (4 << 20) + b'"}'
    with httpx.Client(timeout=30) as client:
        declared = client.post(url, content=big, headers=MODERN)
        streamed = client.post(url, content=iter([big[:1000], big[1000:]]), headers=MODERN)
    for answer in (declared, streamed):
        assert answer.status_code == 413
        assert answer.json()["error"]["code"] == "body_too_large"
