"""Group commit: saves from many actor threads written together, each caller answered when
its own save is durable.

The first save to arrive while nothing is being written writes itself, at once, in its
own thread (the leader): alone, a save costs one transaction and no thread hop (a writer
thread for every save cost two extra wake-ups, which halved single-stream throughput
here). Saves that arrive while a write is under way queue up, and are written together in
one transaction (SQLite) or one pipeline (Redis), each answered with its own outcome:

- under load a leader first yields the CPU once (`_gather`), so the calls finishing right
  now queue their saves and join its transaction (on one CPU, batches of 20-30 instead
  of 2-3);
- after its batch, the leader hands what queued to a caller that waits (`save`: it writes
  the next batch itself) or, when only callbacks wait (`submit`, `write_or_queue`: saves
  whose callers went on), to the writer thread, which writes until nothing waits;
- a save with a callback never waits: `write_or_queue` writes at once when the store is
  idle, else queues and calls back from the writing thread (how a key actor goes on to its
  next message while its save waits, see `ctxactors.durable`).

Measured by ``scripts/bench_store.py``.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from ctxactors.logs import lazy_logger
from ctxactors.state._base import Outcome, StateStore, StoreError, StoreUnavailableError, Write

_log = lazy_logger("ctxactors.state")

# Gives the CPU to the other runnable threads (and the GIL with it).
_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: time.sleep(0))

# Set in a thread while it answers a written batch (see `answering`).
_answering = threading.local()


def answering() -> bool:
    """True in a thread answering a batch of saves: what runs there (a save's callback, a
    caller's reply) must not wait for another save, which would wait for this thread."""
    return getattr(_answering, "on", False)


# Called in the writing thread with the save's revision, or the error that refused it.
Done = Callable[[Outcome | StoreError], None]


class Pending:
    """One save on its way: a blocked caller (`wake` unlocks it) or a callback (`done`,
    or a subclass's own `answer`)."""

    __slots__ = ("write", "done", "wake", "outcome", "batch")

    def __init__(self, write: Write, done: Done | None) -> None:
        self.write = write
        self.done = done
        self.wake: threading.Lock | None = None  # made only when the caller must wait
        self.outcome: Outcome | StoreError | None = None
        self.batch: list[Pending] | None = None  # set when handed the lead

    def answer(self, outcome: Outcome | StoreError) -> None:
        if self.done is not None:
            try:
                self.done(outcome)
            except Exception as exc:  # noqa: BLE001 - one callback must not strand the rest
                _log.error("save_callback_failed", exc_info=exc)
            return
        self.outcome = outcome
        if self.wake is not None:
            self.wake.release()


class GroupCommit:
    """Writes saves to a store, many at a time. `save` blocks; `submit` calls back."""

    def __init__(self, store: StateStore, *, max_batch: int = 512) -> None:
        self.store = store
        self.max_batch = max_batch
        self.batches = 0  # transactions written: saves / batches is the grouping factor
        self.saves = 0
        self._last = 0
        self._lock = threading.Lock()
        self._queue: deque[Pending] = deque()
        self._writing = False
        # Told (in the writing thread) each batch's seconds and outcomes: the store metrics.
        self.on_write: Callable[[float, Sequence[Outcome | StoreError]], None] | None = None
        self._closed = False
        self._idle = threading.Condition(self._lock)
        # The writer thread, started on first need, leads when released by `_handoff`.
        self._writer: threading.Thread | None = None
        self._handoff = threading.Lock()
        self._handoff.acquire()
        self._stopped = False

    def submit(self, write: Write, done: Done) -> None:
        """Save, and call `done` with the outcome once written (maybe in this thread)."""
        pending = Pending(write, done)
        if self._enqueue(pending):
            self._lead([pending])

    def write_or_queue(self, pending: Pending) -> bool:
        """Write `pending` now, in this thread, when the store is idle: True, and its
        `outcome` is set (nothing is called back). Else queue it and return False: the
        writing thread calls its `answer` once the store has answered, so `pending` must be
        ready for that before this call (its `done`, or a subclass's `answer`, as
        `ctxactors.durable` makes)."""
        with self._lock:
            if self._closed:
                pending.outcome = StoreUnavailableError("the state store is closed")
                return True
            if self._writing:
                self._queue.append(pending)
                return False
            self._writing = True
        batch = [pending]
        pending.batch = batch  # the leader: its outcome is set, it is not answered
        self._lead(batch)
        pending.batch = None  # a cycle (it is in the batch) for the GC to find otherwise
        return True

    def withdraw(self, write: Write) -> bool:
        """Take a save that still waits its turn back out of the queue (it is then never
        written, nor answered); False when it is being written or was."""
        with self._lock:
            for pending in self._queue:
                if pending.write is write:
                    self._queue.remove(pending)
                    return True
        return False

    def save(self, write: Write, timeout: float | None = None) -> int:
        """Save and wait until the store has it; returns the new revision.

        Raises `StaleStateError` (reload first), `StoreUnavailableError`, or TimeoutError
        when `timeout` passes while the save still waits its turn (it is then never
        written). A write under way is not interrupted: the store's own timeouts bound it.
        """
        pending = Pending(write, None)
        if self._enqueue(pending):
            self._lead([pending])
        elif pending.wake is not None:  # queued (else refused: answered already)
            woken = pending.wake.acquire(timeout=-1 if timeout is None else timeout)
            if not woken:
                with self._lock:
                    if pending in self._queue:
                        self._queue.remove(pending)
                        raise TimeoutError("the state store did not confirm the save in time")
                pending.wake.acquire()  # handed the lead or answered meanwhile: it's quick
            if pending.batch is not None:
                self._lead(pending.batch)
                pending.batch = None  # see `write_or_queue`
        outcome = pending.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome

    def _enqueue(self, pending: Pending) -> bool:
        """Queue `pending`, or return True when the store is idle: the caller writes now."""
        with self._lock:
            if self._closed:
                refused = StoreUnavailableError("the state store is closed")
            elif not self._writing:
                self._writing = True
                return True
            else:
                if pending.done is None:
                    pending.wake = threading.Lock()
                    pending.wake.acquire()
                self._queue.append(pending)
                return False
        pending.answer(refused)
        return False

    def _lead(self, batch: list[Pending]) -> None:
        """Write `batch` (with what queues meanwhile), then hand what waits on: to a caller
        that waits (it writes its batch itself), else to the writer thread."""
        self._gather(batch)
        self._write(batch)
        with self._lock:
            if self._done_writing():
                return
            count = min(len(self._queue), self.max_batch)
            batch = [self._queue.popleft() for _ in range(count)]
            heir = next((p for p in batch if p.wake is not None), None)
            if heir is not None:
                heir.batch = batch
            else:
                self._queue.extendleft(reversed(batch))
        if heir is not None:
            assert heir.wake is not None
            heir.wake.release()
        else:
            self._hand_to_writer()

    def _gather(self, batch: list[Pending]) -> None:
        """Add what queued to `batch`, after letting the calls finishing now queue theirs.

        Only under load (saves queued now, or the last batch held more than one): then a
        yield gives the CPU to the other runnable threads (on one CPU, every call about to
        save), which turns a batch of two into one of tens. Alone, it would cost a lone
        save a system call and its CPU to another process.
        """
        if self._queue or self._last > 1:
            _yield()
            with self._lock:
                take = min(len(self._queue), self.max_batch - len(batch))
                batch.extend([self._queue.popleft() for _ in range(take)])

    def _done_writing(self) -> bool:
        """With the lock held: True (and the store idle) when nothing waits."""
        if self._queue:
            return False
        self._writing = False
        if self._closed:
            self._idle.notify_all()
        return True

    def _hand_to_writer(self) -> None:
        """Let the writer thread lead: only saves written behind their calls wait, and their
        callers (key actors) have their own next calls to run."""
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_forever, name="ctxactors-group-commit", daemon=True
            )
            self._writer.start()
        self._handoff.release()

    def _write_forever(self) -> None:
        while True:
            self._handoff.acquire()
            if self._stopped:
                return
            while True:
                batch: list[Pending] = []
                self._gather(batch)
                self._write(batch)
                with self._lock:
                    if self._done_writing():
                        break

    def _write(self, batch: list[Pending]) -> None:
        outcomes: list[Outcome | StoreError]
        started = time.perf_counter()
        try:
            outcomes = list(self.store.write([p.write for p in batch]))
        except StoreError as exc:
            outcomes = [exc] * len(batch)
        except Exception as exc:  # noqa: BLE001 - a store bug must not strand its callers
            outcomes = [StoreUnavailableError(f"{type(exc).__name__}: {exc}")] * len(batch)
        self.batches += 1
        self.saves += len(batch)
        self._last = len(batch)
        if self.on_write is not None:
            self.on_write(time.perf_counter() - started, outcomes)
        _answering.on = True
        try:
            for pending, outcome in zip(batch, outcomes, strict=True):
                if pending.batch is not None:  # the leader: answered by returning, not woken
                    pending.outcome = outcome
                else:
                    pending.answer(outcome)
        finally:
            _answering.on = False

    def close(self) -> None:
        """Refuse new saves and wait until those already queued are written."""
        with self._lock:
            self._closed = True
            while self._writing:
                self._idle.wait()
            writer, self._stopped = self._writer, True
        if writer is not None:
            self._handoff.release()
            writer.join()
