"""langchain-mcp-adapters against `ctxactors serve`, run by `.venv-mcp1/bin/python`.

The adapter needs ``mcp<2`` and `serve` ``mcp>=2.3``, so the test starts `serve` from the
main environment and this script, from the second, drives it: the adapter's tools with
`ctxactors.integrations.langchain.interceptor()`, one LangGraph agent (a scripted fake
model), three conversations at once, and a call with no conversation. Argument: the
adapter's connection as JSON. Prints a JSON report for the test to check.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from langchain_core.tools import BaseTool
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools
from langchain_support import CONVERSATIONS, agent, planning_state, tool_messages, transcript

from ctxactors.integrations.langchain import interceptor


async def run(tools: list[BaseTool]) -> dict[str, Any]:
    graph = agent(tools)
    ends = await asyncio.gather(*(graph.ainvoke(c.script, config=c.config) for c in CONVERSATIONS))
    after = [await planning_state(tools, c.config) for c in CONVERSATIONS]
    try:
        await planning_state(tools, {})  # no conversation
        refused = None
    except Exception as exc:
        refused = f"{type(exc).__name__}: {exc}"
    return {
        "transcripts": [transcript(tool_messages(end)) for end in ends],
        "after": after,
        "refused": refused,
    }


async def main(connection: dict[str, Any]) -> dict[str, Any]:
    client = MultiServerMCPClient({"ctxactors": connection}, tool_interceptors=[interceptor()])
    if connection["transport"] != "stdio":
        return await run(await client.get_tools())  # a new MCP session per call
    # Over stdio a new session would be a new server (and --store memory a new state): one
    # session serves every call.
    async with client.session("ctxactors") as session:
        tools = await load_mcp_tools(session, tool_interceptors=client.tool_interceptors)
        return await run(tools)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
