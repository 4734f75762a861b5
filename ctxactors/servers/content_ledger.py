"""The content bytes of each principal, all its sessions together: `ContentLedger`.

The content server caps each session (``content.max_session_bytes``), which doesn't stop a
principal that opens many sessions: one tenant filled the store's disk and every other
tenant's saves failed. Each session's content server tells the runtime's ledger its bytes
after every change; an ``add_content`` that would take its principal past
``content.max_principal_bytes`` is refused. Callers with no principal are not capped here
(they are one tenant under the server's limits).

A session counts while its content exists: without a store until its actor stops; with
one until it is ended or expires (the ledger is a `SessionListener` of the runtime's
durability, told of uses, deletes and purge passes). A session stored before this process
started counts from its first change here.
"""

from __future__ import annotations

import threading
import time

from ctxactors.state import SessionRef


class ContentLedger:
    """Principal -> session -> content bytes, for one runtime; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: dict[str, dict[str, int]] = {}
        self._used: dict[SessionRef, float] = {}  # with a store: for the purge

    def others(self, session: SessionRef) -> int:
        """The bytes of the principal's other sessions."""
        principal, session_id = session
        if principal is None:
            return 0
        with self._lock:
            sessions = self._bytes.get(principal, {})
            return sum(sessions.values()) - sessions.get(session_id, 0)

    def set(self, session: SessionRef, size: int) -> None:
        principal, session_id = session
        if principal is None:
            return
        with self._lock:
            self._bytes.setdefault(principal, {})[session_id] = size
            self._used[session] = time.monotonic()

    def drop(self, session: SessionRef) -> None:
        principal, session_id = session
        with self._lock:
            self._used.pop(session, None)
            sessions = self._bytes.get(principal or "", {})
            sessions.pop(session_id, None)
            if not sessions:
                self._bytes.pop(principal or "", None)

    # -- SessionListener ---------------------------------------------------------------------

    def touched(self, sessions: list[SessionRef]) -> None:
        now = time.monotonic()
        with self._lock:
            for session in sessions:
                if session in self._used:
                    self._used[session] = now

    def deleted(self, session: SessionRef) -> None:
        self.drop(session)

    def purge(self, retention: float) -> None:
        cutoff = time.monotonic() - retention
        with self._lock:
            old = [s for s, used in self._used.items() if used <= cutoff]
        for session in old:
            self.drop(session)
