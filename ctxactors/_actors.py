"""The per-key actor and the two reply paths back to the caller.

A `KeyActor` is a pykka thread actor that owns one server instance (the state of one key);
each message is an `Envelope` that `ctxactors._call.execute` runs. Messages are sent with
``tell`` and carry their own reply slot, instead of pykka's ``ask``
futures, for two reasons:

- speed: a ``SimpleQueue`` inbox plus a one-shot lock handoff is a lighter round trip than
  pykka's ``Queue``-based future;
- asyncio: an `AsyncReply` resolves an asyncio future with ``call_soon_threadsafe``, so an
  awaiting caller never blocks its event loop (``await`` on a pykka future would).

A reply that arrives after its caller timed out lands in an abandoned slot and can never be
taken for the reply to a later call: a thread reuses its slot only after a reply arrived.
Actor threads ask the OS to schedule them as batch work (`KeyActor.batch_scheduling`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import os
import queue
import sys
import threading
import time
import weakref
from _thread import allocate_lock as _allocate_lock
from collections import deque
from collections.abc import Callable
from typing import Any

import pykka

from ctxactors._call import Envelope, execute
from ctxactors.logs import lazy_logger
from ctxactors.results import ToolResult

_log = lazy_logger("ctxactors.actors")
_SCHED_BATCH: int | None = getattr(os, "SCHED_BATCH", None)  # Linux only


# The lifecycle of the actor whose thread this is (each actor has a thread of its own).
_here = threading.local()


def current_actor() -> Lifecycle | None:
    """The lifecycle of the actor running on this thread, or None off an actor thread."""
    actor: Lifecycle | None = getattr(_here, "actor", None)
    return actor


def set_actor(actor: Lifecycle | None) -> Lifecycle | None:
    """Say which actor this thread runs now (a pool worker, or a caller running a call
    in place); returns the one it ran before, to be set back."""
    previous: Lifecycle | None = getattr(_here, "actor", None)
    _here.actor = actor
    return previous


class Flag:
    """A one-way flag with `threading.Event`'s ``is_set``/``set``/``wait``, whose Event
    (a Condition and its lock: several hundred bytes) is made only if someone waits.

    A million idle keys each hold two of these (stopped, closed).
    """

    __slots__ = ("_set", "_event")

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True  # before the event is read: a waiter making one sees it set
        event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        with _flag_lock:
            if self._event is None:
                self._event = threading.Event()
        if self._set:
            return True
        return self._event.wait(timeout)


_flag_lock = threading.Lock()


class SyncReply:
    """A one-shot slot a blocking caller waits on (a lock handoff: no Condition, no queue).

    `Runtime.call` reuses one per thread (`take_sync_reply`, `recycle`): a slot whose
    caller gave up is never reused, so a late reply can only land where nobody looks.
    """

    __slots__ = ("_lock", "value", "deadline")

    def __init__(self, deadline: float | None = None) -> None:
        self._lock = _allocate_lock()
        self._lock.acquire()
        self.value: Any = None
        self.deadline = deadline  # see `caller_deadline`

    def start(self) -> str | None:
        return None  # a caller that timed out still gets its call run, as sent

    def set(self, value: Any) -> None:
        self.value = value
        self._lock.release()

    def wait(self, timeout: float | None) -> bool:
        # Positional: a keyword to a C method costs as much as the acquire itself.
        return self._lock.acquire(True, -1 if timeout is None else max(timeout, 0.0))

    def recycle(self) -> Any:
        """After a `wait` that got the reply: its value; the slot (its lock held again by
        that `wait`) becomes this thread's spare."""
        value, self.value = self.value, None
        _spares.reply = self
        return value


# Each thread's spare `SyncReply` (taken while a call of that thread is under way, so a
# call nested in it, from a signal handler say, gets a slot of its own).
_spares = threading.local()


def take_sync_reply(deadline: float) -> SyncReply:
    """This thread's spare reply slot, or a new one."""
    reply: SyncReply | None = getattr(_spares, "reply", None)
    if reply is None:
        return SyncReply(deadline)
    _spares.reply = None
    reply.deadline = deadline
    return reply


class AsyncReply:
    """A one-shot slot that resolves an asyncio future on its own loop's thread.

    Made on that loop's thread (`Runtime.acall`), where `expire` and `settle` are called too.
    """

    __slots__ = ("_replies", "future", "deadline")

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float | None = None) -> None:
        replies: _LoopReplies | None = getattr(_this_loop, "replies", None)
        if replies is None or replies.loop() is not loop:  # one loop per thread, as a rule
            replies = _loop_replies.get(loop)
            if replies is None:
                replies = _loop_replies.setdefault(loop, _LoopReplies(loop))
            _this_loop.replies = replies
        self._replies = replies
        self.future: asyncio.Future[Any] = loop.create_future()
        self.deadline = deadline  # see `caller_deadline`

    def start(self) -> str | None:
        return None

    def set(self, value: Any) -> None:
        self._replies.put(self.future, value)

    def send_later(self, inbox: Any, envelope: Envelope) -> None:
        """Put `envelope` into `inbox` at the end of this loop iteration (see `_LoopReplies`)."""
        self._replies.send_later(inbox, envelope)

    def expire(self) -> None:
        """Fail the future with `ReplyExpired` at `deadline`, unless it is done by then."""
        if self.deadline is not None:
            self._replies.expire_at(self.deadline, self.future)

    def settle(self) -> None:
        """The caller is done with the future (answered, expired or cancelled); after
        `expire`, once."""
        if self.deadline is not None:
            self._replies.settle()


class ReplyExpired(Exception):
    """An `AsyncReply` whose deadline passed first (`Runtime.acall` raises
    `CallTimeoutError`)."""


class _LoopReplies:
    """The replies on their way to one event loop, and the deadlines of their callers.

    One wake-up of the loop resolves every reply that arrived meanwhile
    (``call_soon_threadsafe`` writes to the loop's wake-up pipe and schedules a callback:
    once per batch, not once per reply). The callers' deadlines share one timer, armed for
    the earliest: a heap push per call instead of a `TimerHandle` (and its context copy)
    made and cancelled per call, which is what most of an `acall`'s own cost on the loop
    was. Holds its loop weakly, so a loop that is gone takes this with it.

    The calls go out in bursts too: the loop's calls are put into their actors' inboxes
    once per loop iteration, all together. A put wakes the actor's thread, which then asks
    for the GIL the loop is holding; woken one call at a time while the loop still has
    calls to send, 200 actor threads keep taking the GIL from the loop (the loop lag behind
    `scripts/bench_acall.py`'s p99). A thread that would block on an actor (a blocking
    `call`, `end_session` or `close` on the loop's own thread) sends the burst first, see
    `send_deferred`, which also keeps one thread's calls to a key in the order it made them.
    """

    __slots__ = (
        "loop",
        "_pending",
        "_scheduled",
        "_deadlines",
        "_armed",
        "_timer_at",
        "_waiting",
        "_outbox",
        "__weakref__",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = weakref.ref(loop)
        self._pending: deque[tuple[asyncio.Future[Any], Any]] = deque()
        self._scheduled = False
        # (deadline, order, future): a min-heap on the loop's thread only.
        self._deadlines: list[tuple[float, int, asyncio.Future[Any]]] = []
        # The timer is told which arming it is rather than kept (a `TimerHandle` holds its
        # loop): arming it again for an earlier deadline leaves the older one to do nothing.
        self._armed = 0
        self._timer_at = math.inf
        self._waiting = 0  # callers between `expire_at` and `settle`
        self._outbox: list[tuple[Any, Envelope]] = []  # (inbox, call): the loop's thread only

    def put(self, future: asyncio.Future[Any], value: Any) -> None:
        """From any thread: hand `value` to `future` on the loop's thread."""
        self._pending.append((future, value))
        if not self._scheduled:
            # Set before the drain can run, and cleared by the drain before it takes the
            # replies: a reply appended after the drain took its last sees it cleared.
            self._scheduled = True
            loop = self.loop()
            try:
                if loop is None:
                    raise RuntimeError("the loop is gone")
                loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                self._pending.clear()

    def _drain(self) -> None:
        self._scheduled = False
        pending = self._pending
        while pending:
            future, value = pending.popleft()
            if not future.done():  # cancelled or timed out: drop the late reply
                future.set_result(value)

    def send_later(self, inbox: Any, envelope: Envelope) -> None:
        outbox = self._outbox
        outbox.append((inbox, envelope))
        if len(outbox) == 1:
            loop = self.loop()
            if loop is None:  # not while acall runs on it: can't happen, but never lose it
                self.send()
            else:
                loop.call_soon(self.send)

    def send(self) -> None:
        """Put every call held back so far into its actor's inbox."""
        outbox, self._outbox = self._outbox, []
        for inbox, envelope in outbox:
            inbox.put(envelope)

    def expire_at(self, deadline: float, future: asyncio.Future[Any]) -> None:
        """On the loop's thread: fail `future` at `deadline` (`time.monotonic`) unless done."""
        self._waiting += 1
        heapq.heappush(self._deadlines, (deadline, next(_order), future))
        if deadline < self._timer_at:
            self._arm(deadline)

    def settle(self) -> None:
        """A caller of `expire_at` is done with its future.

        Done futures stay in the heap until their deadline passes: the heap is emptied when
        no caller waits (so a loop that is gone is not kept alive by its futures), and
        rid of its done futures when they outnumber the waiting callers (so it holds at
        most about twice the calls in flight: amortised O(1) a call).
        """
        self._waiting -= 1
        heap = self._deadlines
        if not self._waiting:
            heap.clear()  # the timer stays: it finds nothing, or the next call's deadline
        elif len(heap) > 2 * self._waiting + 64:
            heap[:] = [entry for entry in heap if not entry[2].done()]
            heapq.heapify(heap)

    def _arm(self, deadline: float) -> None:
        loop = self.loop()
        if loop is not None:
            self._armed += 1
            self._timer_at = deadline
            loop.call_later(deadline - time.monotonic(), self._expire, self._armed)

    def _expire(self, armed: int) -> None:
        if armed != self._armed:  # armed again since, for an earlier deadline
            return
        self._timer_at = math.inf
        heap, now = self._deadlines, time.monotonic()
        while heap and (heap[0][0] <= now or heap[0][2].done()):
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_exception(ReplyExpired())
        if heap:
            self._arm(heap[0][0])


# One `_LoopReplies` per event loop, gone with its loop; and the last one each thread used.
_loop_replies: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopReplies] = (
    weakref.WeakKeyDictionary()
)
_this_loop = threading.local()
_order = itertools.count()  # ties between equal deadlines, which futures can't break
_abandoned = threading.Lock()  # see `send_abandoned`


def send_deferred() -> None:
    """Send the calls this thread's event loop still holds back (see `_LoopReplies`)."""
    replies: _LoopReplies | None = getattr(_this_loop, "replies", None)
    if replies is not None and replies._outbox:
        replies.send()


def send_abandoned() -> None:
    """`send_deferred`, and the calls held back by loops closed before their next
    iteration (nothing else would send those; a closed loop's thread adds to them no more)."""
    send_deferred()
    with _abandoned:  # two threads must not both send the same calls
        # The underlying dict, copied in one step (iterating the WeakKeyDictionary itself
        # would fail if another thread's first acall on a new loop added to it meanwhile).
        every: list[_LoopReplies] = list(_loop_replies.data.values())  # type: ignore[attr-defined]
        for held in every:
            loop = held.loop()
            if held._outbox and loop is not None and loop.is_closed():
                held.send()


class Lifecycle:
    """What an actor reports about itself to whoever spawned it."""

    __slots__ = ("thread", "server", "closed")

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.server: Any = None
        self.closed = Flag()  # set when the server's close() has finished

    def finished(self) -> None:
        """Called in the actor's thread after each message, before its reply."""

    def wait_closed(self, timeout: float | None) -> bool:
        """Wait for cleanup to finish and the actor thread to end."""
        send_abandoned()  # the calls it waits for may be this thread's, not sent yet
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
    # Ask the OS to schedule actor threads as batch work (Linux ``SCHED_BATCH``): a woken
    # actor then waits for the thread that woke it to block, instead of preempting it. The
    # preemption bought nothing: the actor cannot run Python while the thread that sent it
    # the call holds the GIL, so it only cost two more context switches a call (measured
    # with ``scripts/bench_router.py``: about 2 µs of a call's 11 on one CPU).
    batch_scheduling = True

    @classmethod
    def launch(cls, factory: Callable[[], Any], lifecycle: Lifecycle) -> KeyActor:
        """Start an actor without adding it to pykka's global `ActorRegistry`.

        That registry is a linear list (unregistering is O(n), which makes stopping 10,000
        actors quadratic), and its `stop_all()` would reach our actors from unrelated code.
        The ctxactors registry keeps its own dict of keys instead.
        """
        actor = cls(factory, lifecycle)
        actor._start_actor_loop()
        return actor

    @staticmethod
    def _create_actor_inbox() -> Any:
        return queue.SimpleQueue()

    def __init__(self, factory: Callable[[], Any], lifecycle: Lifecycle) -> None:
        super().__init__()
        self._factory = factory
        self._lifecycle = lifecycle
        self._server: Any = None
        self._start_error: BaseException | None = None

    def on_start(self) -> None:
        if self.batch_scheduling and _SCHED_BATCH is not None:
            try:  # this thread only (0: the caller); nothing to lose where it is refused
                os.sched_setscheduler(0, _SCHED_BATCH, os.sched_param(0))
            except OSError:
                pass
        self._lifecycle.thread = threading.current_thread()
        _here.actor = self._lifecycle
        try:
            self._server = self._factory()
        except BaseException as exc:  # noqa: BLE001 - report it on every call instead
            self._start_error = exc
            _log.error("server_start_failed", exc_info=exc)
        self._lifecycle.server = self._server

    def on_receive(self, message: Any) -> None:
        execute(message, self._server, self._lifecycle, self._start_error)

    def _actor_loop_running(self) -> None:
        """pykka's loop, with our calls (put in the inbox as they are, see `post`) run
        straight away: no pykka envelope, no look-up of pykka's own message types. Only a
        pykka message (a stop) can stop the actor, so only after one is that checked."""
        get = self.actor_inbox.get
        server, lifecycle, start_error = self._server, self._lifecycle, self._start_error
        stopped = self.actor_stopped
        while not stopped.is_set():
            message = get()
            while type(message) is Envelope:
                execute(message, server, lifecycle, start_error)
                message = get()
            self._pykka_message(message)

    def _pykka_message(self, envelope: Any) -> None:
        """One of pykka's own envelopes (a stop, say), as pykka's loop handles it."""
        pykka_message(self, envelope)

    def _actor_loop_teardown(self) -> None:
        while not self.actor_inbox.empty():
            answer_unrun(self.actor_inbox.get())

    def post(self, envelope: Envelope) -> None:
        """Send a call: into the inbox as it is (`_actor_loop_running` runs it)."""
        if self.actor_stopped.is_set():
            raise pykka.ActorDeadError(f"{self.actor_ref} not found")
        inbox: Any = self.actor_inbox  # a SimpleQueue that takes ours as well as pykka's
        if type(envelope.reply) is AsyncReply:
            envelope.reply.send_later(inbox, envelope)  # one burst a loop iteration
            return
        send_deferred()  # this thread's earlier calls first: one key's calls stay in order
        inbox.put(envelope)

    def on_stop(self) -> None:
        close_server(self._server, self._lifecycle)


def pykka_message(actor: pykka.Actor, envelope: Any) -> None:
    """One of pykka's own envelopes (a stop, an ``ask`` of a proxy), as pykka's own loop
    handles it, except that a `BaseException` stops only this actor (pykka would stop every
    actor in the process)."""
    reply_to = envelope.reply_to
    try:
        response = actor._handle_receive(envelope.message)
        if reply_to is not None:
            reply_to.set(response)
    except Exception:
        if reply_to is not None:
            reply_to.set_exception()
        else:
            actor._handle_failure(*sys.exc_info())
    except BaseException:  # noqa: BLE001
        actor._stop()


def answer_unrun(message: Any) -> None:
    """Answer a message found in a stopped actor's inbox. The registry sends no call after
    the stop; should one be there all the same, its caller gets an answer rather than a
    wait until its timeout."""
    if type(message) is Envelope:
        if message.reply is not None:
            message.reply.set(ToolResult.error("the key's actor stopped before the call"))
    elif getattr(message, "reply_to", None) is not None:
        message.reply_to.set(None)


def close_server(server: Any, lifecycle: Lifecycle) -> None:
    """A stopping actor's cleanup: its server's `close`, then `lifecycle.closed`."""
    try:
        if server is not None:
            server.close()
    except BaseException as exc:  # noqa: BLE001
        _log.error("server_close_failed", exc_info=exc)
    finally:
        lifecycle.closed.set()
