"""Ownership over MCP (streamable HTTP, official SDK client): what one assistant or thread
does stays out of another's playbooks and history, and a caller without an assistant sees
only what no assistant owns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_support import host_meta, http_server

pytestmark = pytest.mark.timeout(50)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with http_server() as (address, _proc):
        yield address


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    value: dict[str, Any] = result.structured_content
    return value


def test_history_and_playbooks_answer_only_with_what_the_caller_could_see(url: str) -> None:
    a_t1 = host_meta(session="own", assistant="A", thread="t1")
    a_t2 = host_meta(session="own", assistant="A", thread="t2")
    b_t1 = host_meta(session="own", assistant="B", thread="t1")
    nobody = host_meta(session="own")

    async def main() -> dict[str, Any]:
        async with Client(url) as client:

            async def call(tool: str, args: dict[str, Any], meta: Any) -> dict[str, Any]:
                return structured(await client.call_tool(tool, args, meta=meta))

            await call("create_playbook", {"name": "secret", "steps": ["rotate key"]}, a_t1)
            await call("create_goal", {"goal": "t1 only"}, a_t1)
            await call("create_playbook", {"name": "open", "steps": ["hello"]}, nobody)
            big = await client.call_tool(
                "create_playbook", {"name": "big", "steps": ["x" * 2_000_000]}, meta=a_t1
            )
            return {
                "big": (big.is_error, big.content[0].text),
                "b_history": await call("get_recent_context", {"limit": 50}, b_t1),
                "b_playbooks": await call("list_playbooks", {}, b_t1),
                "t2_history": await call("get_recent_context", {"limit": 50}, a_t2),
                "a_history": await call("get_recent_context", {"limit": 50}, a_t1),
                "nobody_playbooks": await call("list_playbooks", {}, nobody),
                "nobody_history": await call("get_recent_context", {"limit": 50}, nobody),
            }

    seen = anyio.run(main)
    assert seen["big"] == (
        True,
        "step 1 is 2,000,000 bytes of UTF-8: the limit is 65,536 (CTXACTORS_MAX_TEXT_BYTES)",
    )
    names = {
        key: [
            op["arguments"]["name"] if op["tool"] == "create_playbook" else op["tool"]
            for op in seen[key]["operations"]
        ]
        for key in ("b_history", "t2_history", "a_history", "nobody_history")
    }
    # B sees the session's own call (made without an assistant), none of A's.
    assert names["b_history"] == ["open"]
    assert seen["b_playbooks"] == {"playbooks": []}
    # Playbooks are the session's (per assistant): A sees its own from t2, not t1's goal.
    assert names["t2_history"] == ["big", "open", "secret"]
    assert names["a_history"] == ["big", "open", "create_goal", "secret"]
    assert seen["a_history"]["operations"][3]["arguments"]["steps"] == ["rotate key"]
    assert [p["name"] for p in seen["nobody_playbooks"]["playbooks"]] == ["open"]
    assert names["nobody_history"] == ["list_playbooks", "open"]
