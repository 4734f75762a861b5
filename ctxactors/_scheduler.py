"""Key actors on a small pool of worker threads, not an OS thread each.

A `PoolActor` is a pykka actor (an `ActorRef`, ``tell``, ``stop``, the same lifecycle) whose
inbox, when a message arrives and the actor is idle, puts the actor on its `Dispatcher`'s
run queue. A worker then runs up to `THROUGHPUT` of its messages and hands it back (to the
end of the queue if more are waiting, so a busy key can't starve the others): one key's
messages still run one at a time and in order, and no state is shared between keys. This
is Akka's dispatcher, in the small:

- **Blocking work** (`@tool(blocking=True)`) runs on a separate, elastic pool
  (`BlockingPool`), as Akka separates its blocking dispatcher: a tool that waits on a
  subprocess or on another key's answer holds none of the few workers.
- **Async tools** park their actor: the coroutine runs on the runtime's loop
  (`ctxactors._tool_loop`) while the actor, still marked scheduled, holds no thread; once
  the coroutine is done the actor is queued again to finish that call (save, reply) before
  its next one.
- **No hop when none is needed**: a blocking `Runtime.call` to an idle key runs a plain sync
  tool on the caller's own thread (`PoolActor.post`), exactly as a worker would have, never
  on a thread that is running an event loop.

An idle key is its server's state plus this object: pykka's own constructor (a uuid, a
`threading.Event` and an `ActorRef` per actor, about 1.5 KiB) is skipped, and those are
made only if asked for.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from _thread import allocate_lock
from collections import deque
from collections.abc import Callable
from contextvars import Context
from typing import Any

import pykka
from pykka import messages

from ctxactors._actors import (
    AsyncReply,
    Flag,
    Lifecycle,
    SyncReply,
    answer_unrun,
    close_server,
    pykka_message,
    send_deferred,
    set_actor,
)
from ctxactors._call import Envelope, execute, resume
from ctxactors._fair import FairQueue
from ctxactors.logs import lazy_logger
from ctxactors.results import ToolResult
from ctxactors.tools import Server

_base_close = Server.close

_log = lazy_logger("ctxactors.actors")
_SCHED_BATCH: int | None = getattr(os, "SCHED_BATCH", None)  # Linux only

# Messages one worker runs for an actor before handing it back (fairness between keys).
THROUGHPUT = 16
_STOP = object()  # our own stop message (pykka's `_ActorStop` in an envelope works too)
_get_running_loop = asyncio._get_running_loop  # C-level; no exception when there is none


class Dispatcher:
    """A bounded pool of worker threads running actors that have messages.

    Runnable actors wait in a `FairQueue` by principal: when keys of several principals are
    runnable, a worker that frees takes the key of the first principal in line that holds
    no worker now, else the next principal's in turn; so one principal with many busy keys
    can't hold every worker while another principal's key waits behind them (at most
    `workers` principals hold one, so the search is short). Keys of one principal (all of
    them, without authentication) run first come, first served, as before.

    The threads start with the first actor that needs one, so a runtime that never gets a
    call starts none.
    """

    def __init__(self, workers: int, *, blocking: BlockingPool, name: str = "ctxactors") -> None:
        if workers < 1:
            raise ValueError("a dispatcher needs at least one worker")
        self.workers = workers
        self.blocking = blocking
        self._name = name
        self._runnable: FairQueue[PoolActor] = FairQueue()
        self._runnable_lock = allocate_lock()
        # One token a runnable actor (a worker that gets one takes the next actor in turn),
        # None to stop: the C queue does the waiting and waking.
        self._tokens: queue.SimpleQueue[bool | None] = queue.SimpleQueue()
        # Whose key each worker runs now (`_FREE`: none). Written by that worker alone, read
        # by any: a stale read only makes one choice of turn less fair.
        self._holding: list[Any] = [_FREE] * workers
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def _holds_none(self, owner: Any) -> bool:
        return owner not in self._holding

    def submit(self, actor: PoolActor) -> None:
        """Run `actor` on a worker (it is marked scheduled: nobody else runs it meanwhile)."""
        owner = actor.owner()
        with self._runnable_lock:
            self._runnable.put(owner, actor)
        self._tokens.put(True)
        if not self._threads:
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._threads or self._closed:
                return
            threads = [
                threading.Thread(
                    target=self._work, args=(i,), name=f"{self._name}-worker-{i}", daemon=True
                )
                for i in range(self.workers)
            ]
            for thread in threads:
                thread.start()
            self._threads = threads

    def _work(self, index: int) -> None:
        _batch_scheduling()
        get = self._tokens.get
        lock = self._runnable_lock
        take = self._runnable.take
        holds_none = self._holds_none
        holding = self._holding
        while True:
            if get() is None:
                return
            with lock:
                owner, actor = take(holds_none)
                holding[index] = owner
            actor.run(False)
            holding[index] = _FREE

    def close(self) -> None:
        """Stop the workers once the queue ahead of them is done (after the actors stop)."""
        with self._lock:
            self._closed = True
            threads = self._threads
        for _ in threads:
            self._tokens.put(None)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10.0)
        self.blocking.close()


class BlockingPool:
    """Threads for blocking tools: made when none is idle (up to `max_threads`), retired
    after `idle` seconds without work (`concurrent.futures.ThreadPoolExecutor` never
    retires its threads).

    Shared fairly between principals: queued jobs are taken round-robin by principal, and
    one principal runs at most `per_principal` at once (default an eighth of the pool);
    the rest of its jobs wait in the queue, holding no thread, so a principal that floods
    the pool with CPU-heavy work (indexing megabyte documents, say) leaves the other
    principals threads to start on, and itself no more than its share of them. Callers with
    no principal (an embedded runtime, a server without authentication) are one tenant
    under `max_threads` only. The cost: a principal whose `per_principal` blocking calls
    all wait for more of its own blocking calls (batches of batches) waits for their call
    timeouts.
    """

    def __init__(
        self, max_threads: int = 512, *, idle: float = 30.0, per_principal: int | None = None
    ) -> None:
        if max_threads < 1:
            raise ValueError("a blocking pool needs at least one thread")
        self.max_threads = max_threads
        self.per_principal = (
            per_principal if per_principal is not None else max(1, max_threads // 8)
        )
        if self.per_principal < 1:
            raise ValueError("per_principal must be at least 1")
        self._idle_timeout = idle
        self._lock = threading.Lock()
        self._jobs: FairQueue[PoolActor] = FairQueue()
        self._running: dict[Any, int] = {}  # jobs running, by principal
        self._threads: set[threading.Thread] = set()
        # Idle threads, each waiting to acquire its own lock: `submit` releases one (and
        # takes it off this list: a thread is woken once, never lost to a timeout).
        self._idle: list[tuple[Any, threading.Thread]] = []
        self._closed = False

    def _may_run(self, owner: Any) -> bool:
        return owner is None or self._running.get(owner, 0) < self.per_principal

    def submit(self, actor: PoolActor) -> None:
        owner = actor.owner()
        with self._lock:
            self._jobs.put(owner, actor)
            if not self._may_run(owner):
                return  # at its share: one of its own running jobs takes it when done
            if self._idle:
                self._idle.pop()[0].release()
                return
            if self._closed or len(self._threads) >= self.max_threads:
                return  # queued: the next thread to finish takes it
            thread = threading.Thread(target=self._work, name="ctxactors-blocking", daemon=True)
            self._threads.add(thread)
        thread.start()

    def _work(self) -> None:
        me = threading.current_thread()
        lock, running = self._lock, self._running
        owner: Any = _NO_JOB
        while True:
            with lock:
                if owner is not _NO_JOB:  # the job this thread just ran
                    left = running[owner] - 1
                    if left:
                        running[owner] = left
                    else:
                        del running[owner]
                taken = self._jobs.take_if(self._may_run)
                if taken is None:
                    owner = _NO_JOB
                    if self._closed:
                        self._threads.discard(me)
                        return
                    waiter = allocate_lock()
                    waiter.acquire()
                    self._idle.append((waiter, me))
                else:
                    owner, actor = taken
                    running[owner] = running.get(owner, 0) + 1
            if taken is not None:
                actor.run(True)
            elif not waiter.acquire(timeout=self._idle_timeout):
                with lock:
                    if (waiter, me) in self._idle:  # not woken meanwhile: retire
                        self._idle.remove((waiter, me))
                        self._threads.discard(me)
                        return

    def close(self) -> None:
        """Let every thread end once the jobs ahead of it are done; idle ones end now (a
        busy one may be stuck in a tool or a cleanup the runtime has already stopped
        waiting for, and is not waited for)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for waiter, _ in idle:
            waiter.release()
        deadline = time.monotonic() + 1.0
        for _, thread in idle:
            if thread is not threading.current_thread():
                thread.join(timeout=max(deadline - time.monotonic(), 0.0))


_NO_JOB = object()
_FREE = object()  # a worker's `Dispatcher._holding` slot while it runs no key


class PoolActor(pykka.Actor):
    """Owns the server instance of one key; runs its calls one at a time, in order, on
    whichever worker has it. You should not create these yourself; the registry does.

    Never raises out of a message: a failing handler gives an error `ToolResult` and the
    state stays.
    """

    def __init__(
        self, factory: Callable[[], Any], lifecycle: Lifecycle, dispatcher: Dispatcher
    ) -> None:
        # Not pykka's `__init__`: see the module docstring; `actor_urn` and `actor_ref` are
        # made on first use.
        self.actor_inbox = self._create_actor_inbox()
        self.actor_stopped = Flag()  # type: ignore[assignment] # Event's is_set, set, wait
        self._factory = factory
        self._lifecycle = lifecycle
        self._dispatcher = dispatcher
        self._queue: deque[Any] = deque()
        self._lock = allocate_lock()
        # True from a message's arrival at an idle actor until a worker finds it idle again
        # (parked included): whoever sets it runs the actor, nobody else.
        self._scheduled = False
        self._started = False
        self._server: Any = None
        self._start_error: BaseException | None = None
        self._resumed: tuple[Envelope, ToolResult] | None = None

    @classmethod
    def launch(
        cls, factory: Callable[[], Any], lifecycle: Lifecycle, dispatcher: Dispatcher
    ) -> PoolActor:
        """An actor for one key; its server is made by the first run (no thread starts)."""
        return cls(factory, lifecycle, dispatcher)

    @property  # type: ignore[override]
    def actor_urn(self) -> str:  # type: ignore[override]
        urn: str | None = self.__dict__.get("_urn")
        if urn is None:
            import uuid

            urn = self.__dict__["_urn"] = uuid.uuid4().urn
        return urn

    @property
    def actor_ref(self) -> pykka.ActorRef[Any]:  # type: ignore[override]
        ref: pykka.ActorRef[Any] | None = self.__dict__.get("_actor_ref")
        if ref is None:
            ref = self.__dict__["_actor_ref"] = pykka.ActorRef(self)
        return ref

    # -- pykka's hooks for a concurrency model ---------------------------------------------

    def _create_actor_inbox(self) -> Any:  # type: ignore[override]
        """The inbox is the actor itself (`put`, `get`, `empty`): a put can then schedule
        it with no further object per key."""
        return self

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        """For pykka's own ``ask`` (a proxy, say): answered from a worker thread."""
        return pykka.ThreadingFuture()

    def _start_actor_loop(self) -> None:
        """Nothing to start: the first message puts the actor on a worker."""

    def owner(self) -> Any:
        """Whose key this is (its principal; None without one): the pools share their
        threads fairly between owners."""
        key = getattr(self._lifecycle, "key", None)
        return None if key is None else key[1][0]  # `Key.principal`, without the call

    # -- the inbox protocol ----------------------------------------------------------------

    def put(self, message: Any, /) -> None:
        """Queue a message; an idle actor goes to its dispatcher's run queue."""
        self._queue.append(message)
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        self._dispatcher.submit(self)

    def get(self) -> Any:
        return self._queue.popleft()

    def empty(self) -> bool:
        return not self._queue

    # -- sending -------------------------------------------------------------------------

    def post(self, envelope: Envelope) -> None:
        """Send a call. A blocking caller's plain sync call to an idle key runs here, on the
        caller's thread (no hop), unless this thread is running an event loop."""
        if self.actor_stopped.is_set():
            raise pykka.ActorDeadError(f"{self.actor_ref} not found")
        reply = envelope.reply
        if type(reply) is AsyncReply:
            reply.send_later(self, envelope)  # one burst a loop iteration
            return
        send_deferred()  # this thread's earlier calls first: one key's calls stay in order
        spec = envelope.spec
        if (
            type(reply) is SyncReply
            and not spec.blocking
            and not spec.is_async
            # What runs after the reply must not hold up its caller (`add_observer`).
            and not envelope.host.observers
            and _get_running_loop() is None
        ):
            with self._lock:
                mine = not self._scheduled and not self._queue
                if mine:
                    self._scheduled = True
            if mine:
                self._run_here(envelope)
                return
        self.put(envelope)

    def stop(self) -> None:
        if not self.actor_stopped.is_set():
            self.put(_STOP)

    def stop_if_idle(self) -> bool:
        """Stop now, on this thread, if no worker has the actor, nothing is queued and its
        server has no cleanup of its own (the reaper's way: a million idle keys are a
        million jobs saved; a cleanup that may hang is never run on its caller's thread).
        False otherwise."""
        if _has_cleanup(self._server):
            return False
        with self._lock:
            if self._scheduled or self._queue:
                return False
            self._scheduled = True  # for good: a stopped actor never runs again
        previous = set_actor(self._lifecycle)
        try:
            self._stop()
        finally:
            set_actor(previous)
        return True

    # -- running -------------------------------------------------------------------------

    def _run_here(self, envelope: Envelope) -> None:
        previous = set_actor(self._lifecycle)
        try:
            if not self._started:
                self._start()
            # In a context of its own, as on a worker: the caller's context variables
            # (a structlog binding, say) don't reach the call, nor the call's the caller.
            Context().run(execute, envelope, self._server, self._lifecycle, self._start_error)
        finally:
            set_actor(previous)
            # Even as an exception leaves (Ctrl-C in the caller's thread): a key left marked
            # as running would never run again.
            self._release()

    def run(self, blocking_thread: bool) -> None:
        """Run up to `THROUGHPUT` messages (a worker's turn), then hand the actor back."""
        previous = set_actor(self._lifecycle)
        try:
            # In a context of its own, as a call run in place: a context variable one key's
            # call sets (a structlog binding, say) must not reach the next key's on this
            # worker, which may be another principal's.
            if Context().run(self._drain, blocking_thread):
                return  # parked, stopped, or moved to the blocking pool: still scheduled
        except BaseException as exc:  # noqa: BLE001 - a worker must outlive any actor
            _log.error("actor_run_failed", exc_info=exc)
        finally:
            set_actor(previous)
        self._release()

    def _drain(self, blocking_thread: bool) -> bool:
        """Run queued messages; True when the actor must not be released now."""
        if not self._started:
            self._start()
        server, lifecycle, start_error = self._server, self._lifecycle, self._start_error
        resumed = self._resumed
        if resumed is not None:
            self._resumed = None
            resume(resumed[0], server, lifecycle, resumed[1])
        pending = self._queue
        for _ in range(THROUGHPUT):
            if not pending:
                return False
            message = pending[0]
            if type(message) is Envelope:
                spec = message.spec
                # An async tool behind call wrappers (metrics, tracing) waits on its thread:
                # the wrappers time the body, so it can't be parked.
                waits = spec.blocking or (spec.is_async and message.body is not None)
                if waits and not blocking_thread:
                    self._dispatcher.blocking.submit(self)
                    return True
                pending.popleft()
                if spec.is_async and message.body is None:
                    parked: list[bool] = []
                    execute(message, server, lifecycle, start_error, self._parker(parked))
                    if parked:
                        return True
                else:
                    execute(message, server, lifecycle, start_error)
            else:
                if message is _STOP or isinstance(getattr(message, "message", None), _Stop):
                    if _has_cleanup(server) and not blocking_thread:
                        # A cleanup may wait (processes to die, files to go): not here.
                        self._dispatcher.blocking.submit(self)
                        return True
                    pending.popleft()
                    self._stop()
                    reply_to = getattr(message, "reply_to", None)
                    if reply_to is not None:  # pykka's `ActorRef.stop(block=True)`
                        reply_to.set(None)
                    self._answer_rest()
                    return True
                pending.popleft()
                self._pykka_message(message)
        return False

    def _parker(self, parked: list[bool]) -> Callable[[Envelope, Any], None]:
        def park(envelope: Envelope, coroutine: Any) -> None:
            parked.append(True)

            def done(value: Any, error: BaseException | None) -> None:
                spec = envelope.spec
                ctx = envelope.call.ctx
                result = spec.failed(error, ctx) if error is not None else spec.returned(value)
                self._resumed = (envelope, result)
                self._dispatcher.submit(self)  # still scheduled: its worker runs it next

            envelope.host.tool_loop.submit(coroutine, envelope.call.deadline, done)

        return park

    def _release(self) -> None:
        with self._lock:
            if not self._queue:
                self._scheduled = False
                return
        self._dispatcher.submit(self)  # more to do: to the end of the line

    def _start(self) -> None:
        self._started = True
        try:
            self._server = self._factory()
        except BaseException as exc:  # noqa: BLE001 - report it on every call instead
            self._start_error = exc
            _log.error("server_start_failed", exc_info=exc)
        self._lifecycle.server = self._server

    def _stop(self) -> None:
        self.actor_stopped.set()
        close_server(self._server, self._lifecycle)

    def _answer_rest(self) -> None:
        while self._queue:
            answer_unrun(self._queue.popleft())

    def _pykka_message(self, envelope: Any) -> None:
        pykka_message(self, envelope)


_Stop: type = messages._ActorStop  # noqa: SLF001 - pykka's stop, sent through an `ActorRef`


def _has_cleanup(server: Any) -> bool:
    """Whether the server overrides `Server.close` (a cleanup that may take a while)."""
    if server is None:
        return False
    close = getattr(type(server), "close", None)
    return close is not None and close is not _base_close


def _batch_scheduling() -> None:
    """Ask the OS to schedule this worker as batch work (see `KeyActor.batch_scheduling`)."""
    if _SCHED_BATCH is not None:
        try:
            os.sched_setscheduler(0, _SCHED_BATCH, os.sched_param(0))
        except OSError:
            pass
