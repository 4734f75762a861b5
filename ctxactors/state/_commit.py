"""Group commit: saves from many actor threads written together, each caller answered when
its own save is durable.

One writer thread takes the first waiting save, then every save that arrived while the
previous batch was being written, and writes them in one transaction (SQLite) or one
pipeline (Redis). Under load that turns N fsyncs into one; alone, a save costs one
transaction as before. Measured beside a plain save by ``scripts/bench_store.py``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence

from ctxactors.state._base import Outcome, StateStore, StoreError, StoreUnavailableError, Write

# Called in the writer thread with the save's revision, or the error that refused it.
Done = Callable[[Outcome | StoreError], None]


class GroupCommit:
    """The single writer in front of a store. `save` blocks; `submit` calls back."""

    def __init__(self, store: StateStore, *, max_batch: int = 512) -> None:
        self.store = store
        self.max_batch = max_batch
        self.batches = 0  # transactions written: saves / batches is the grouping factor
        self.saves = 0
        # Told (in the writer thread) each batch's seconds and outcomes: the store metrics.
        self.on_write: Callable[[float, Sequence[Outcome | StoreError]], None] | None = None
        self._queue: queue.SimpleQueue[tuple[Write, Done] | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ctxactors-commit", daemon=True)
        self._thread.start()

    def submit(self, write: Write, done: Done) -> None:
        if self._closed:
            done(StoreUnavailableError("the state store is closed"))
            return
        self._queue.put((write, done))

    def save(self, write: Write, timeout: float | None = None) -> int:
        """Save and wait until the store has it; returns the new revision.

        Raises `StaleStateError` (reload first), `StoreUnavailableError`, or TimeoutError
        when `timeout` passes first (the save may still land: the caller can't know).
        """
        slot: list[Outcome | StoreError] = []
        landed = threading.Event()

        def done(outcome: Outcome | StoreError) -> None:
            slot.append(outcome)
            landed.set()

        self.submit(write, done)
        if not landed.wait(timeout):
            raise TimeoutError("the state store did not confirm the save in time")
        outcome = slot[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                self._fail_rest()
                return
            batch = [first]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._write(batch)
            if stop:
                self._fail_rest()
                return

    def _write(self, batch: list[tuple[Write, Done]]) -> None:
        outcomes: list[Outcome | StoreError]
        started = time.perf_counter()
        try:
            outcomes = list(self.store.write([w for w, _ in batch]))
        except StoreError as exc:
            outcomes = [exc] * len(batch)
        except Exception as exc:  # noqa: BLE001 - a store bug must not strand its callers
            outcomes = [StoreUnavailableError(f"{type(exc).__name__}: {exc}")] * len(batch)
        self.batches += 1
        self.saves += len(batch)
        if self.on_write is not None:
            self.on_write(time.perf_counter() - started, outcomes)
        for (_, done), outcome in zip(batch, outcomes, strict=True):
            done(outcome)

    def _fail_rest(self) -> None:
        # Saves submitted after close() raced past the closed flag: answer them, never hang.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[1](StoreUnavailableError("the state store is closed"))
