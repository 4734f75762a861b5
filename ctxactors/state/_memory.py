"""The in-memory store: the same contract as the durable ones, gone with the process.

For tests and for embedders who want reaping to keep state without a file. `clock` is an
injectable monotonic clock, so retention is testable without waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence

from ctxactors.state._base import (
    Outcome,
    Record,
    SessionRef,
    StaleStateError,
    StateKey,
    Write,
)


class MemoryStore:
    """Key state in a dict per session, under one lock."""

    def __init__(
        self, *, retention: float = 3600.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.retention = retention
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[SessionRef, dict[StateKey, Record]] = {}
        self._touched: dict[SessionRef, float] = {}

    def _live(self, session: SessionRef, now: float) -> dict[StateKey, Record]:
        touched = self._touched.get(session)
        if touched is not None and now - touched >= self.retention:
            self._sessions.pop(session, None)
            self._touched.pop(session, None)
        self._touched[session] = now
        return self._sessions.setdefault(session, {})

    def load(self, session: SessionRef, key: StateKey) -> Record | None:
        with self._lock:
            return self._live(session, self._clock()).get(key)

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        with self._lock:
            now = self._clock()
            for w in writes:
                keys = self._live(w.session, now)
                current = keys[w.key].revision if w.key in keys else 0
                if current != w.expected:
                    outcomes.append(StaleStateError(w.key, w.expected, current))
                elif w.data is None:
                    keys.pop(w.key, None)
                    outcomes.append(0)
                else:
                    parts = dict(keys[w.key].parts) if w.key in keys else {}
                    for name, data in w.parts:
                        if data is None:
                            parts.pop(name, None)
                        else:
                            parts[name] = data
                    keys[w.key] = Record(current + 1, w.data, parts)
                    outcomes.append(current + 1)
        return outcomes

    def touch(self, sessions: Iterable[SessionRef]) -> None:
        with self._lock:
            now = self._clock()
            for session in sessions:
                if session in self._touched:
                    self._touched[session] = now

    def delete_session(self, session: SessionRef) -> int:
        with self._lock:
            self._touched.pop(session, None)
            return len(self._sessions.pop(session, {}))

    def purge(self) -> int:
        with self._lock:
            now = self._clock()
            old = [s for s, t in self._touched.items() if now - t >= self.retention]
            for session in old:
                self._touched.pop(session, None)
                self._sessions.pop(session, None)
            return len(old)

    def close(self) -> None:
        with self._lock:
            self._sessions.clear()
            self._touched.clear()

    def part_bytes(self, principal: str, key: StateKey) -> dict[str, int]:
        with self._lock:
            now = self._clock()
            out: dict[str, int] = {}
            for (owner, session_id), keys in self._sessions.items():
                touched = self._touched.get((owner, session_id))
                if owner != principal or key not in keys:
                    continue
                if touched is not None and now - touched >= self.retention:
                    continue  # expired: forgotten on its next use
                size = sum(len(data) for data in keys[key].parts.values())
                if size:
                    out[session_id] = size
            return out

    def principal_bytes(self, principal: str) -> dict[str, int]:
        with self._lock:
            now = self._clock()
            out: dict[str, int] = {}
            for (owner, session_id), keys in self._sessions.items():
                touched = self._touched.get((owner, session_id))
                if owner != principal:
                    continue
                if touched is not None and now - touched >= self.retention:
                    continue  # expired: forgotten on its next use
                out[session_id] = sum(len(record.data) for record in keys.values())
            return out
