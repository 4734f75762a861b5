"""A session's operation history in the state store, under the session's own key
``("history",)``, so it outlives the session's actors (reaps, evictions, restarts).

The history is written behind the calls, not before their replies: it is what the tools
just did, while the keys' own states are what they did. A new record leaves the whole
bounded history (at most the configured operations, each compacted) waiting; the runtime's
flusher hands it to the group commit 50 ms later (`Durability.flush_delay`), with every
record added meanwhile, and a reply never waits for it. While one write of a session is
under way, newer records wait for it. So a busy session costs one history write per 50 ms,
not one per call, and a crash loses at most the last 50 ms of history, never a key's
state. `end_session` closes the session's saver (nothing more is written) and
waits for the writes already queued before it deletes. A write that fails (the store is
down, or another process wrote this session's history) makes the next record reload from
the store, merge what it holds with what this process kept, and carry on from its
revision.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ctxactors.durable import Durability
from ctxactors.state import SessionRef, StoreError, Write

KEY = ("history",)


class Stored(msgspec.Struct, array_like=True):
    """One stored record: its wall-clock time and the operation (as `Operation` encodes)."""

    wall: float
    op: Any


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(list[Stored]).decode


class HistorySaver:
    """The store side of one session's history. `load` and `save` run under the history's
    lock; `flush` in the runtime's flusher, `_done` in the group-commit writer."""

    def __init__(self, durable: Durability, session: SessionRef) -> None:
        self._durable = durable
        self._session = session
        self._lock = threading.Lock()  # guards everything below against the other threads
        self._next = 0  # the revision the next write expects
        self._loaded = False
        self._inflight = False  # one write at a time per session...
        # ...the newest waits for it: a function that lists the records when the flusher
        # writes them (listing them on every call cost each call the whole history).
        self._pending: Callable[[], list[tuple[float, Any]]] | None = None
        self._closed = False
        self._idle = threading.Event()  # set while no write is under way
        self._idle.set()
        # The saver of this session's previous incarnation (reaped or evicted a moment
        # ago) may still have writes to make: read the store only once they are done.
        self._previous = durable.follow(session, self)

    def load(self) -> list[tuple[float, Any]] | None:
        """What the store holds (wall time, raw operation), oldest first, when this history
        has not read it yet (or must again); None when there is nothing to read now."""
        with self._lock:
            if self._loaded:
                return None
        previous, self._previous = self._previous, None
        if previous is not None:
            previous.drain(self._durable.save_timeout)
        try:
            record = self._durable.store.load(self._session, KEY)
        except StoreError:
            return None  # the store is down: keep what we have, read it back next time
        with self._lock:
            self._loaded = True
            self._next = 0 if record is None else record.revision
        return [] if record is None else [(s.wall, s.op) for s in _decode(record.data)]

    def save(self, records: Callable[[], list[tuple[float, Any]]]) -> None:
        """Have the flusher write, behind the calls, the records `records()` lists then (wall
        time, operation; oldest first). It runs in the flusher's thread, without this
        saver's lock, so it may take the history's own."""
        with self._lock:
            if self._closed:
                return
            self._pending = records
            if self._inflight:
                return  # `_done` hands it on
        self._durable.defer(self._session, self)

    def flush(self) -> None:
        """Submit the waiting history now, unless a write of it is still under way."""
        with self._lock:
            records, expected = self._pending, self._next
            if records is None or self._inflight or self._closed:
                return
            self._pending = None
            self._inflight = True
            self._idle.clear()
        data = _encode([Stored(wall, op) for wall, op in records()])
        self._durable.commit.submit(Write(self._session, KEY, data, expected), self._done)

    def _done(self, outcome: object) -> None:
        with self._lock:
            if isinstance(outcome, BaseException):  # stale or unavailable: re-read, merge
                self._loaded = False
                self._pending = None  # the next record writes the merged history
            else:
                assert isinstance(outcome, int)
                self._next = outcome
            self._inflight = False
            self._idle.set()
            waiting = self._pending is not None and not self._closed
        if waiting:
            self._durable.defer(self._session, self)

    def drain(self, timeout: float) -> bool:
        """Write everything waiting and wait until it is written (or `timeout` passes)."""
        deadline = time.monotonic() + timeout
        while True:
            self.flush()
            with self._lock:
                if not self._inflight and (self._pending is None or self._closed):
                    return True
            if not self._idle.wait(max(deadline - time.monotonic(), 0.0)):
                return False

    def close(self) -> None:
        """The session was ended: write nothing more (a late write would bring it back)."""
        with self._lock:
            self._closed = True
            self._pending = None


def wall_to_clock(wall: float, clock_now: float) -> float:
    """A stored wall-clock instant on the history's (monotonic) clock."""
    return clock_now - (time.time() - wall)
