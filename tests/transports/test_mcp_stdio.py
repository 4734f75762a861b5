"""``ctxactors serve`` over stdio, driven by the official MCP SDK client as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError
from mcp_support import (
    SERVE,
    Gate,
    host_meta,
    open_fifo_writer,
    pid_alive,
    release_fifo,
    schema_keys,
    serve_env,
    spawn_sleeper,
    stdio_params,
)

from ctxactors import Runtime
from ctxactors.servers import BUILTIN
from ctxactors.testing import wait_until

pytestmark = pytest.mark.timeout(50)


def run(coro_fn: Any) -> Any:
    return anyio.run(coro_fn)


def goals(result: Any) -> set[str]:
    return {g["goal"] for g in result.structured_content["goals"]}


def test_list_tools_publishes_the_runtime_list_with_clean_schemas() -> None:
    async def main() -> list[Any]:
        async with Client(stdio_params()) as client:
            return (await client.list_tools()).tools

    tools = run(main)
    from mcp_support import Gate

    with Runtime([*BUILTIN, Gate]) as rt:
        expected = rt.list_tools()
    assert [t.name for t in tools] == [t["name"] for t in expected]
    for tool, want in zip(tools, expected, strict=True):
        assert tool.input_schema == want["inputSchema"]
        assert tool.description == want["description"]
        keys = set(schema_keys(tool.input_schema))
        assert not any(k.startswith("__") or k in ("sessionId", "session_id") for k in keys)
    create_goal = next(t for t in tools if t.name == "create_goal")
    assert create_goal.annotations is not None and create_goal.annotations.read_only_hint is False


def test_unified_tools_lists_batch_tools_and_still_calls_the_rest() -> None:
    async def main() -> tuple[set[str], Any]:
        async with Client(stdio_params("--tools", "unified")) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            created = await client.call_tool("create_goal", {"goal": "u", "__sessionId": "u"})
            return names, created

    names, created = run(main)
    assert "batch" in names and "create_goal" not in names
    assert created.structured_content == {"id": "g1", "goal": "u"}


def test_bad_server_spec_is_a_clear_error() -> None:
    done = subprocess.run(
        [*SERVE[:-2], "--server", "mcp_support:Nope"],
        env=serve_env(),
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    assert done.returncode != 0
    assert b"mcp_support:Nope" in done.stderr and done.stdout == b""


def test_sessions_see_only_their_own_goals_under_concurrent_calls() -> None:
    async def main() -> dict[str, set[str]]:
        async with Client(stdio_params()) as client:

            async def create(session: str, i: int) -> None:
                args = {"goal": f"{session}-{i}", "__sessionId": session}
                result = await client.call_tool("create_goal", args)
                assert not result.is_error, result.content

            await asyncio.gather(*(create(s, i) for i in range(20) for s in ("s1", "s2")))
            seen = {}
            for session in ("s1", "s2", "default"):
                state = await client.call_tool("get_planning_state", {"__sessionId": session})
                seen[session] = goals(state)
            return seen

    seen = run(main)
    assert seen["s1"] == {f"s1-{i}" for i in range(20)}
    assert seen["s2"] == {f"s2-{i}" for i in range(20)}
    assert seen["default"] == set()


def test_meta_routes_and_wins_over_arguments_which_route_without_it() -> None:
    async def main() -> dict[str, set[str]]:
        async with Client(stdio_params()) as client:
            meta = host_meta(session="m1", assistant="a1")
            await client.call_tool("create_goal", {"goal": "via meta"}, meta=meta)
            # Beside a _meta context, every __* argument is dropped: it lands in (m1, a1).
            await client.call_tool(
                "create_goal", {"goal": "spoof", "__sessionId": "m2", "__threadId": "t"}, meta=meta
            )
            args = {"__sessionId": "m3", "__assistantId": "a1"}
            await client.call_tool("create_goal", {"goal": "via args", **args})

            async def state(arguments: dict[str, Any], **kw: Any) -> set[str]:
                return goals(await client.call_tool("get_planning_state", arguments, **kw))

            return {
                "m1": await state({}, meta=meta),
                "m2": await state({"__sessionId": "m2"}),
                "m2-thread": await state({"__sessionId": "m2", "__threadId": "t"}),
                "m3": await state(args),
                "default": await state({}),
            }

    seen = run(main)
    assert seen == {
        "m1": {"via meta", "spoof"},
        "m2": set(),
        "m2-thread": set(),
        "m3": {"via args"},
        "default": set(),
    }


def test_invalid_arguments_and_unknown_tool() -> None:
    async def main() -> tuple[Any, MCPError, Any]:
        async with Client(stdio_params()) as client:
            bad = await client.call_tool("create_goal", {"goal": 5, "__sessionId": "s"})
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("no_such_tool", {})
            refused = await client.call_tool("mark_todo", {"todo_id": "t9", "__sessionId": "s"})
            still = await client.call_tool("create_goal", {"goal": "ok", "__sessionId": "s"})
            assert not still.is_error
            return bad, unknown.value, refused

    bad, unknown, refused = run(main)
    assert bad.is_error
    assert "Expected `str`, got `int`" in bad.content[0].text and "$.goal" in bad.content[0].text
    assert unknown.code == -32602 and "no_such_tool" in unknown.message
    assert refused.is_error and "t9" in refused.content[0].text


def test_calls_on_one_connection_run_concurrently() -> None:
    """wait_gate only reports opened if open_gate ran while it was still waiting."""

    async def main() -> tuple[Any, Any]:
        async with Client(stdio_params()) as client:
            waiting = asyncio.ensure_future(
                client.call_tool("wait_gate", {"gate": "stdio-g", "__sessionId": "w"})
            )
            await asyncio.sleep(0.2)
            opened = await client.call_tool("open_gate", {"gate": "stdio-g", "__sessionId": "o"})
            return await waiting, opened

    waited, opened = run(main)
    assert opened.structured_content == {"opened": True}
    assert waited.structured_content == {"opened": True}


def test_end_of_stdin_stops_actors_and_kills_their_processes() -> None:
    async def main() -> int:
        async with Client(stdio_params()) as client:
            return await spawn_sleeper(client, "eof")

    pid = run(main)
    # The child runs in its own session, out of reach of the client's group kill.
    assert wait_until(lambda: not pid_alive(pid)), f"workspace process {pid} survived"


def test_sigterm_lets_the_call_in_flight_answer_then_stops(tmp_path: Path) -> None:
    """Deterministic: the call is running (the FIFO has its reader) when SIGTERM comes, the
    server is draining (it refuses a new call) before the call may end, and the answer must
    still reach the client (issue 15: the drain counted a call done before its reply was
    written, then closed the connection)."""
    marker, fifo = tmp_path / "pid", tmp_path / "fifo"
    os.mkfifo(fifo)

    async def main() -> tuple[Any, int, int]:
        async with Client(stdio_params()) as client:
            child = await spawn_sleeper(client, "term")
            await client.call_tool("slow", {"marker": str(marker), "seconds": 0.0})
            server_pid = int(marker.read_text())
            call = asyncio.ensure_future(
                client.call_tool("wait_fifo", {"path": str(fifo), "__sessionId": "t"})
            )
            writer = await asyncio.to_thread(open_fifo_writer, fifo)
            os.kill(server_pid, signal.SIGTERM)
            while True:  # until the drain has begun: new calls are refused
                try:
                    await client.call_tool("list_content", {"__sessionId": "late"})
                except MCPError as refused:
                    assert refused.message == "the server is shutting down; no new calls"
                    assert refused.code == -32014  # RuntimeClosedError's
                    break
            release_fifo(writer, "answered")
            return await call, server_pid, child

    result, server_pid, child = run(main)
    assert not result.is_error and result.structured_content == {"read": "answered"}
    assert wait_until(lambda: not pid_alive(server_pid))
    assert wait_until(lambda: not pid_alive(child)), f"workspace process {child} survived"


def test_a_tools_list_cursor_is_invalid_params() -> None:
    async def main() -> MCPError:
        async with Client(stdio_params()) as client:
            with pytest.raises(MCPError) as refused:
                await client.list_tools(cursor="x" * 500, cache_mode="refresh")
            return refused.value

    refused = run(main)
    assert refused.code == -32602
    assert refused.message == (
        f"invalid cursor {'x' * 100!r}: this server lists every tool in one page and issues "
        "no cursors"
    )


def test_stdout_carries_only_protocol_messages() -> None:
    """Every stdout line is JSON-RPC, even with debug logging and a tool that fails, and
    every request gets its own answer: an empty or cut-short stdout fails."""
    env = serve_env() | {"CTXACTORS_LOG_LEVEL": "debug"}
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"},
        },
    }
    requests = [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "create_goal", "arguments": {"goal": "x"}},
        },
        {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "tools/call",
            "params": {"name": "mark_todo", "arguments": {"todo_id": "nope"}},
        },
    ]
    proc = subprocess.Popen(
        SERVE, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    stdin, stdout, stderr_pipe = proc.stdin, proc.stdout, proc.stderr
    assert stdin is not None and stdout is not None and stderr_pipe is not None
    stderr: list[bytes] = []
    drain = threading.Thread(target=lambda: stderr.append(stderr_pipe.read()))
    drain.start()
    lines: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in stdout])
    reader.start()

    def send(message: dict[str, Any]) -> None:
        stdin.write(json.dumps(message).encode() + b"\n")
        stdin.flush()

    def answer() -> dict[str, Any]:
        message: dict[str, Any] = json.loads(lines.get(timeout=30))
        assert message["jsonrpc"] == "2.0" and "result" in message, message
        return message

    try:
        send(initialize)
        assert answer()["id"] == 1
        for message in requests:
            send(message)
        # The client keeps stdin open until it has its answers, as a real client does.
        answers = {m["id"]: m["result"] for m in (answer(), answer(), answer())}
    finally:
        stdin.close()
        proc.wait(30)
        reader.join(30)
        drain.join(30)
    assert proc.returncode == 0
    assert lines.empty()  # nothing else was written to stdout
    with Runtime([*BUILTIN, Gate]) as rt:
        expected_tools = [t["name"] for t in rt.list_tools()]
    assert sorted(answers) == [2, 3, 4]
    assert [t["name"] for t in answers[2]["tools"]] == expected_tools
    assert answers[3]["isError"] is False
    assert answers[3]["structuredContent"] == {"id": "g1", "goal": "x"}
    assert answers[4]["isError"] is True
    assert answers[4]["content"][0]["text"] == "todo 'nope' not found"
    assert b"tool_call" in stderr[0]  # the logs went to stderr
