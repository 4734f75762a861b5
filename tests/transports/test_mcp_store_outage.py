"""A store outage that reaches MCP as an error (a Ray front end's shard layout in Redis, say)
tells the client what happened, never where the store is: the server's log keeps that."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from structlog.testing import capture_logs

from ctxactors import Runtime
from ctxactors.errors import StoreUnavailableError
from ctxactors.servers import Planning
from ctxactors.transports.mcp import McpFrontend

DETAIL = "the shard layout's Redis: Error 111 connecting to 10.0.0.5:6379. Connection refused."


def test_a_store_outage_is_an_mcp_error_that_names_no_address() -> None:
    with Runtime([Planning]) as runtime:

        async def down(*args: Any, **kwargs: Any) -> Any:
            raise StoreUnavailableError(DETAIL)

        runtime.acall = down  # type: ignore[method-assign]
        frontend = McpFrontend(runtime)
        params = types.CallToolRequestParams(name="create_goal", arguments={"goal": "g"})
        with capture_logs() as logs, pytest.raises(MCPError) as refused:
            anyio.run(frontend._call_tool, SimpleNamespace(request=None), params)
    assert (refused.value.code, refused.value.message) == (
        StoreUnavailableError.code,
        "the state store is unavailable; retry later",
    )
    [logged] = [line for line in logs if line["event"] == "store_unavailable"]
    assert (logged["tool"], logged["error"]) == ("create_goal", DETAIL)
