"""A session's operation history in the state store, under the session's own key
``("history",)``, so it outlives the session's actors (reaps, evictions, restarts).

The history is written behind the calls, not before their replies: it is what the tools
just did, while the keys' own states are what they did. Each new record submits the whole
bounded history (at most the configured operations, each compacted) to the runtime's group
commit, with the revision predicted from the writes already queued (the single writer
applies them in order), so a reply never waits for it and an `end_session`, which waits for
the writer first, can't be undone by a late write. A write that fails (the store is down,
or another process wrote this session's history) makes the next record reload from the
store, merge what it holds with what this process kept, and carry on from its revision.
"""

from __future__ import annotations

import threading
import time
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
    """The store side of one session's history. Its methods run under the history's lock."""

    def __init__(self, durable: Durability, session: SessionRef) -> None:
        self._durable = durable
        self._session = session
        self._next = 0  # the revision the next write expects
        self._loaded = False
        self._lock = threading.Lock()  # guards `_loaded` against the writer's callbacks

    def load(self) -> list[tuple[float, Any]] | None:
        """What the store holds (wall time, raw operation), oldest first, when this history
        has not read it yet (or must again); None when there is nothing to read now."""
        with self._lock:
            if self._loaded:
                return None
        try:
            record = self._durable.store.load(self._session, KEY)
        except StoreError:
            return None  # the store is down: keep what we have, read it back next time
        with self._lock:
            self._loaded = True
            self._next = 0 if record is None else record.revision
        return [] if record is None else [(s.wall, s.op) for s in _decode(record.data)]

    def save(self, records: list[tuple[float, Any]]) -> None:
        """Queue a write of these records (wall time, operation), oldest first."""
        data = _encode([Stored(wall, op) for wall, op in records])
        expected = self._next
        self._next += 1
        self._durable.commit.submit(Write(self._session, KEY, data, expected), self._done)

    def _done(self, outcome: object) -> None:
        if isinstance(outcome, BaseException):  # stale or unavailable: re-read, then merge
            with self._lock:
                self._loaded = False


def wall_to_clock(wall: float, clock_now: float) -> float:
    """A stored wall-clock instant on the history's (monotonic) clock."""
    return clock_now - (time.time() - wall)
