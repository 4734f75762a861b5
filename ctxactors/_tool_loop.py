"""The event loop a runtime owns for its ``async def`` tools.

An async tool's coroutine runs on this loop, never on the caller's: a host's loop may be
busy, closed or absent (a blocking `Runtime.call` from a plain thread), and a coroutine
tied to it would die with it. Its key's actor is parked meanwhile (`submit`: the worker
pool's way, no thread held) or its thread waits (`run`: a thread per key, or a call behind
call wrappers), so the key's calls stay one at a time and in order (the next call starts
after the coroutine returns, and its state is saved after, exactly as for a sync tool),
while the other keys' coroutines go on together on the loop.

At the caller's deadline the coroutine is cancelled, and the actor still waits for it to
unwind: a coroutine that catches the cancellation and touches its state again must not
overlap the key's next call.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ctxactors.results import ToolResult

# The caller's deadline, seen from inside an async tool (`caller_deadline`).
tool_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "ctxactors_tool_deadline", default=None
)


class Cancelled(Exception):
    """An async tool's coroutine was cancelled at its caller's deadline."""


class CancelledResult(ToolResult, frozen=True):
    """The result of a cancelled coroutine. Its caller raises `CallTimeoutError` on it:
    the cancellation and the caller's own wait end at the same deadline, and whichever
    comes first, the caller must see a timeout, not an ordinary error result."""


class ToolLoop:
    """One event loop on one daemon thread, started by the first async call."""

    def __init__(self, name: str = "ctxactors-async-tools") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def run(self, coro: Coroutine[Any, Any, Any], deadline: float | None) -> Any:
        """The coroutine's value, run on this loop (`submit`) while this thread waits; what
        it raises is raised here. Past `deadline` it is cancelled, waited for (the key's
        next call must not overlap its unwinding), and `Cancelled` is raised."""
        done = threading.Event()
        outcome: list[tuple[Any, BaseException | None]] = []

        def finished(value: Any, error: BaseException | None) -> None:
            outcome.append((value, error))
            done.set()

        self.submit(coro, deadline, finished)
        done.wait()
        value, error = outcome[0]
        if error is not None:
            raise error
        return value

    def submit(
        self,
        coro: Coroutine[Any, Any, Any],
        deadline: float | None,
        done: Callable[[Any, BaseException | None], None],
    ) -> None:
        """Run the coroutine on this loop without waiting for it; `done(value, error)` is
        called on the loop's thread when it has finished (`Cancelled` past `deadline`)."""
        loop = self._start()

        def finished(task: asyncio.Task[Any]) -> None:
            if task.cancelled():
                done(None, Cancelled("the tool was cancelled: its caller's deadline passed"))
                return
            error = task.exception()
            done(None if error is not None else task.result(), error)

        def begin() -> None:
            context = contextvars.copy_context()
            context.run(tool_deadline.set, deadline)
            task = loop.create_task(coro, context=context)
            task.add_done_callback(finished)
            if deadline is not None:
                loop.call_at(loop.time() + max(deadline - time.monotonic(), 0.0), _cancel, [task])

        loop.call_soon_threadsafe(begin)

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is not None:
            return loop
        with self._lock:
            if self._closed:
                raise RuntimeError("the runtime is closed")
            if self._loop is None:
                ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._serve, args=(ready,), name=self._name, daemon=True
                )
                self._thread.start()
                ready.wait()
            assert self._loop is not None
            return self._loop

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        ready.set()
        try:
            loop.run_forever()
        finally:
            # Closed while a coroutine still ran (an actor that outlived the close's
            # wait): cancel it and let it unwind, so its actor's wait ends too.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    def close(self) -> None:
        """Stop the loop (after the runtime's actors have stopped: nothing waits on it)."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10.0)


def _cancel(box: list[asyncio.Task[Any]]) -> None:
    if box:
        box[0].cancel()
