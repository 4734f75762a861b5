"""Helpers for testing tool servers that run on ctxactors (as ``trio.testing``).

A host app tests its own servers with real calls through a `Runtime`; these make such
tests short and deterministic::

    from ctxactors import Runtime
    from ctxactors.testing import ManualClock, context_args, wait_until

    clock = ManualClock()
    with Runtime([Notes], ttl=60, clock=clock) as rt:
        rt.call("add_note", context_args("s1", "a1", text="hi"))
        clock.advance(61)               # a minute passes, instantly
        assert rt.reap() == 1           # the idle actor is gone
        wait_until(lambda: rt.stats()["actors"] == 0)

For log lines use structlog's own ``structlog.testing.capture_logs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ctxactors.context import ASSISTANT_ID, META_KEYS, SESSION_ID, THREAD_ID

__all__ = [
    "ManualClock",
    "await_until",
    "context_args",
    "context_meta",
    "serve_app",
    "wait_until",
]

T = TypeVar("T")


class ManualClock:
    """A monotonic clock that moves only when `advance` is called (``Runtime(clock=...)``).

    Idle times, TTLs and reaping then depend on what the test says, not on how fast the
    machine is. Safe to read and advance from several threads.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by `seconds` (never back: it is monotonic)."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock can't go back (advance({seconds}))")
        with self._lock:
            self._now += seconds


def context_args(
    session: str, assistant: str | None = None, thread: str | None = None, **args: Any
) -> dict[str, Any]:
    """A tool's `args` with the context fields the host middleware appends.

    >>> context_args("s1", "a1", goal="Learn Rust")
    {'goal': 'Learn Rust', '__sessionId': 's1', '__assistantId': 'a1'}
    """
    out: dict[str, Any] = dict(args)
    out[SESSION_ID] = session
    if assistant is not None:
        out[ASSISTANT_ID] = assistant
    if thread is not None:
        out[THREAD_ID] = thread
    return out


def context_meta(
    session: str, assistant: str | None = None, thread: str | None = None
) -> dict[str, str]:
    """The same context as an MCP ``_meta`` mapping (``Runtime.call(..., meta=...)``).

    >>> context_meta("s1", thread="t1")
    {'ctxactors/sessionId': 's1', 'ctxactors/threadId': 't1'}
    """
    given = {"session_id": session, "assistant_id": assistant, "thread_id": thread}
    return {META_KEYS[name]: value for name, value in given.items() if value is not None}


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 15.0,
    interval: float = 0.01,
    describe: Callable[[], object] | None = None,
) -> T:
    """Poll `predicate` until it returns something truthy, and return that.

    For what a test can't be told about directly (a process exiting, a background reaper
    pass). On timeout raises `TimeoutError` naming the predicate and, with `describe`,
    what it returns then (say, the processes still alive)::

        wait_until(lambda: not pid_alive(pid), describe=lambda: f"pid {pid} still alive")
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(_timeout_message(predicate, timeout, value, describe))
        time.sleep(interval)


async def await_until(
    predicate: Callable[[], T],
    timeout: float = 15.0,
    interval: float = 0.01,
    describe: Callable[[], object] | None = None,
) -> T:
    """`wait_until` for async tests: sleeps with ``asyncio.sleep``, so the loop runs on."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(_timeout_message(predicate, timeout, value, describe))
        await asyncio.sleep(interval)


def _timeout_message(
    predicate: Callable[[], object],
    timeout: float,
    value: object,
    describe: Callable[[], object] | None,
) -> str:
    name = getattr(predicate, "__qualname__", repr(predicate))
    message = f"{name} was still {value!r} after {timeout} s"
    return f"{message}: {describe()}" if describe is not None else message


@contextlib.contextmanager
def serve_app(app: Any, timeout: float = 20.0) -> Iterator[str]:
    """Serve the ASGI `app` (say, ``create_app(runtime)``) on uvicorn at a free loopback
    port in a thread, for real HTTP from a test; yields the base URL. Needs the
    ``[serve]`` extra."""
    import uvicorn  # the [serve] extra: only this helper needs it

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), timeout)
        if not server.started:
            raise RuntimeError("uvicorn stopped before it started serving (see its log)")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()
