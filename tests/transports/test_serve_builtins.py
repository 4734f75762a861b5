"""``ctxactors serve --builtins LIST|none``: a built-in server left out is neither listed nor
callable, over MCP (HTTP and stdio) and REST alike; history and batch stay (they are part of
every runtime)."""

from __future__ import annotations

import subprocess
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, MCPError
from mcp_support import SERVE, Gate, host_meta, http_server, serve_env, stdio_params

from ctxactors.servers import ALWAYS, Content, Planning

pytestmark = pytest.mark.timeout(90)

ALWAYS_TOOLS = [name for server in ALWAYS for name in server.tools]


def test_only_the_named_builtins_are_listed_and_callable_over_mcp_and_rest() -> None:
    async def session(url: str) -> tuple[list[str], Any, Any, str]:
        async with Client(url) as client:
            listed = [t.name for t in (await client.list_tools()).tools]
            meta = host_meta(session="s1", assistant="a1")
            made = await client.call_tool("create_goal", {"goal": "ship"}, meta=meta)
            recent = await client.call_tool("get_recent_context", {}, meta=meta)
            with pytest.raises(MCPError) as refused:
                await client.call_tool("execute_command", {"command": "id"}, meta=meta)
            return listed, made.structured_content, recent.structured_content, str(refused.value)

    with http_server("--builtins", "planning,content") as (url, _):
        listed, made, recent, refused = anyio.run(session, url)
        base = url.removesuffix("/mcp")
        rest = httpx.post(
            f"{base}/api/v1/tools/list_playbooks", json={}, headers={"X-Session-Id": "s1"}
        )
        rest_listed = [t["name"] for t in httpx.get(f"{base}/api/v1/tools").json()["tools"]]
    assert listed == [*Planning.tools, *Content.tools, *Gate.tools, *ALWAYS_TOOLS]
    assert rest_listed == listed
    assert made == {"id": "g1", "goal": "ship"}
    assert [op["tool"] for op in recent["operations"]] == ["create_goal"]
    assert refused == "unknown tool 'execute_command'"
    assert rest.status_code == 404
    assert rest.json()["error"]["message"] == "unknown tool 'list_playbooks'"


def test_none_serves_only_the_host_servers_and_the_runtime_s_own() -> None:
    async def session() -> tuple[list[str], Any]:
        async with Client(stdio_params("--builtins", "none")) as client:
            listed = [t.name for t in (await client.list_tools()).tools]
            opened = await client.call_tool("open_gate", {"gate": "builtins-none"})
            return listed, opened.structured_content

    listed, opened = anyio.run(session)
    assert listed == [*Gate.tools, *ALWAYS_TOOLS]
    assert opened == {"opened": True}


def test_an_unknown_builtin_is_a_usage_error_naming_the_valid_ones() -> None:
    done = subprocess.run(
        [*SERVE, "--builtins", "planning,shell"],
        env=serve_env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "ctxactors serve: error: argument --builtins: unknown built-in server 'shell': "
        "choose from planning, playbooks, content, workspace (comma-separated), or none "
        "(history, batch, presets are always served)"
    )
