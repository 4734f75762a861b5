"""`McpFrontend` in process, through the official SDK client: the wire form it hands the SDK
(a plain dict, not a model) must be what the typed results gave, in every protocol mode."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.server._otel import OpenTelemetryMiddleware

from ctxactors import Runtime
from ctxactors.servers import Planning, Playbooks
from ctxactors.tracing import provider_installed
from ctxactors.transports.mcp import McpFrontend

MODES = ["legacy", "2026-07-28"]  # the handshake era and the stateless one


@pytest.fixture
def frontend() -> Any:
    with Runtime([Planning, Playbooks]) as rt:
        yield McpFrontend(rt)


def call(frontend: McpFrontend, mode: str, name: str, arguments: dict[str, Any]) -> Any:
    async def main() -> Any:
        async with Client(frontend.server, mode=mode) as client:
            return await client.call_tool(name, {**arguments, "__sessionId": f"s-{mode}"})

    return anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_result_reaches_the_client_as_the_typed_result_would(
    frontend: McpFrontend, mode: str
) -> None:
    result = call(frontend, mode, "create_goal", {"goal": "ship"})
    # (a stateless-era result also carries the SDK's serverInfo stamp in _meta)
    assert result.model_copy(update={"meta": None}) == types.CallToolResult(
        content=[types.TextContent(type="text", text='{"id":"g1","goal":"ship"}')],
        structured_content={"id": "g1", "goal": "ship"},
        is_error=False,
    )


@pytest.mark.parametrize("mode", MODES)
def test_an_error_result_without_structured_content_reaches_the_client(
    frontend: McpFrontend, mode: str
) -> None:
    bad = call(frontend, mode, "add_todo", {"name": ""})
    assert bad.is_error and bad.structured_content is None
    assert "$.name" in bad.content[0].text
    missing = call(frontend, mode, "select_playbook", {"id": "nope"})
    assert missing.is_error and missing.content[0].text == "playbook 'nope' not found"


@pytest.mark.parametrize("mode", MODES)
def test_the_listing_is_the_runtimes_every_time(frontend: McpFrontend, mode: str) -> None:
    async def main() -> list[list[dict[str, Any]]]:
        listings = []
        for _ in range(2):  # the pre-serialised listing is not changed by being served
            async with Client(frontend.server, mode=mode) as client:
                listed = await client.list_tools()
            listings.append([t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools])
        return listings

    first, second = anyio.run(main)
    expected = frontend.runtime.list_tools()
    assert first == second
    assert [(t["name"], t["inputSchema"], t["description"]) for t in first] == [
        (t["name"], t["inputSchema"], t["description"]) for t in expected
    ]


def test_without_a_tracer_provider_the_sdk_opens_no_span_per_request(
    frontend: McpFrontend,
) -> None:
    # Nothing would record the span; with a provider (``serve --tracing``) it stays, and
    # test_tracing shows the tool's span as its child.
    assert not provider_installed()
    assert not any(isinstance(m, OpenTelemetryMiddleware) for m in frontend.server.middleware)
