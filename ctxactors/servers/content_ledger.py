"""The content bytes of each principal, all its sessions together: `ContentLedger`.

The content server caps each session (``content.max_session_bytes``), which doesn't stop a
principal that opens many sessions: one tenant filled the store's disk and every other
tenant's saves failed. Each session's content server tells the runtime's ledger its bytes
after every change; an ``add_content`` that would take its principal past
``content.max_principal_bytes`` is refused. Callers with no principal are not capped here
(they are one tenant under the server's limits).

A session counts while its content exists: without a store until its actor stops; with
one until it is ended or expires (the ledger is a `SessionListener` of the runtime's
durability, told of uses, deletes and purge passes). Sessions stored before this process
started count too: the first time a principal adds content here, the ledger asks the store
for the bytes of its stored sessions (`StateStore.part_bytes`: each document as stored, its
filename included, so a little more than its text), so a restart doesn't give a principal
its whole cap again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ctxactors.state import SessionRef, StateKey, StateStore, StoreUnavailableError


class ContentLedger:
    """Principal -> session -> content bytes, for one runtime; thread-safe."""

    def __init__(
        self,
        store: StateStore | None = None,
        key: StateKey = ("content",),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        # The runtime's clock: the one its durability ages sessions by (`purge`).
        self._clock = clock
        self._bytes: dict[str, dict[str, int]] = {}
        self._used: dict[SessionRef, float] = {}  # with a store: for the purge
        # A store that can count what it holds (every built-in one), and the content's key.
        self._store = store if hasattr(store, "part_bytes") else None
        self._key = key
        self._counted: set[str] = set()  # principals whose stored sessions are counted

    def others(self, session: SessionRef) -> int:
        """The bytes of the principal's other sessions."""
        principal, session_id = session
        if principal is None:
            return 0
        self._recount(principal)
        with self._lock:
            sessions = self._bytes.get(principal, {})
            return sum(sessions.values()) - sessions.get(session_id, 0)

    def _recount(self, principal: str) -> None:
        """Once per principal: its sessions stored before this process started (a session
        changed here already counts its own bytes)."""
        if self._store is None:
            return
        with self._lock:
            if principal in self._counted:
                return
            self._counted.add(principal)
        try:
            stored = self._store.part_bytes(principal, self._key)
        except StoreUnavailableError:
            with self._lock:
                self._counted.discard(principal)  # asked again on its next addition
            return
        now = self._clock()
        with self._lock:
            sessions = self._bytes.setdefault(principal, {})
            for session_id, size in stored.items():
                if session_id not in sessions:
                    sessions[session_id] = size
                    self._used[(principal, session_id)] = now

    def set(self, session: SessionRef, size: int) -> None:
        principal, session_id = session
        if principal is None:
            return
        with self._lock:
            self._bytes.setdefault(principal, {})[session_id] = size
            self._used[session] = self._clock()

    def drop(self, session: SessionRef) -> None:
        principal, session_id = session
        if principal is None:
            return  # never counted (not `""`: that name may be a principal's own)
        with self._lock:
            self._used.pop(session, None)
            sessions = self._bytes.get(principal, {})
            sessions.pop(session_id, None)
            if not sessions:
                self._bytes.pop(principal, None)

    # -- SessionListener ---------------------------------------------------------------------

    def touched(self, sessions: list[SessionRef]) -> None:
        now = self._clock()
        with self._lock:
            for session in sessions:
                if session in self._used:
                    self._used[session] = now

    def deleted(self, session: SessionRef) -> None:
        self.drop(session)

    def purge(self, retention: float) -> None:
        cutoff = self._clock() - retention
        with self._lock:
            old = [s for s, used in self._used.items() if used <= cutoff]
        for session in old:
            self.drop(session)
