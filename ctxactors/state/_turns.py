"""A lock a long job gives up between its steps to the threads waiting for it: `TurnLock`.

The SQLite store's retention purge deletes expired sessions a batch per transaction, under
the store's lock. Releasing a `threading.Lock` between two batches is not enough: the
releasing thread takes it back at once, before a waiter woken by the release has even run,
so saves would still wait for the whole purge. `yield_turn` waits (lock released) until
every thread that was waiting when it was called has had the lock once: a save then waits
for one batch at most, whatever the purge's size.
"""

from __future__ import annotations

import threading


class TurnLock:
    """A mutex (``with lock:``) whose holder, having released it, may let the threads that
    wait for it go first (`yield_turn`). Uncontended, it costs one non-blocking acquire."""

    __slots__ = ("_lock", "_turns", "_waiting", "_served")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._turns = threading.Condition(threading.Lock())
        self._waiting = 0  # threads blocked in `__enter__` now
        self._served = 0  # threads that got the lock after blocking for it, ever

    def __enter__(self) -> None:
        if self._lock.acquire(blocking=False):
            return
        with self._turns:
            self._waiting += 1
        self._lock.acquire()
        with self._turns:
            self._waiting -= 1
            self._served += 1
            self._turns.notify_all()

    def __exit__(self, *_: object) -> None:
        self._lock.release()

    @property
    def waiting(self) -> int:
        """How many threads are blocked waiting for the lock now."""
        return self._waiting

    def yield_turn(self) -> None:
        """With the lock not held: return once each thread waiting for it now has had it
        (at once if none waits). Threads that come later get no such precedence."""
        with self._turns:
            target = self._served + self._waiting
            while self._served < target:
                self._turns.wait()
