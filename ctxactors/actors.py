"""The per-key actor, the message it runs, and the two reply paths back to the caller.

A `KeyActor` is a pykka thread actor that owns one server instance (the state of one key).
Messages are sent with ``tell`` and carry their own reply slot, instead of pykka's ``ask``
futures, for two reasons:

- speed: a ``SimpleQueue`` inbox plus a one-shot lock handoff is a lighter round trip than
  pykka's ``Queue``-based future;
- asyncio: an `AsyncReply` resolves an asyncio future with ``call_soon_threadsafe``, so an
  awaiting caller never blocks its event loop (``await`` on a pykka future would).

Each call gets a fresh reply slot, so a reply that arrives after its caller timed out lands
in an abandoned slot and can never be taken for the reply to a later call.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

import pykka

from ctxactors.logs import lazy_logger
from ctxactors.results import ToolResult

_log = lazy_logger("ctxactors.actors")


class Reply(Protocol):
    def set(self, value: Any) -> None: ...


_running = threading.local()


def caller_deadline() -> float | None:
    """When the caller of the call this actor thread is running stops waiting for it.

    A `time.monotonic` instant, or None when unknown. A handler that starts more work on
    its caller's behalf (the batch tool) ends that work before this, so nothing runs for a
    caller that has given up.
    """
    deadline: float | None = getattr(_running, "deadline", None)
    return deadline


class SyncReply:
    """A one-shot slot a blocking caller waits on (a lock handoff: no Condition, no queue)."""

    __slots__ = ("_lock", "value", "deadline")

    def __init__(self, deadline: float | None = None) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.value: Any = None
        self.deadline = deadline  # see `caller_deadline`

    def set(self, value: Any) -> None:
        self.value = value
        self._lock.release()

    def wait(self, timeout: float | None) -> bool:
        return self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))


class AsyncReply:
    """A one-shot slot that resolves an asyncio future on its own loop's thread."""

    __slots__ = ("_loop", "future", "deadline")

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float | None = None) -> None:
        self._loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.deadline = deadline  # see `caller_deadline`

    def set(self, value: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(_resolve, self.future, value)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():  # cancelled or timed out: drop the late reply
        future.set_result(value)


class Call:
    """One message for an actor: run ``fn(server)``, reply, then run ``after(result)``.

    `after` runs in the actor thread once the caller already has its reply, so bookkeeping
    (the call's log line, the operation history) never delays the caller.
    """

    __slots__ = ("fn", "reply", "after")

    def __init__(
        self,
        fn: Callable[[Any], Any],
        reply: Reply | None = None,
        after: Callable[[Any], None] | None = None,
    ) -> None:
        self.fn = fn
        self.reply = reply
        self.after = after


class Lifecycle:
    """What an actor reports about itself to whoever spawned it."""

    __slots__ = ("thread", "server", "closed")

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.server: Any = None
        self.closed = threading.Event()  # set when the server's close() has finished

    def wait_closed(self, timeout: float | None) -> bool:
        """Wait for cleanup to finish and the actor thread to end."""
        if not self.closed.wait(timeout):
            return False
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            return not thread.is_alive()
        return True


class KeyActor(pykka.ThreadingActor):
    """Owns the server instance of one key; runs its calls one at a time, in order.

    Never raises out of a message: a failing handler gives an error `ToolResult` and the
    state stays. (A ``tell`` that raises would stop a pykka actor, and a ``BaseException``
    would make pykka stop every actor in the process.) You should not create these
    yourself; the registry does.
    """

    use_daemon_thread = True

    @classmethod
    def launch(
        cls, factory: Callable[[], Any], lifecycle: Lifecycle, on_done: Callable[[], None]
    ) -> KeyActor:
        """Start an actor without adding it to pykka's global `ActorRegistry`.

        That registry is a linear list (unregistering is O(n), which makes stopping 10,000
        actors quadratic), and its `stop_all()` would reach our actors from unrelated code.
        The ctxactors registry keeps its own dict of keys instead.
        """
        actor = cls(factory, lifecycle, on_done)
        actor._start_actor_loop()
        return actor

    @staticmethod
    def _create_actor_inbox() -> Any:
        return queue.SimpleQueue()

    def __init__(
        self,
        factory: Callable[[], Any],
        lifecycle: Lifecycle,
        on_done: Callable[[], None],
    ) -> None:
        super().__init__()
        self._factory = factory
        self._lifecycle = lifecycle
        self._on_done = on_done
        self._server: Any = None
        self._start_error: BaseException | None = None

    def on_start(self) -> None:
        self._lifecycle.thread = threading.current_thread()
        try:
            self._server = self._factory()
        except BaseException as exc:  # noqa: BLE001 - report it on every call instead
            self._start_error = exc
            _log.error("server_start_failed", exc_info=exc)
        self._lifecycle.server = self._server

    def on_receive(self, message: Any) -> None:
        call: Call = message
        _running.deadline = getattr(call.reply, "deadline", None)
        try:
            if self._start_error is not None:
                raise RuntimeError(f"server failed to start: {self._start_error}")
            result = call.fn(self._server)
        except BaseException as exc:  # noqa: BLE001
            result = ToolResult.from_exception(exc)
        finally:
            _running.deadline = None
            # Account for the call before replying, so a caller that has its result also
            # sees the key as idle (and a retiring key stops right after this message).
            self._on_done()
        if call.reply is not None:
            call.reply.set(result)
        if call.after is not None:
            try:
                call.after(result)
            except Exception as exc:  # noqa: BLE001 - bookkeeping never fails a call
                _log.error("after_call_failed", exc_info=exc)

    def on_stop(self) -> None:
        try:
            if self._server is not None:
                self._server.close()
        except BaseException as exc:  # noqa: BLE001
            _log.error("server_close_failed", exc_info=exc)
        finally:
            self._lifecycle.closed.set()
