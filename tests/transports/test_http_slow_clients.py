"""HTTP that holds against slow and many clients (`ctxactors.transports.connections`).

A real ``ctxactors serve --transport http`` and raw sockets: an attacker on 127.0.0.2 sends
half requests and stalls, the victim on 127.0.0.1 is an ordinary authenticated client. The
first test runs the server with 1,024 open files, a service manager's usual limit, under
which 1,100 such connections used to leave it answering no one.
"""

from __future__ import annotations

import contextlib
import resource
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mcp_support import http_server
from served_support import INITIALIZE_PARAMS, MCP_HEADERS, no_traceback

from ctxactors.testing import wait_until

pytestmark = pytest.mark.timeout(120)

TOKEN = "victim-" + secrets.token_urlsafe(24)
ATTACKER = "127.0.0.2"
HALF_REQUEST = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
CLOSED = b"<closed>"
WAIT = 30.0  # generous: the machine is shared and loaded


@pytest.fixture
def tokens(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN} victim\n")
    return str(path)


@pytest.fixture
def stderr(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "stderr"
    yield path
    no_traceback(path.read_text())


@contextlib.contextmanager
def server(tokens: str, stderr: Path, **env: str) -> Iterator[str]:
    """The server's base URL; `env` sets its ``CTXACTORS_HTTP_*`` limits."""
    with (
        stderr.open("ab") as err,
        http_server("--auth-tokens", tokens, env=env, stderr=err) as (
            url,
            _proc,
        ),
    ):
        yield url.removesuffix("/mcp")


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def half_open(port: int, source: str = ATTACKER, data: bytes = HALF_REQUEST) -> socket.socket:
    """A connection from `source` that sends `data` (not a whole request) and stalls."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(data)
    sock.setblocking(False)
    return sock


class Watch:
    """What the server sent on each of `socks`, read as it comes, until it closed them."""

    def __init__(self, socks: list[socket.socket]) -> None:
        self.socks = socks
        self.got = [b""] * len(socks)

    def closed(self) -> int:
        """Read what arrived; how many the server has closed (a reset counts)."""
        for i, sock in enumerate(self.socks):
            while not self.got[i].endswith(CLOSED):
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    break
                except ConnectionResetError:
                    chunk = b""
                self.got[i] += chunk or CLOSED
        return sum(g.endswith(CLOSED) for g in self.got)


def victim_calls(base: str, session: str) -> list[str]:
    """An authenticated client's work: two saves and a read, each answered in time."""
    with httpx.Client(base_url=base, timeout=10.0) as client:
        headers = {"Authorization": f"Bearer {TOKEN}", "X-Session-Id": session}
        for goal in ("first", "second"):
            created = client.post("/api/v1/tools/create_goal", json={"goal": goal}, headers=headers)
            assert created.status_code == 200, created.text
        state = client.post("/api/v1/tools/get_planning_state", json={}, headers=headers)
        assert state.status_code == 200, state.text
        return [g["goal"] for g in state.json()["structuredContent"]["goals"]]


def test_1100_half_sent_requests_from_one_address_leave_other_clients_served(
    tokens: str, stderr: Path
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1400:  # this test's own 1,100 sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    per_client = 256  # the default http.max_connections_per_client
    with (
        stderr.open("ab") as err,
        http_server("--auth-tokens", tokens, open_files=1024, stderr=err) as (url, _proc),
    ):
        base = url.removesuffix("/mcp")
        started = time.monotonic()
        attack = Watch([half_open(port_of(base)) for _ in range(1100)])
        assert victim_calls(base, "v1") == ["first", "second"]
        mcp = httpx.post(
            f"{base}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE_PARAMS},
            headers={"Authorization": f"Bearer {TOKEN}", **MCP_HEADERS},
            timeout=10.0,
        )
        assert mcp.status_code == 200, mcp.text

        # Meanwhile the address's first 256 are held; every later one is refused at once.
        wait_until(lambda: attack.closed() == 1100 - per_client, WAIT, describe=attack.closed)
        refused = [g for g in attack.got if g]
        assert {g.split(b"\r\n", 1)[0] for g in refused} <= {
            b"HTTP/1.1 503 Service Unavailable",
            CLOSED,  # a reset can overtake the 503
        }
        assert any(g.startswith(b"HTTP/1.1 503") for g in refused)

        held = Watch([s for s, g in zip(attack.socks, attack.got, strict=True) if not g])
        assert len(held.socks) == per_client
        assert held.closed() == 0 and set(held.got) == {b""}  # the attack held throughout

        # After the header deadline (10 s by default) the server closes each of them.
        wait_until(lambda: held.closed() == per_client, 10 + WAIT, describe=held.closed)
        assert time.monotonic() - started >= 10.0
        assert {g.split(b"\r\n", 1)[0] for g in held.got} == {b"HTTP/1.1 408 Request Timeout"}
        assert {g.rsplit(b"\r\n\r\n", 1)[1] for g in held.got} == {
            b'{"error": {"code": "request_timeout", "message": "the request\'s headers did not '
            b'arrive within 10 s (http.header_timeout)"}}' + CLOSED
        }
        for sock in attack.socks:
            sock.close()

        # The address's places are back: a well-behaved client there is served.
        transport = httpx.HTTPTransport(local_address=ATTACKER)
        with httpx.Client(transport=transport, timeout=10.0) as client:
            headers = {"Authorization": f"Bearer {TOKEN}", "X-Session-Id": "v2"}
            created = client.post(
                f"{base}/api/v1/tools/create_goal", json={"goal": "x"}, headers=headers
            )
            assert created.status_code == 200, created.text


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (within WAIT)."""
    sock.settimeout(WAIT)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_a_request_without_a_token_is_refused_before_its_body_and_loses_its_connection(
    tokens: str, stderr: Path
) -> None:
    with (
        server(tokens, stderr) as base,
        socket.create_connection(("127.0.0.1", port_of(base))) as s,
    ):
        # Headers that announce a megabyte of body, which never comes.
        s.sendall(
            b"POST /api/v1/tools/create_goal HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
        )
        head, _, _body = read_to_close(s).partition(b"\r\n\r\n")
        lines = head.decode().lower().split("\r\n")
        assert lines[0] == "http/1.1 401 unauthorized"
        assert "connection: close" in lines


def test_slow_headers_and_bodies_lose_their_connections_at_their_deadlines(
    tokens: str, stderr: Path
) -> None:
    limits = {"CTXACTORS_HTTP_HEADER_TIMEOUT": "1", "CTXACTORS_HTTP_BODY_TIMEOUT": "2"}
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    with server(tokens, stderr, **limits) as base:
        port = port_of(base)
        # A second request on a kept-alive connection has the same header deadline.
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            first = b""
            while not first.endswith(b"\r\n\r\nok") and b'"ok"' not in first:
                first += s.recv(65536)
            assert first.startswith(b"HTTP/1.1 200 OK\r\n")
            sent = time.monotonic()  # before: the server's deadline starts after it
            s.sendall(b"GET /healthz HTTP/1.1\r\nHo")
            late = read_to_close(s)
            assert time.monotonic() - sent >= 1.0
            assert late.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        # A body that stops half way, over REST and MCP: closed, and nothing ran.
        for path in (b"/api/v1/tools/create_goal", b"/mcp"):
            with socket.create_connection(("127.0.0.1", port)) as s:
                sent = time.monotonic()
                s.sendall(
                    b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
                    + b"X-Session-Id: slow\r\nAccept: application/json, text/event-stream\r\n"
                    + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                    + b'{"goal": "never'
                )  # fmt: skip
                assert read_to_close(s) == b""
                assert time.monotonic() - sent >= 2.0
        state = httpx.post(
            f"{base}/api/v1/tools/get_planning_state",
            json={},
            headers={"Authorization": f"Bearer {TOKEN}", "X-Session-Id": "slow"},
        )
        assert state.json()["structuredContent"]["goals"] == []


def test_the_server_and_each_client_address_hold_at_most_their_caps_of_connections(
    tokens: str, stderr: Path
) -> None:
    caps = {"CTXACTORS_HTTP_MAX_CONNECTIONS": "8", "CTXACTORS_HTTP_MAX_CONNECTIONS_PER_CLIENT": "4"}
    with server(tokens, stderr, **caps) as base:
        port = port_of(base)

        def refusal(source: str) -> bytes:
            with socket.socket() as s:
                s.bind((source, 0))
                s.connect(("127.0.0.1", port))
                return read_to_close(s).rpartition(b"\r\n\r\n")[2]

        first = [half_open(port, ATTACKER, b"") for _ in range(4)]
        assert refusal(ATTACKER) == (
            b'{"error": {"code": "too_many_connections", "message": "127.0.0.2 holds 4 '
            b"connections to this server, the most one client address may "
            b'(http.max_connections_per_client); reuse or close one"}}'
        )
        second = [half_open(port, "127.0.0.3", b"") for _ in range(4)]
        assert refusal("127.0.0.1") == (
            b'{"error": {"code": "too_many_connections", "message": "the server holds 8 '
            b'connections, its most (http.max_connections)"}}'
        )
        first.pop().close()  # a place is free again, for anyone

        def served() -> bool:
            try:
                return httpx.get(f"{base}/healthz", timeout=5.0).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(served, WAIT)
        for sock in first + second:
            sock.close()
