"""Group commit: saves from many actor threads written together, each caller answered when
its own save is durable.

There is no writer thread: the first save to arrive while nothing is being written writes
itself, at once, in its own thread (the leader). Saves that arrive while a write is under
way queue up; when it ends, the leader hands every queued save to the first queued caller,
which writes them all in one transaction (SQLite) or one pipeline (Redis) and answers each.
Under load that turns N commits into one; alone, a save costs one transaction and no thread
hop: a writer thread cost each save two extra wake-ups, which on a loaded machine are
chances to lose the CPU for a scheduler slice (it halved single-stream throughput here).
Measured by ``scripts/bench_store.py``.

Saves submitted with a callback (`submit`, for writes behind the calls) never wait: one
that finds the store idle is written by its own thread, one that finds it busy is written
by a later leader.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from ctxactors.state._base import Outcome, StateStore, StoreError, StoreUnavailableError, Write

# Gives the CPU to the other runnable threads (and the GIL with it).
_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: time.sleep(0))

# Called in the writing thread with the save's revision, or the error that refused it.
Done = Callable[[Outcome | StoreError], None]


class _Pending:
    """One queued save: a blocked caller (`wake` unlocks it) or a callback."""

    __slots__ = ("write", "done", "wake", "outcome", "batch")

    def __init__(self, write: Write, done: Done | None) -> None:
        self.write = write
        self.done = done
        self.wake: threading.Lock | None = None  # made only when the caller must wait
        self.outcome: Outcome | StoreError | None = None
        self.batch: list[_Pending] | None = None  # set when handed the lead

    def answer(self, outcome: Outcome | StoreError) -> None:
        if self.done is not None:
            self.done(outcome)
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
        self._queue: deque[_Pending] = deque()
        self._writing = False
        # Told (in the writing thread) each batch's seconds and outcomes: the store metrics.
        self.on_write: Callable[[float, Sequence[Outcome | StoreError]], None] | None = None
        self._closed = False
        self._idle = threading.Condition(self._lock)

    def submit(self, write: Write, done: Done) -> None:
        """Save, and call `done` with the outcome once written (maybe in this thread)."""
        pending = _Pending(write, done)
        if self._enqueue(pending):
            self._lead([pending])

    def save(self, write: Write, timeout: float | None = None) -> int:
        """Save and wait until the store has it; returns the new revision.

        Raises `StaleStateError` (reload first), `StoreUnavailableError`, or TimeoutError
        when `timeout` passes while the save still waits its turn (it is then never
        written). A write under way is not interrupted: the store's own timeouts bound it.
        """
        pending = _Pending(write, None)
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
        outcome = pending.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome

    def _enqueue(self, pending: _Pending) -> bool:
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

    def _lead(self, batch: list[_Pending]) -> None:
        """Write `batch`, then hand what queued meanwhile to a waiting caller (or write it
        here when only callbacks wait), until nothing waits."""
        while True:
            if self._queue or self._last > 1:
                # Let the calls finishing now (on one CPU: every runnable thread) queue their
                # saves first, and write them in this transaction instead of the next.
                _yield()
                with self._lock:
                    take = min(len(self._queue), self.max_batch - len(batch))
                    batch.extend([self._queue.popleft() for _ in range(take)])
            self._write(batch)
            self._last = len(batch)
            with self._lock:
                if not self._queue:
                    self._writing = False
                    if self._closed:
                        self._idle.notify_all()
                    return
                count = min(len(self._queue), self.max_batch)
                batch = [self._queue.popleft() for _ in range(count)]
                heir = next((p for p in batch if p.done is None), None)
                if heir is not None:
                    heir.batch = batch
            if heir is not None:
                assert heir.wake is not None
                heir.wake.release()
                return

    def _write(self, batch: list[_Pending]) -> None:
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
        if self.on_write is not None:
            self.on_write(time.perf_counter() - started, outcomes)
        for pending, outcome in zip(batch, outcomes, strict=True):
            if pending.batch is not None:  # the leader: answered by returning, not woken
                pending.outcome = outcome
            else:
                pending.answer(outcome)

    def close(self) -> None:
        """Refuse new saves and wait until those already queued are written."""
        with self._lock:
            self._closed = True
            while self._writing:
                self._idle.wait()
