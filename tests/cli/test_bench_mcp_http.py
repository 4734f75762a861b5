"""scripts/bench_mcp_http.py's raw client: the SDK client's own request, every answer checked.

Real servers (`ctxactors serve --store memory` and the SDK peer, as the bench starts them) and
the real SDK client, whose bytes are recorded by a relay in front of the server.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from mcp import Client

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_mcp_http.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_mcp_http", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def requests_in(stream: bytes) -> list[tuple[dict[str, str], bytes]]:
    """The HTTP/1.1 requests (headers by lower-case name, body) one after another in `stream`."""
    found = []
    while stream:
        head, _, stream = stream.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {
            n.strip().lower(): v.strip() for n, _, v in (x.partition(":") for x in lines[1:])
        }
        length = int(headers["content-length"])
        found.append((headers, stream[:length]))
        stream = stream[length:]
    return found


async def sdk_requests(url: str, arguments: dict[str, str]) -> list[tuple[dict[str, str], bytes]]:
    """What the SDK client sends for two create_goal calls, through a relay recording it."""
    target = httpx.URL(url)
    sent: list[bytes] = []

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(target.host, target.port)

        async def pipe(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, log: list[bytes] | None
        ) -> None:
            while data := await src.read(65536):
                if log is not None:
                    log.append(data)
                dst.write(data)
            dst.close()

        await asyncio.gather(pipe(reader, up_writer, sent), pipe(up_reader, writer, None))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, Client(f"http://127.0.0.1:{port}{target.path}", mode="auto") as client:
        for _ in range(2):
            assert not (await client.call_tool("create_goal", arguments)).is_error
    return requests_in(b"".join(sent))


@pytest.mark.parametrize("kind", ["ctxactors", "peer"])
def test_raw_calls_are_the_sdk_clients_and_every_answer_is_checked(
    bench: ModuleType, kind: str
) -> None:
    key = "session" if kind == "peer" else "__sessionId"
    with bench.serving(kind, set()) as (url, _server):
        recorded = asyncio.run(sdk_requests(url, {"goal": "goal 0", key: "sdk"}))
        calls = [(h, b) for h, b in recorded if h.get("mcp-method") == "tools/call"]
        assert len(calls) == 2
        headers, body = calls[1]
        host = headers["host"].rsplit(":", 1)[0]
        raw = bench.call_request(
            headers["host"], "/mcp", json.loads(body)["id"], {"goal": "goal 0", key: "sdk"}
        )
        [(raw_headers, raw_body)] = requests_in(raw)
        assert host == "127.0.0.1"
        assert raw_body == body  # byte for byte: method, arguments, _meta
        assert {**raw_headers, "user-agent": ""} == {**headers, "user-agent": ""}

        args = argparse.Namespace(client="raw", protocol="stateless")
        elapsed, client_cpu, latencies = asyncio.run(bench.load(url, kind, "a", 3, 4, args))
        assert len(latencies) == 12 and elapsed > 0 and client_cpu > 0
        # The same sessions again: their goals go on from g5, not g1, and the check says so.
        with pytest.raises(RuntimeError, match=f"^{kind}: bad answer to call 0: HTTP/1.1 200"):
            asyncio.run(bench.load(url, kind, "a", 3, 4, args))
        # A call the server refuses (an unknown tool) is an error, never a counted call.
        bad = bench.call_request(
            headers["host"], "/mcp", 1, {"goal": "goal 0", key: "b"}, "no_such"
        )

        async def refused() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", httpx.URL(url).port)
            writer.write(bad)
            status, answer_headers, answer = await bench.read_answer(reader)
            writer.close()
            bench.check_answer(kind, status, answer_headers, answer, 1, 0)

        with pytest.raises(RuntimeError, match="bad answer to call 0"):
            asyncio.run(refused())
