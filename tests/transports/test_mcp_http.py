"""``ctxactors serve --transport http`` on a loopback port, driven by the official SDK client."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, MCPError
from mcp_support import (
    SERVE,
    host_meta,
    http_server,
    open_fifo_writer,
    pid_alive,
    release_fifo,
    schema_keys,
    serve_env,
    spawn_sleeper,
)
from test_conversation_models import Stub

from ctxactors import Runtime
from ctxactors.servers import Planning
from ctxactors.testing import wait_until
from ctxactors.transports.mcp import McpFrontend

pytestmark = pytest.mark.timeout(50)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with http_server() as (address, _proc):
        yield address


def run(coro_fn: Any) -> Any:
    return anyio.run(coro_fn)


def goals(result: Any) -> set[str]:
    assert not result.is_error, result.content
    return {g["goal"] for g in result.structured_content["goals"]}


def test_mcp_path_is_served_without_redirect(url: str) -> None:
    response = httpx.post(url, json={}, headers={"Accept": "application/json, text/event-stream"})
    # A Mount would answer 307 to /mcp/; the SDK answers a bad body with 400.
    assert response.status_code == 400, response.text


def test_foreign_host_header_is_refused(url: str) -> None:
    """Bound to loopback, /mcp checks Host (DNS-rebinding protection)."""
    response = httpx.post(
        url,
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"Host": "evil.example", "Accept": "application/json, text/event-stream"},
    )
    assert response.status_code in (403, 421), response.status_code


def test_list_tools_has_no_reserved_field(url: str) -> None:
    async def main() -> list[Any]:
        async with Client(url) as client:
            return (await client.list_tools()).tools

    tools = run(main)
    names = {t.name for t in tools}
    assert {"create_goal", "get_planning_state", "batch", "wait_gate"} <= names
    for tool in tools:
        keys = set(schema_keys(tool.input_schema))
        assert not any(k.startswith("__") or k in ("sessionId", "session_id") for k in keys)


def test_stateful_http_sessions_are_isolated_by_mcp_session_id(url: str) -> None:
    """Two clients, no context given: each Mcp-Session-Id is its own conversation."""

    async def conversation(tag: str) -> set[str]:
        async with Client(url, mode="legacy") as client:
            await asyncio.gather(
                *(client.call_tool("create_goal", {"goal": f"{tag}-{i}"}) for i in range(10))
            )
            return goals(await client.call_tool("get_planning_state", {}))

    tags = [f"c{n}" for n in range(6)]

    async def main() -> list[set[str]]:
        return list(await asyncio.gather(*(conversation(tag) for tag in tags)))

    for tag, seen in zip(tags, run(main), strict=True):
        assert seen == {f"{tag}-{i}" for i in range(10)}


def test_meta_and_arguments_win_over_the_http_session_and_meta_over_arguments(url: str) -> None:
    """Two HTTP sessions that name the same ctxactors session share it. _meta decides the
    whole context when it carries any: a ``__sessionId`` argument beside it is dropped."""
    meta = host_meta(session="shared-http")

    async def main() -> tuple[set[str], ...]:
        async with Client(url, mode="legacy") as first:
            await first.call_tool("create_goal", {"goal": "from first"}, meta=meta)
            await first.call_tool("create_goal", {"goal": "by argument", "__sessionId": "arg-http"})
            await first.call_tool(
                "create_goal", {"goal": "spoof dropped", "__sessionId": "spoof-http"}, meta=meta
            )
            own = goals(await first.call_tool("get_planning_state", {}))
        async with Client(url, mode="legacy") as second:
            shared = goals(await second.call_tool("get_planning_state", {}, meta=meta))
            by_arg = goals(
                await second.call_tool("get_planning_state", {"__sessionId": "arg-http"})
            )
            spoof = goals(
                await second.call_tool("get_planning_state", {"__sessionId": "spoof-http"})
            )
        return own, shared, by_arg, spoof

    own, shared, by_arg, spoof = run(main)
    assert own == set()  # the first client's own Mcp-Session-Id conversation stayed empty
    assert shared == {"from first", "spoof dropped"}
    assert by_arg == {"by argument"}
    assert spoof == set()


def test_modern_protocol_client_routes_by_meta(url: str) -> None:
    """The SDK's default (auto) mode; with no HTTP session, _meta still routes."""
    meta = host_meta(session="modern")

    async def main() -> set[str]:
        async with Client(url) as client:
            await client.call_tool("create_goal", {"goal": "m"}, meta=meta)
            return goals(await client.call_tool("get_planning_state", {}, meta=meta))

    assert run(main) == {"m"}


def test_the_sdk_gets_tool_schemas_without_listing_every_tool_per_call() -> None:
    # The SDK checks each tools/call's Mcp-Param headers against the tool's schema; without
    # this lookup it re-runs and serializes the whole tools/list on every call.
    with Runtime([Planning]) as rt:
        lookup = McpFrontend(rt).server.get_tool_input_schema
        assert lookup is not None
        listed = {t["name"]: t["inputSchema"] for t in rt.list_tools()}
        assert {name: lookup(name) for name in listed} == listed
        assert lookup("no_such_tool") is None


def test_invalid_arguments_and_unknown_tool(url: str) -> None:
    async def main() -> tuple[Any, MCPError]:
        async with Client(url, mode="legacy") as client:
            bad = await client.call_tool("add_todo", {"name": ""})
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("no_such_tool", {})
            return bad, unknown.value

    bad, unknown = run(main)
    assert bad.is_error and "$.name" in bad.content[0].text
    assert unknown.code == -32602 and "no_such_tool" in unknown.message


def test_calls_on_one_connection_run_concurrently(url: str) -> None:
    async def main() -> Any:
        async with Client(url, mode="legacy") as client:
            waiting = asyncio.ensure_future(
                client.call_tool("wait_gate", {"gate": "http-g", "__sessionId": "w"})
            )
            await asyncio.sleep(0.2)
            await client.call_tool("open_gate", {"gate": "http-g", "__sessionId": "o"})
            return await waiting

    assert run(main).structured_content == {"opened": True}


def test_sigterm_lets_the_call_in_flight_answer(tmp_path: Path) -> None:
    """The call is running when SIGTERM comes and may end only once the server refuses new
    calls (it is draining); its answer still arrives."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with http_server() as (address, proc):

        async def main() -> Any:
            async with Client(address, mode="legacy") as client:
                # As hosts do (the client also re-lists to check results against schemas).
                await client.list_tools()
                child = await spawn_sleeper(client, "term-http")
                call = asyncio.ensure_future(client.call_tool("wait_fifo", {"path": str(fifo)}))
                writer = await asyncio.to_thread(open_fifo_writer, fifo)
                proc.send_signal(signal.SIGTERM)
                while True:  # until the drain has begun
                    try:
                        await client.call_tool("list_content", {})
                    except MCPError as refused:
                        assert refused.message == "the server is shutting down; no new calls"
                        assert refused.code == -32014  # RuntimeClosedError's
                        break
                release_fifo(writer, "answered")
                return await call, child

        result, child = run(main)
        assert result.structured_content == {"read": "answered"}
        assert proc.wait(20) == 0
        assert wait_until(lambda: not pid_alive(child)), f"workspace process {child} survived"


def test_rest_api_and_mcp_share_one_runtime(url: str) -> None:
    """One app serves both, over the same runtime."""

    async def main() -> None:
        async with Client(url, mode="legacy") as client:
            await client.call_tool(
                "create_goal", {"goal": "seen by REST"}, meta=host_meta(session="both")
            )

    run(main)
    base = url.removesuffix("/mcp")
    response = httpx.post(
        f"{base}/api/v1/tools/get_planning_state", json={}, headers={"X-Session-Id": "both"}
    )
    assert response.status_code == 200, response.text
    assert "seen by REST" in response.text


def test_query_asks_the_model_given_on_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--model-url``/``--model`` (key from the environment) make /api/v1/query answer."""
    model_server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=model_server.serve_forever, daemon=True).start()
    monkeypatch.setenv("CTXACTORS_MODEL_API_KEY", "sk-test")
    model_url = f"http://127.0.0.1:{model_server.server_address[1]}/v1"
    try:
        with http_server("--model-url", model_url, "--model", "stub") as (url, _proc):
            base = url.removesuffix("/mcp")
            response = httpx.post(
                f"{base}/api/v1/query",
                json={"query": "Ship it", "session_id": "q1"},
                headers={"X-Assistant-Id": "a1"},
                timeout=20,
            )
            assert response.status_code == 200, response.text
            assert response.json()["session_id"] == "q1"
            assert "Ship it" in response.json()["answer"]
            state = httpx.post(
                f"{base}/api/v1/tools/get_planning_state",
                json={},
                headers={"X-Session-Id": "q1", "X-Assistant-Id": "a1"},
            )
            assert [g["goal"] for g in state.json()["structuredContent"]["goals"]] == ["Ship it"]
    finally:
        model_server.shutdown()
        model_server.server_close()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--transport", "http", "--model", "m"], "--model-url and --model go together"),
        (["--model-url", "http://x/v1", "--model", "m"], "only --transport http serves"),
    ],
)
def test_model_options_are_checked_before_anything_starts(extra: list[str], message: str) -> None:
    proc = subprocess.run(
        [*SERVE, *extra], env=serve_env(), capture_output=True, text=True, timeout=30
    )
    assert proc.returncode != 0 and message in proc.stderr


def rest(url: str, tool: str, session: str, body: Any = None) -> httpx.Response:
    """A REST call on the server of `url`, with the session id as UTF-8 header bytes."""
    return httpx.post(
        f"{url.removesuffix('/mcp')}/api/v1/tools/{tool}",
        json=body or {},
        headers=[(b"X-Session-Id", session.encode())],
    )


def test_a_non_ascii_session_id_is_one_session_over_rest_and_mcp(url: str) -> None:
    written = rest(url, "create_goal", "café", {"goal": "from REST"})
    assert written.status_code == 200 and written.json()["session_id"] == "café"

    async def main() -> tuple[set[str], set[str]]:
        async with Client(url, mode="legacy") as client:
            seen = goals(
                await client.call_tool("get_planning_state", {}, meta=host_meta(session="café"))
            )
            await client.call_tool(
                "create_goal", {"goal": "from MCP"}, meta=host_meta(session="naïve-Ω")
            )
            latin = goals(
                await client.call_tool("get_planning_state", {}, meta=host_meta(session="cafÃ©"))
            )
            return seen, latin

    seen, latin = run(main)
    assert seen == {"from REST"}
    assert latin == set()  # the latin-1 reading of the header bytes is another session
    back = rest(url, "get_planning_state", "naïve-Ω").json()
    assert back["session_id"] == "naïve-Ω"
    assert [g["goal"] for g in back["structuredContent"]["goals"]] == ["from MCP"]


def test_a_tools_list_cursor_is_invalid_params(url: str) -> None:
    async def main() -> MCPError:
        async with Client(url, mode="legacy") as client:
            with pytest.raises(MCPError) as refused:
                await client.list_tools(cursor="page-2", cache_mode="refresh")
            assert (await client.list_tools(cache_mode="refresh")).next_cursor is None
            return refused.value

    refused = run(main)
    assert refused.code == -32602
    assert refused.message == (
        "invalid cursor 'page-2': this server lists every tool in one page and issues no cursors"
    )


def test_deleting_an_mcp_session_ends_its_state() -> None:
    with http_server("--server", "mcp_support:Whoami") as (url, _proc):
        deleting_an_mcp_session_ends_its_state(url)


def deleting_an_mcp_session_ends_its_state(url: str) -> None:
    async def main() -> str:
        async with Client(url, mode="legacy") as client:
            whoami = await client.call_tool("whoami", {})
            session: str = whoami.structured_content["session"]
            await client.call_tool("create_goal", {"goal": "until DELETE"})
            kept = await client.call_tool(
                "create_goal", {"goal": "elsewhere"}, meta=host_meta(session="beside-delete")
            )
            assert not kept.is_error
            state = rest(url, "get_planning_state", session).json()["structuredContent"]
            assert state["goals"] == [{"id": "g1", "goal": "until DELETE"}]
            return session  # leaving the block sends the client's DELETE

    session = run(main)
    base = url.removesuffix("/mcp")
    gone = httpx.get(f"{base}/api/v1/sessions/{session}/context")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "unknown_session"
    assert rest(url, "get_planning_state", session).json()["structuredContent"]["goals"] == []
    # Only that session: another one its client named in _meta stays.
    other = rest(url, "get_planning_state", "beside-delete").json()["structuredContent"]
    assert other["goals"] == [{"id": "g1", "goal": "elsewhere"}]


def test_a_delete_the_sdk_refuses_ends_nothing(url: str) -> None:
    """DELETE /mcp naming a ctxactors session that is no MCP session of this server is a
    404 from the SDK, and that session's state stays."""
    assert rest(url, "create_goal", "not-an-mcp-session", {"goal": "stays"}).status_code == 200
    refused = httpx.delete(
        url,
        headers={
            "Mcp-Session-Id": "not-an-mcp-session",
            "Accept": "application/json, text/event-stream",
        },
    )
    assert refused.status_code == 404
    state = rest(url, "get_planning_state", "not-an-mcp-session").json()["structuredContent"]
    assert state["goals"] == [{"id": "g1", "goal": "stays"}]


def test_sigterm_lets_a_rest_call_in_flight_answer(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with http_server() as (address, proc):
        answer: dict[str, Any] = {}

        def call() -> None:
            answer["response"] = httpx.post(
                f"{address.removesuffix('/mcp')}/api/v1/tools/wait_fifo",
                json={"path": str(fifo)},
                headers={"X-Session-Id": "rest-drain"},
                timeout=40,
            )

        caller = threading.Thread(target=call)
        caller.start()
        writer = open_fifo_writer(fifo)  # the REST call is running
        proc.send_signal(signal.SIGTERM)

        def refusing() -> bool:  # draining: new calls get a 503 in the API's shape
            try:
                r = rest(address, "list_content", "late")
            except httpx.TransportError:
                return False
            return r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"

        assert wait_until(refusing)
        release_fifo(writer, "answered")
        caller.join(40)
        response = answer["response"]
        assert response.status_code == 200, response.text
        assert response.json()["structuredContent"] == {"read": "answered"}
        assert proc.wait(20) == 0
