"""Helpers for the MCP transport tests: a test tool server and ways to start ``ctxactors serve``.

`Gate` is loaded into the served runtime with ``--server mcp_support:Gate`` (the tests
directory and its folders are put on the subprocess's PYTHONPATH). Its tools let a test prove concurrency by
ordering, not by timing: ``wait_gate`` only returns ``opened: true`` if ``open_gate`` ran
while it was still waiting.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
from mcp import StdioServerParameters
from mcp_types import RequestParamsMeta

from ctxactors import Scope, Server, ToolContext, tool
from ctxactors.context import META_KEYS
from ctxactors.testing import await_until, wait_until

TESTS_DIR = Path(__file__).resolve().parent
# The test modules sit in folders by area (core/, servers/, ...) and the helpers here: a test
# module imports both by basename (all unique), a served one too (``--server test_x:Cls``).
TEST_DIRS = [TESTS_DIR, *sorted(d for d in TESTS_DIR.iterdir() if any(d.glob("test_*.py")))]
TEST_PATH = os.pathsep.join(map(str, TEST_DIRS))
_gates: dict[str, threading.Event] = {}
_gates_lock = threading.Lock()


def _gate(name: str) -> threading.Event:
    with _gates_lock:
        return _gates.setdefault(name, threading.Event())


class Gate(Server):
    """Blocking tools for concurrency and shutdown tests (never in a real deployment)."""

    name = "gate"
    scope = Scope.SESSION

    @tool
    def wait_gate(self, ctx: ToolContext, gate: str, timeout: float = 20.0) -> dict[str, Any]:
        """Wait until open_gate(gate) is called (or timeout)."""
        return {"opened": _gate(gate).wait(timeout)}

    @tool
    def open_gate(self, ctx: ToolContext, gate: str) -> dict[str, Any]:
        """Open a gate."""
        _gate(gate).set()
        return {"opened": True}

    @tool
    def wait_fifo(self, ctx: ToolContext, path: str) -> dict[str, Any]:
        """Block until a writer opens the FIFO at `path` and closes it; return what it wrote.

        The test that holds the writer decides when the call ends, and knows the call is
        running once its own non-blocking open of the FIFO succeeds (`open_fifo_writer`).
        """
        with open(path) as fifo:
            return {"read": fifo.read()}

    @tool
    def slow(self, ctx: ToolContext, marker: str, seconds: float) -> dict[str, Any]:
        """Write the server's pid to `marker`, then sleep."""
        Path(marker).write_text(str(os.getpid()))
        time.sleep(seconds)
        return {"slept": seconds}


class Whoami(Server):
    """Answers with the context the runtime resolved for the call (precedence tests)."""

    name = "whoami"
    scope = Scope.THREAD

    @tool(read_only=True)
    def whoami(self, ctx: ToolContext) -> dict[str, Any]:
        """The caller's context."""
        return {
            "session": ctx.session_id,
            "assistant": ctx.assistant_id,
            "thread": ctx.thread_id,
            "principal": ctx.principal,
        }


def serve_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [TEST_PATH, env.get("PYTHONPATH")]))
    env.setdefault("CTXACTORS_LOG_LEVEL", "warning")
    # `serve` keeps state in a SQLite file under the user's state directory: every server a
    # test starts gets a fresh one, so no test sees another's (or an earlier run's) state.
    env["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="ctxactors-test-state-")
    return env


SERVE = [sys.executable, "-m", "ctxactors.cli", "serve", "--server", "mcp_support:Gate"]


def stdio_params(*extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=SERVE[0], args=[*SERVE[1:], *extra], env=serve_env())


def schema_keys(value: Any) -> Iterator[str]:
    """Every property name anywhere in a JSON schema."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "properties" and isinstance(item, dict):
                yield from item
            yield from schema_keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from schema_keys(item)


def host_meta(
    *, session: str | None = None, assistant: str | None = None, thread: str | None = None
) -> RequestParamsMeta:
    """The ``_meta`` a host sends to give the call's context (what the README shows)."""
    meta: dict[str, Any] = {}
    for attr, value in (
        ("session_id", session),
        ("assistant_id", assistant),
        ("thread_id", thread),
    ):
        if value is not None:
            meta[META_KEYS[attr]] = value
    return cast(RequestParamsMeta, meta)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def http_server(
    *extra: str,
    env: dict[str, str] | None = None,
    open_files: int | None = None,
    stderr: Any = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``ctxactors serve --transport http`` on a free loopback port; yields (url, process).
    `env` adds to the server's environment; `open_files` is its open-file limit (soft and
    hard, as a service manager sets it); `stderr` takes its standard error."""

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    for _attempt in range(3):
        port = free_port()
        proc = subprocess.Popen(
            [*SERVE, "--transport", "http", "--port", str(port), *extra],
            env={**serve_env(), **(env or {})},
            stdin=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=None if open_files is None else limit_files,
        )
        url = f"http://127.0.0.1:{port}/mcp"
        if _wait_listening(proc, port):
            break
        _stop(proc)
    else:
        raise RuntimeError("ctxactors serve --transport http did not start")
    try:
        yield url, proc
    finally:
        _stop(proc)


def _wait_listening(proc: subprocess.Popen[bytes], port: int, timeout: float = 30.0) -> bool:
    def answers_or_exited() -> bool:
        if proc.poll() is not None:
            return True
        try:
            httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1.0)
            return True
        except httpx.TransportError:
            return False

    try:
        wait_until(answers_or_exited, timeout, 0.05)
    except TimeoutError:
        return False
    return proc.poll() is None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def open_fifo_writer(path: Path, timeout: float = 20.0) -> int:
    """Open the FIFO at `path` for writing once a reader holds it (a `wait_fifo` call is
    running); returns the fd. Closing it after a write ends that call."""

    def opened() -> list[int]:
        try:
            return [os.open(path, os.O_WRONLY | os.O_NONBLOCK)]
        except OSError:  # ENXIO: no reader yet
            return []

    return wait_until(opened, timeout)[0]


def release_fifo(fd: int, text: str) -> None:
    os.write(fd, text.encode())
    os.close(fd)


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pids_of(argv: list[str]) -> list[int]:
    """Host pids of live processes whose command line is exactly `argv`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:  # not a process, or gone
            continue
        if cmdline.split(b"\0")[:-1] == [a.encode() for a in argv] and pid_alive(int(entry)):
            found.append(int(entry))
    return found


async def spawn_sleeper(client: Any, session: str) -> int:
    """Start a sleep through the workspace tools of `session`; return its host pid.

    The command runs in a PID namespace, so `$$` would not be a host pid: the sleep's
    unique duration finds it in the host's /proc instead.
    """
    marker = f"60.{os.getpid()}{time.monotonic_ns() % 10**9}"
    started = await client.call_tool(
        "execute_command", {"command": f"exec sleep {marker}", "__sessionId": session}
    )
    assert not started.is_error, started.content
    pids = await await_until(
        lambda: pids_of(["sleep", marker]),
        10,
        0.05,
        describe=lambda: f"no sleep {marker} (execute_command said {started.content})",
    )
    return pids[0]
