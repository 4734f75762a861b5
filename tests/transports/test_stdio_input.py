"""``ctxactors serve`` over stdio fed raw JSON-RPC lines: hostile input, and the end of stdin.

Every line that carries no message the server can take gets a JSON-RPC error (``id: null``
when the id can't be known) and the server answers the next request; a line over the cap is
discarded in chunks, never held whole in memory.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp_support import SERVE, open_fifo_writer, release_fifo, serve_env

from ctxactors.testing import wait_until
from ctxactors.transports.stdio import Oversized, read_lines

pytestmark = pytest.mark.timeout(60)

WAIT = 20.0
MIB = 1024 * 1024


INITIALIZE = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "raw", "version": "1"},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


class RawStdio:
    """The server as a subprocess with pipes: bytes in, parsed JSON-RPC lines out."""

    def __init__(self, *extra: str, log_level: str = "warning") -> None:
        env = serve_env() | {"CTXACTORS_LOG_LEVEL": log_level}
        self.proc = subprocess.Popen(
            [*SERVE, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.messages.put(json.loads(line))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.decode(errors="replace"))

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send_json(self, message: dict[str, Any]) -> None:
        self.send(json.dumps(message).encode() + b"\n")

    def recv(self) -> dict[str, Any]:
        return self.messages.get(timeout=WAIT)

    def request(self, request_id: int, method: str, params: dict[str, Any] | None = None) -> Any:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send_json(message)
        answer = self.recv()
        assert answer["id"] == request_id, answer
        return answer

    def initialize(self) -> None:
        assert "result" in self.request(0, "initialize", INITIALIZE)
        self.send_json(INITIALIZED)

    def peak_rss(self) -> int:
        """The server's peak resident memory so far, in bytes (VmHWM)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WAIT)


@pytest.fixture
def raw() -> Any:
    server = RawStdio()
    server.initialize()
    yield server
    server.close()


def ping_after(raw: RawStdio, data: bytes, ping_id: int) -> list[dict[str, Any]]:
    """Send `data`, then a ping; every message answered up to and including the ping's."""
    raw.send(data)
    raw.send_json({"jsonrpc": "2.0", "id": ping_id, "method": "ping"})
    answers = [raw.recv()]
    while answers[-1].get("id") != ping_id:
        answers.append(raw.recv())
    assert answers[-1] == {"jsonrpc": "2.0", "id": ping_id, "result": {}}
    return answers[:-1]


def error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


INVALID_REQUEST = (
    'Invalid Request: expected a JSON-RPC 2.0 object with "jsonrpc": "2.0" and a "method" '
    '(request or notification) or a "result" or "error" (response)'
)


@pytest.mark.parametrize(
    ("line", "answer"),
    [
        (
            b'\xff\xfe{"jsonrpc": "2.0", "id": 1, "method": "ping"}',
            error(
                None, -32700, "Parse error: the line is not UTF-8 (invalid start byte at byte 0)"
            ),
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"x": "caf\xc3"}}',
            error(
                None,
                -32700,
                "Parse error: the line is not UTF-8 (invalid continuation byte at byte 72)",
            ),
        ),
        (
            b'{"jsonrpc": "2.0", "id": 3, "method": ',
            error(None, -32700, "Parse error: Invalid JSON: EOF while parsing a value"),
        ),
        (
            b"[" * 100_000,
            error(None, -32700, "Parse error: Invalid JSON: recursion limit exceeded"),
        ),
        (b'{"jsonrpc": "2.0", "id": 7}', error(7, -32600, INVALID_REQUEST)),
        (b'{"jsonrpc": "1.0", "id": "x", "method": "ping"}', error("x", -32600, INVALID_REQUEST)),
        (b"[1, 2]", error(None, -32600, INVALID_REQUEST)),
        (
            b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": [1]}',
            error(9, -32600, INVALID_REQUEST),
        ),
        (
            b'{"jsonrpc": "2.0", "id": true, "method": "ping"}',
            error(None, -32600, "Invalid Request: an id must be a string or an integer"),
        ),
    ],
    ids=[
        "not-utf8",
        "truncated-utf8-in-string",
        "invalid-json",
        "nested-too-deep",
        "no-method",
        "wrong-version",
        "array",
        "params-not-object",
        "boolean-id",
    ],
)
def test_a_malformed_line_gets_a_jsonrpc_error_and_the_next_request_an_answer(
    raw: RawStdio, line: bytes, answer: dict[str, Any]
) -> None:
    [got] = ping_after(raw, line + b"\n", ping_id=100)
    detail = got["error"]["message"]
    # Parse errors end with the parser's position ("at line 1 column 37"): check the start.
    assert {
        **got,
        "error": {**got["error"], "message": detail[: len(answer["error"]["message"])]},
    } == answer
    created = raw.request(
        101,
        "tools/call",
        {"name": "create_goal", "arguments": {"goal": "after", "__sessionId": "m"}},
    )
    assert created["result"]["structuredContent"] == {"id": "g1", "goal": "after"}


def test_blank_lines_are_skipped_without_an_answer(raw: RawStdio) -> None:
    assert ping_after(raw, b"\n   \n\r\n", ping_id=5) == []


def test_a_line_over_64_mib_is_refused_without_being_held_and_the_server_serves_on(
    raw: RawStdio,
) -> None:
    before = raw.peak_rss()
    huge = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "' + b"x" * (65 * MIB)
    refused = ping_after(raw, huge + b'"}}\n', ping_id=2)
    size = len(huge) + 3
    assert refused == [
        error(
            None,
            -32600,
            f"Invalid Request: a message of {size} bytes is over this server's 4194304-byte "
            "limit on one line; it was discarded unread",
        )
    ]
    # Read and dropped in chunks: at most the 4 MiB cap and a chunk were ever held.
    assert raw.peak_rss() - before < 12 * MIB, (before, raw.peak_rss())
    assert raw.proc.poll() is None


def test_the_line_cap_is_configurable_and_exact() -> None:
    server = RawStdio("--max-body", "1000")
    try:
        server.initialize()
        head = b'{"jsonrpc": "2.0", "id": 3, "method": "ping"'
        at_cap = head + b" " * (1000 - len(head) - 1) + b"}"
        assert len(at_cap) == 1000
        server.send(at_cap + b"\n")
        assert server.recv() == {"jsonrpc": "2.0", "id": 3, "result": {}}
        over = at_cap[:-1] + b" }"
        assert ping_after(server, over + b"\n", ping_id=4) == [
            error(
                None,
                -32600,
                "Invalid Request: a message of 1001 bytes is over this server's 1000-byte "
                "limit on one line; it was discarded unread",
            )
        ]
    finally:
        server.close()


def test_closing_stdin_lets_the_call_in_flight_answer_before_exit(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    server = RawStdio(log_level="info")
    try:
        server.initialize()
        server.send_json(
            {
                "jsonrpc": "2.0",
                "id": 10,
                "method": "tools/call",
                "params": {"name": "wait_fifo", "arguments": {"path": str(fifo)}},
            }
        )
        writer = open_fifo_writer(fifo)  # returns once the call is running
        assert server.proc.stdin is not None
        server.proc.stdin.close()
        # The server has seen the end of stdin (or, before the fix, already answered).
        assert wait_until(
            lambda: (
                any('"draining"' in line for line in server.stderr) or not server.messages.empty()
            )
        )
        release_fifo(writer, "answered")
        answer = server.recv()
        assert answer["id"] == 10 and "error" not in answer, answer
        assert answer["result"]["structuredContent"] == {"read": "answered"}
        assert server.proc.wait(WAIT) == 0
    finally:
        server.close()


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12),
    cap=st.integers(min_value=1, max_value=30),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=8),
    newline_at_end=st.booleans(),
)
def test_read_lines_splits_any_chunking_like_splitlines_and_caps_each_line(
    lines: list[bytes], cap: int, cuts: list[int], newline_at_end: bool
) -> None:
    data = b"\n".join(lines) + (b"\n" if newline_at_end and lines else b"")
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    chunks = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]

    async def collect() -> list[bytes | int]:
        pending = iter(chunks)

        async def read_chunk() -> bytes:
            return next(pending, b"")

        return [
            int(x) if isinstance(x, Oversized) else x async for x in read_lines(read_chunk, cap)
        ]

    expected: list[bytes | int] = [
        len(line) if len(line) > cap else line
        for line in data.split(b"\n")
        if line and (len(line) > cap or not line.isspace())
    ]
    got = anyio.run(collect)
    assert got == expected


def test_a_request_the_client_cancelled_does_not_hold_up_the_end_of_stdin(
    tmp_path: Path,
) -> None:
    """The SDK never answers a cancelled request, so the drain must stop waiting for it:
    the server shuts down while that tool is still blocked."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    server = RawStdio(log_level="info")
    writer = None
    try:
        server.initialize()
        call = {"name": "wait_fifo", "arguments": {"path": str(fifo)}}
        server.send_json({"jsonrpc": "2.0", "id": 20, "method": "tools/call", "params": call})
        writer = open_fifo_writer(fifo)
        server.send_json(
            {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 20, "reason": "the user gave up"},
            }
        )
        assert ping_after(server, b"", ping_id=21) == []
        assert server.proc.stdin is not None
        server.proc.stdin.close()
        stopped = '"event":"shutdown"'
        assert wait_until(
            lambda: any(stopped in x and "end of stdin" in x for x in server.stderr)
        ), server.stderr
        assert not any("drain_timeout" in line for line in server.stderr)
        assert server.messages.empty()  # the cancelled request got no answer
    finally:
        if writer is not None:
            release_fifo(writer, "late")
        server.close()


def test_max_body_must_be_positive() -> None:
    done = subprocess.run(
        [*SERVE, "--max-body", "0"], env=serve_env(), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "--max-body: must be a positive number of bytes, got 0" in done.stderr


def test_stdin_that_is_a_regular_file_or_the_null_device_is_served_to_its_end(
    tmp_path: Path,
) -> None:
    """Neither can be watched by epoll: they are read in a worker thread instead (the null
    device used to hang the server)."""
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE},
        INITIALIZED,
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
    ]
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(b"".join(json.dumps(m).encode() + b"\n" for m in lines) + b"garbage\n")
    with requests.open("rb") as stdin:
        done = subprocess.run(SERVE, stdin=stdin, env=serve_env(), capture_output=True, timeout=40)
    assert done.returncode == 0
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(str(a["id"]) for a in answers) == ["1", "2", "None"]
    assert next(a for a in answers if a["id"] is None)["error"]["code"] == -32700
    empty = subprocess.run(
        SERVE, stdin=subprocess.DEVNULL, env=serve_env(), capture_output=True, timeout=40
    )
    assert (empty.returncode, empty.stdout) == (0, b"")
