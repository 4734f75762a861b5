"""The connection guard in this process (`ctxactors.transports.connections`): deadlines for a
request's headers and body, connection caps, the open-file limit.

`test_http_slow_clients` checks the same promises against a real ``ctxactors serve``
subprocess; these run the server as `serve` wires it inside the test process
(`in_process_support`), where mutation testing sees the guard, and on a loop whose clock
the test moves ahead: a deadline is shown to fire at exactly its configured time (not a
moment before, and at once after), with no waiting and no dependence on the machine's load.
"""

from __future__ import annotations

import json
import resource
import secrets
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from in_process_support import WAIT, Served, pending, read_to_close, serve_in_process
from mcp_support import _gate
from structlog.testing import capture_logs

from ctxactors.logs import configure_logging
from ctxactors.settings import HttpSettings
from ctxactors.testing import wait_until
from ctxactors.transports import connections
from ctxactors.transports.connections import (
    Admission,
    GuardedH11Protocol,
    GuardedListener,
    fit_to_open_files,
    guarded_protocol,
)

pytestmark = pytest.mark.timeout(90)

HEADERS_S, BODY_S = 100, 200  # deadlines far beyond anything a loaded machine takes
DEADLINES = ("--set", f"http.header_timeout={HEADERS_S}", "--set", f"http.body_timeout={BODY_S}")
NO_KEEP_ALIVE_CLOSE = 100_000  # uvicorn's idle timeout, beyond every skip of these tests
JUST_BEFORE, JUST_AFTER = 0.001, 0.001  # seconds of loop time either side of a deadline:
# the clock is frozen (`served`), so a deadline moved by more than a millisecond is seen


def error_response(status: str, code: str, message: str, *extra: str) -> bytes:
    """The whole response the guard writes, as a client reads it."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = [
        f"HTTP/1.1 {status}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *extra,
    ]
    return "\r\n".join(head).encode() + b"\r\n\r\n" + body


LATE_HEADERS = error_response(
    "408 Request Timeout",
    "request_timeout",
    f"the request's headers did not arrive within {HEADERS_S} s (http.header_timeout)",
)


def too_many(message: str) -> bytes:
    return error_response(
        "503 Service Unavailable", "too_many_connections", message, "retry-after: 1"
    )


@pytest.fixture
def served() -> Iterator[Served]:
    """The server on a frozen clock: only the test's skips move it (real time passing
    between the test's steps, however much on a loaded machine, brings no deadline closer)."""
    with serve_in_process(*DEADLINES, keep_alive=NO_KEEP_ALIVE_CLOSE) as served:
        with served.loop.frozen():
            yield served


@pytest.fixture
def debug_logs() -> Iterator[list[dict[str, Any]]]:
    """The ctxactors log lines, debug ones included, logged while the test runs."""
    configure_logging(format="json", level="debug", force=True)
    with capture_logs() as logs:
        yield logs


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


def connected(served: Served, *socks: socket.socket) -> None:
    """Return once the server has accepted `socks` and armed their deadlines (the loop makes
    the protocol a turn or two after ``accept``: `settle` waits for more turns than that)."""
    wait_until(lambda: served.admission.open == len(socks), WAIT, describe=served.admission.open)
    served.loop.settle()


def response(sock: socket.socket) -> bytes:
    """One whole response (``content-length`` framed) read from a kept-alive connection."""
    sock.settimeout(WAIT)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, data
        body += chunk
    assert len(body) == length, "a second response arrived unasked"
    return head + b"\r\n\r\n" + body


def goals(served: Served, session: str) -> list[str]:
    state = served.runtime.call("get_planning_state", {"__sessionId": session})
    assert state.structured is not None
    return [g["goal"] for g in state.structured["goals"]]


# -- the header deadline ---------------------------------------------------------------------


def test_headers_that_stall_get_a_408_at_the_header_deadline_exactly(
    served: Served, debug_logs: list[dict[str, Any]]
) -> None:
    """From the connection's start: one that sends half its headers and one that sends
    nothing both hold until the deadline, then get the 408 and lose the connection."""
    with served.connect() as half, served.connect() as silent:
        half.sendall(b"GET /healthz HTTP/1.1\r\nHo")
        connected(served, half, silent)
        served.loop.skip(HEADERS_S - JUST_BEFORE)
        assert (pending(half), pending(silent)) == (b"", b"")
        served.loop.skip(JUST_BEFORE + JUST_AFTER)
        assert read_to_close(half) == LATE_HEADERS
        assert read_to_close(silent) == LATE_HEADERS
        wait_until(lambda: served.admission.open == 0, WAIT, describe=served.admission.open)
        clients = sorted(("127.0.0.1", s.getsockname()[1]) for s in (half, silent))
    late = events(debug_logs, "request_headers_late")
    assert sorted(e.pop("client") for e in late) == clients
    line = {
        "event": "request_headers_late",
        "timeout_s": 100.0,
        "logger": "ctxactors.connections",
        "log_level": "debug",
    }
    assert late == [line, line]


def test_a_kept_alive_connection_has_a_header_deadline_only_once_its_next_request_begins(
    served: Served,
) -> None:
    with served.connect() as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert response(conn).startswith(b"HTTP/1.1 200 OK\r\n")
        # Idle between requests: no deadline of ours (uvicorn's keep-alive timeout is the
        # one that closes an idle connection, here beyond the test).
        served.loop.skip(3 * HEADERS_S)
        assert pending(conn) == b""
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert response(conn).startswith(b"HTTP/1.1 200 OK\r\n")
        # The next request's first bytes start its header deadline.
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHo")
        served.loop.settle()
        served.loop.skip(HEADERS_S - JUST_BEFORE)
        assert pending(conn) == b""
        served.loop.skip(JUST_BEFORE + JUST_AFTER)
        assert read_to_close(conn) == LATE_HEADERS


def test_a_pipelined_requests_header_deadline_starts_when_the_one_before_is_answered(
    served: Served,
) -> None:
    """Half a second request sent behind a first one that takes long to answer: the wait
    for that answer is not the client's delay, so its header deadline starts after it."""
    gate = f"pipelined-{secrets.token_hex(8)}"
    with served.connect() as conn:
        conn.sendall(gate_request(gate, "pipelined") + b"GET /healthz HTTP/1.1\r\nHo")
        wait_until(lambda: served.runtime.stats()["inflight"] == 1, WAIT)
        served.loop.skip(3 * HEADERS_S)
        assert pending(conn) == b""
        _gate(gate).set()
        assert response(conn).startswith(b"HTTP/1.1 200 OK\r\n")
        served.loop.settle()
        served.loop.skip(HEADERS_S - JUST_BEFORE)
        assert pending(conn) == b""
        served.loop.skip(JUST_BEFORE + JUST_AFTER)
        assert read_to_close(conn) == LATE_HEADERS


def gate_request(gate: str, session: str) -> bytes:
    """A whole REST call of `mcp_support.Gate`'s ``wait_gate``: answered once `gate` opens."""
    body = json.dumps({"gate": gate, "timeout": WAIT}).encode()
    return (
        b"POST /api/v1/tools/wait_gate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        + f"X-Session-Id: {session}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


# -- the body deadline -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/tools/create_goal", "/mcp"])
def test_a_body_that_stalls_loses_its_connection_at_the_body_deadline_and_runs_nothing(
    served: Served, path: str, debug_logs: list[dict[str, Any]]
) -> None:
    with served.connect() as conn:
        conn.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Session-Id: slow\r\n".encode()
            + b"Accept: application/json, text/event-stream\r\n"
            + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            + b'{"goal": "never'
        )  # fmt: skip
        connected(served, conn)
        # The headers are in: their deadline no longer applies, the body's runs from here.
        served.loop.skip(BODY_S - JUST_BEFORE)
        assert pending(conn) == b""
        served.loop.skip(JUST_BEFORE + JUST_AFTER)
        assert read_to_close(conn) == b""  # no answer: the body never came
        wait_until(lambda: served.admission.open == 0, WAIT, describe=served.admission.open)
        client = ("127.0.0.1", conn.getsockname()[1])
    assert goals(served, "slow") == []
    assert events(debug_logs, "request_body_late") == [
        {
            "event": "request_body_late",
            "client": client,
            "timeout_s": 200.0,
            "logger": "ctxactors.connections",
            "log_level": "debug",
        }
    ]
    assert events(debug_logs, "request_headers_late") == []


def test_each_request_of_a_kept_alive_connection_has_its_own_body_deadline(
    served: Served,
) -> None:
    """Requests one right after the other on one connection, each body just in time: each
    deadline runs from its own request's headers, none is left over from the request
    before (which would cut the next one short)."""

    def start(goal: str) -> bytes:
        """The headers and the first bytes of a create_goal whose body is `goal`'s."""
        conn.sendall(
            b"POST /api/v1/tools/create_goal HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"X-Session-Id: kept\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body(goal))}\r\n\r\n".encode()
            + body(goal)[:5]
        )
        served.loop.settle()
        served.loop.skip(BODY_S - JUST_BEFORE)
        assert pending(conn) == b""
        return body(goal)[5:]

    def body(goal: str) -> bytes:
        return json.dumps({"goal": goal}).encode()

    with served.connect() as conn:
        for goal in ("first", "second"):
            conn.sendall(start(goal))
            answer = response(conn)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
        # Answered and idle: no deadline is left for the connection.
        served.loop.skip(3 * BODY_S)
        assert pending(conn) == b""
        start("third")  # the body stops short
        served.loop.skip(JUST_BEFORE + JUST_AFTER)
        assert read_to_close(conn) == b""
    assert goals(served, "kept") == ["first", "second"]


def test_a_connection_that_ends_leaves_no_deadline_behind(served: Served) -> None:
    """Its timers go with it: a flood of short connections holds no protocol objects in
    the loop until their deadlines would have come."""
    with served.connect() as silent, served.connect() as half_body:
        half_body.sendall(
            b"POST /api/v1/tools/create_goal HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"X-Session-Id: gone\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        connected(served, silent, half_body)
        assert sorted(t.__name__ for t in guard_timers(served)) == ["_body_late", "_headers_late"]
    wait_until(lambda: served.admission.open == 0, WAIT, describe=served.admission.open)
    served.loop.settle()
    assert guard_timers(served) == []


def guard_timers(served: Served) -> list[Any]:
    """The guard's deadlines the loop holds: bound methods of a `GuardedH11Protocol`."""
    callbacks = [t._callback for t in served.loop.timers()]  # noqa: SLF001 - asyncio's handle
    return [c for c in callbacks if isinstance(getattr(c, "__self__", None), GuardedH11Protocol)]


def test_a_response_is_never_timed(served: Served) -> None:
    """A call that takes longer than both deadlines is answered on its connection."""
    gate = f"slow-answer-{secrets.token_hex(8)}"
    with served.connect() as conn:
        conn.sendall(gate_request(gate, "slow-answer"))
        wait_until(lambda: served.runtime.stats()["inflight"] == 1, WAIT)
        served.loop.skip(10 * BODY_S)
        assert pending(conn) == b""
        _gate(gate).set()
        answer = response(conn)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["structuredContent"] == {"opened": True}


# -- connection caps -------------------------------------------------------------------------


def test_the_server_and_each_client_address_hold_at_most_their_caps(
    debug_logs: list[dict[str, Any]],
) -> None:
    caps = ("--set", "http.max_connections=4", "--set", "http.max_connections_per_client=2")
    with serve_in_process(*caps) as served:
        first = [served.connect("127.0.0.2") for _ in range(2)]
        connected(served, *first)
        with served.connect("127.0.0.2") as third:
            assert read_to_close(third) == too_many(
                "127.0.0.2 holds 2 connections to this server, the most one client address "
                "may (http.max_connections_per_client); reuse or close one"
            )
        second = [served.connect("127.0.0.3") for _ in range(2)]
        connected(served, *first, *second)
        with served.connect() as fifth:
            assert read_to_close(fifth) == too_many(
                "the server holds 4 connections, its most (http.max_connections)"
            )
        assert served.admission.open == 4
        first.pop().close()  # its place comes back as the connection ends
        wait_until(lambda: served.admission.open == 3, WAIT, describe=served.admission.open)
        assert httpx.get(f"{served.url}/healthz", timeout=WAIT).status_code == 200
        for sock in first + second:
            sock.close()
        wait_until(lambda: served.admission.open == 0, WAIT, describe=served.admission.open)
    assert events(debug_logs, "connection_refused") == [
        refused(host, 4 if host == "127.0.0.1" else 2) for host in ("127.0.0.2", "127.0.0.1")
    ]


def refused(client: str, open_now: int) -> dict[str, Any]:
    """The debug line of a refused connection."""
    return {
        "event": "connection_refused",
        "client": client,
        "open": open_now,
        "logger": "ctxactors.connections",
        "log_level": "debug",
    }


def listening(family: int, address: Any) -> socket.socket:
    bound = socket.socket(family, socket.SOCK_STREAM)
    bound.bind(address)
    bound.listen(256)
    return bound


def test_the_listener_refuses_at_most_64_connections_in_one_accept_call(
    debug_logs: list[dict[str, Any]],
) -> None:
    """A flood of refused connections can't keep the loop inside ``accept``: it refuses 64,
    then says none wait (``BlockingIOError``), and takes the rest on its next call."""
    bound = listening(socket.AF_INET, ("127.0.0.1", 0))
    name = bound.getsockname()
    limits = HttpSettings(max_connections=1000, max_connections_per_client=1)
    listener = GuardedListener(bound, Admission(limits))
    assert bound.fileno() == -1  # the listener owns the descriptor now
    assert (listener.family, listener.type, listener.proto, listener.getsockname()) == (
        socket.AF_INET,
        socket.SOCK_STREAM,
        0,  # as the bound socket was made (not the protocol the kernel reports: 6)
        name,
    )
    listener.setblocking(False)
    clients = [socket.create_connection(name) for _ in range(71)]
    try:
        conn, address = listener.accept()
        assert address == clients[0].getsockname()
        with pytest.raises(BlockingIOError):
            listener.accept()  # 64 refused
        assert len(events(debug_logs, "connection_refused")) == 64
        with pytest.raises(BlockingIOError):
            listener.accept()  # the other 6, then none waits
        refusal = too_many(
            "127.0.0.1 holds 1 connections to this server, the most one client address may "
            "(http.max_connections_per_client); reuse or close one"
        )
        assert [read_to_close(c) for c in clients[1:]] == [refusal] * 70
        assert events(debug_logs, "connection_refused") == [refused("127.0.0.1", 1)] * 70
        assert listener.admission.open == 1
        conn.close()
    finally:
        for c in clients:
            c.close()
        listener.close()


def test_a_unix_socket_peer_counts_as_the_client_it_names() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        path = str(Path(tmp) / "s")
        limits = HttpSettings(max_connections=10, max_connections_per_client=1)
        listener = GuardedListener(listening(socket.AF_UNIX, path), Admission(limits))
        listener.setblocking(False)
        clients = [socket.socket(socket.AF_UNIX) for _ in range(2)]
        try:
            for c in clients:
                c.connect(path)
            conn, address = listener.accept()  # an unnamed peer: address ''
            assert address == ""
            with pytest.raises(BlockingIOError):
                listener.accept()
            assert read_to_close(clients[1]) == too_many(
                " holds 1 connections to this server, the most one client address may "
                "(http.max_connections_per_client); reuse or close one"
            )
            conn.close()
        finally:
            for c in clients:
                c.close()
            listener.close()


def test_a_refused_client_that_left_costs_nothing() -> None:
    """The refusal is sent without blocking; a client gone already is no error."""
    bound = listening(socket.AF_INET, ("127.0.0.1", 0))
    listener = GuardedListener(bound, Admission(HttpSettings(max_connections=1)))
    listener.setblocking(False)
    with socket.create_connection(listener.getsockname()) as kept:
        leaver = socket.create_connection(listener.getsockname())
        leaver.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        leaver.close()  # a reset: the server's send fails
        conn, _ = listener.accept()
        with pytest.raises(BlockingIOError):
            listener.accept()
        assert listener.admission.open == 1 and pending(kept) == b""
        conn.close()
    listener.close()


def test_each_server_gets_its_own_protocol_class() -> None:
    one, two = Admission(HttpSettings()), Admission(HttpSettings())
    first, second = guarded_protocol(one), guarded_protocol(two)
    assert (first.admission, second.admission) == (one, two)
    assert first is not second and issubclass(first, GuardedH11Protocol)
    assert (first.__name__, first.__bases__) == ("GuardedH11Protocol", (GuardedH11Protocol,))
    assert not hasattr(GuardedH11Protocol, "admission")  # the base is shared by none


# -- the open-file limit ---------------------------------------------------------------------


@pytest.fixture
def nofile() -> Iterator[tuple[int, int]]:
    """This process's open-file limit (soft, hard), put back after the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield soft, hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_open_file_limit_is_raised_to_what_the_connections_need(
    nofile: tuple[int, int],
) -> None:
    _, hard = nofile
    limits = HttpSettings(max_connections=3000, max_connections_per_client=50)
    needed = 3000 + 256  # the connections and the descriptors kept for the rest
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"the hard open-file limit ({hard}) is below {needed}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    assert fit_to_open_files(limits) is limits
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (needed, hard)
    # Enough already (exactly, or more): left as it is.
    assert fit_to_open_files(limits) is limits
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed + 1, hard))
    assert fit_to_open_files(limits) is limits
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (needed + 1, hard)


def test_connections_beyond_the_hard_limit_are_lowered_to_fit_it(
    nofile: tuple[int, int],
) -> None:
    _, hard = nofile
    if hard == resource.RLIM_INFINITY or hard <= 2 * 256:
        pytest.skip(f"needs a finite hard open-file limit above 512, not {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    limits = HttpSettings(max_connections=hard, max_connections_per_client=hard + 1)
    with capture_logs() as logs:
        fitted = fit_to_open_files(limits)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)  # raised as far as allowed
    assert fitted == HttpSettings(max_connections=hard - 256, max_connections_per_client=hard - 256)
    assert logs == [
        {
            "event": "max_connections_lowered",
            "configured": hard,
            "max_connections": hard - 256,
            "open_files": hard,
            "fix": "raise the open-file limit (ulimit -n, LimitNOFILE=) above http.max_connections",
            "logger": "ctxactors.connections",
            "log_level": "warning",
        }
    ]
    # A client's cap below the server's is kept.
    small = HttpSettings(max_connections=hard, max_connections_per_client=8)
    assert fit_to_open_files(small).max_connections_per_client == 8


class FakeLimits:
    """`resource` as `connections` uses it, for limits this process can't have: a hard
    limit below 512 or none at all, or a kernel that refuses to raise the soft one."""

    RLIMIT_NOFILE = resource.RLIMIT_NOFILE
    RLIM_INFINITY = resource.RLIM_INFINITY

    def __init__(self, soft: int, hard: int, refuse: type[Exception] | None = None) -> None:
        self.limit = (soft, hard)
        self.refuse = refuse
        self.asked: list[tuple[int, int]] = []

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.limit

    def setrlimit(self, which: int, limit: tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        self.asked.append(limit)
        if self.refuse is not None:
            raise self.refuse("refused")
        self.limit = limit


INF = resource.RLIM_INFINITY


@pytest.mark.parametrize(
    ("soft", "hard", "refuse", "asked", "fitted_to"),
    [
        (300, 400, None, [(400, 400)], 200),  # half of 400: more than 400 - 256
        (1024, 1024, None, [(1024, 1024)], 768),  # 1024 - 256: more than half
        (100, INF, None, [(4352, INF)], 4096),  # no hard limit: raised to what is needed
        (INF, INF, None, [], 4096),  # no limit at all
        (4352, INF, None, [], 4096),  # exactly enough
        (1024, INF, ValueError, [(4352, INF)], 768),  # refused: the soft limit decides
        (600, INF, OSError, [(4352, INF)], 344),
    ],
)
def test_max_connections_fit_the_open_files_that_can_be_had(
    monkeypatch: pytest.MonkeyPatch,
    soft: int,
    hard: int,
    refuse: type[Exception] | None,
    asked: list[tuple[int, int]],
    fitted_to: int,
) -> None:
    fake = FakeLimits(soft, hard, refuse)
    monkeypatch.setattr(connections, "resource", fake)
    limits = HttpSettings(max_connections=4096, max_connections_per_client=300)
    fitted = fit_to_open_files(limits)
    assert fake.asked == asked
    assert fitted.max_connections == fitted_to
    assert type(fitted.max_connections) is int  # a count, even when halved
    assert fitted.max_connections_per_client == min(300, fitted_to)
    assert (fitted is limits) == (fitted_to == 4096)
