"""A hostile tenant against ``/mcp``'s JSON fast path and its late streams
(`ctxactors.transports.late_stream`): a real ``ctxactors serve --transport http`` with bearer
tokens, raw sockets for what no polite client does.

A call whose client has left still runs in its key's actor to the end (its state is
saved), but the request that carried it is let go at once: its body, the SDK's request and
a late stream's pings. Otherwise a tenant posting big calls to a busy key and hanging up
holds their memory for up to the call timeout each, however few connections it keeps open.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_support import http_server
from served_support import no_traceback

from ctxactors.testing import wait_until

pytestmark = pytest.mark.timeout(120)

ALICE = "alice-" + secrets.token_urlsafe(24)
BOB = "bob-" + secrets.token_urlsafe(24)
MODERN = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "Mcp-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call",
}
MiB = 1 << 20


@pytest.fixture
def tokens(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    path.write_text(f"{ALICE} alice\n{BOB} bob\n")
    return str(path)


@contextlib.contextmanager
def server(tokens: str, tmp_path: Path, **env: str) -> Iterator[tuple[str, int]]:
    """The served ``/mcp`` URL and the server's pid; no traceback in its log afterwards."""
    log = tmp_path / "stderr"
    with (
        log.open("ab") as err,
        http_server("--auth-tokens", tokens, env=env, stderr=err) as (
            url,
            proc,
        ),
    ):
        yield url, proc.pid
    no_traceback(log.read_text())


def call(tool: str, arguments: dict[str, Any], request_id: int = 1, junk: int = 0) -> bytes:
    """A 2026-07-28 ``tools/call``; `junk` bytes of padding in its ``_meta`` (any key the
    runtime doesn't read: the body cap, not the schema, bounds it)."""
    meta: dict[str, Any] = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "attacker", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    if junk:
        meta["padding"] = "x" * junk
    message = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta},
    }
    return json.dumps(message).encode()


def post_and_hang_up(
    url: str, body: bytes, token: str, *, wait_for: bytes = b"", **headers: str
) -> None:
    """Send a whole POST, then close the connection once the answer's bytes so far hold
    `wait_for` (at once without it)."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    fields = {
        **MODERN,
        **headers,
        "Host": f"127.0.0.1:{port}",
        "Authorization": f"Bearer {token}",
        "Content-Length": str(len(body)),
    }
    head = "POST /mcp HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(head.encode() + b"\r\n" + body)
        conn.settimeout(30)
        seen = b""
        while wait_for not in seen:
            chunk = conn.recv(65536)
            assert chunk, f"the server closed the connection after {seen!r}"
            seen += chunk


def rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) >> 10
    raise AssertionError(f"no VmRSS for pid {pid}")


def post(url: str, tool: str, arguments: dict[str, Any], token: str) -> httpx.Response:
    headers = {**MODERN, "Mcp-Name": tool, "Authorization": f"Bearer {token}"}
    return httpx.post(url, content=call(tool, arguments), headers=headers, timeout=60)


@pytest.mark.parametrize("accept", ["application/json, text/event-stream", "application/json"])
def test_calls_abandoned_behind_a_busy_key_hold_no_memory(
    tokens: str, tmp_path: Path, accept: str
) -> None:
    """40 calls of 2 MiB each queued behind a key that is busy for a minute, each client
    gone right after sending: the server's memory comes back to where it was (within
    64 MiB), long before the 30 s call timeout would have let the requests go. Before, the
    requests waited for their calls, holding ~4x their body each: +300 MiB here, and a
    tenant sending faster than the call timeout has no bound at all (its connections don't
    count once closed). Whether the client could have taken a late stream or not."""
    calls, size = 40, 2 * MiB
    with server(tokens, tmp_path) as (url, pid):
        assert post(url, "create_goal", {"goal": "warm", "__sessionId": "w"}, ALICE).is_success
        before = rss_mib(pid)
        busy = {"gate": "never", "timeout": 60, "__sessionId": "busy"}
        for n in range(calls):
            body = call("wait_gate", busy, request_id=n, junk=size)
            post_and_hang_up(url, body, ALICE, Accept=accept, **{"Mcp-Name": "wait_gate"})
        wait_until(
            lambda: rss_mib(pid) - before <= 64,
            timeout=20,
            describe=lambda: f"RSS {rss_mib(pid)} MiB, {before} MiB before the calls",
        )
        # The other tenant is served meanwhile, and the abandoned calls still ran (the
        # key finishes them once the gate opens: its next call answers).
        assert post(url, "create_goal", {"goal": "b", "__sessionId": "b"}, BOB).is_success
        assert post(url, "open_gate", {"gate": "never", "__sessionId": "o"}, BOB).is_success
        after = post(url, "open_gate", {"gate": "never", "__sessionId": "busy"}, ALICE)
        assert after.json()["result"]["structuredContent"] == {"opened": True}


def test_a_late_stream_whose_client_left_stops_and_lets_go(tokens: str, tmp_path: Path) -> None:
    """The same, with each client gone only once its call became a stream (its first
    ping read): the streams stop pinging and their requests are let go."""
    calls, size = 40, 2 * MiB
    with server(tokens, tmp_path, CTXACTORS_HTTP_PING_INTERVAL="0.2") as (url, pid):
        assert post(url, "create_goal", {"goal": "warm", "__sessionId": "w"}, ALICE).is_success
        before = rss_mib(pid)
        busy = {"gate": "streamed", "timeout": 60, "__sessionId": "busy"}
        for n in range(calls):
            body = call("wait_gate", busy, request_id=n, junk=size)
            post_and_hang_up(
                url, body, ALICE, wait_for=b": ping\r\n\r\n", **{"Mcp-Name": "wait_gate"}
            )
        wait_until(
            lambda: rss_mib(pid) - before <= 64,
            timeout=20,
            describe=lambda: f"RSS {rss_mib(pid)} MiB, {before} MiB before the calls",
        )
        assert post(url, "open_gate", {"gate": "streamed", "__sessionId": "o"}, BOB).is_success
        after = post(url, "open_gate", {"gate": "streamed", "__sessionId": "busy"}, ALICE)
        assert after.json()["result"]["structuredContent"] == {"opened": True}
