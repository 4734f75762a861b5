"""The store bytes of each principal, all its sessions and keys together: `StateBudget`.

Every server caps one key's state (a thread's goals, a session's playbooks), which doesn't
stop a principal that opens many sessions, assistants and threads: one tenant could fill the
disk (or the Redis memory) every tenant's state lives in. The runtime's durability charges
each save of a principal's key its delta against the record it replaces, before it is
written; a save that would take the principal past ``state.max_principal_bytes`` is refused
(it changes nothing), and a save that shrinks or deletes is always taken. A failed save gives
its charge back; ending a session and the retention purge subtract what the session held.
Callers with no principal are not capped (one tenant under the server's own limits).

Sessions stored before this process started count too: the first save of a principal here
asks the store once for the bytes of its stored sessions (`StateStore.principal_bytes`);
after that each save costs a lock and a few dict operations, no store query. Content's
documents (a key's parts) are not counted here: ``content.max_principal_bytes`` caps them.

Concurrent saves of one principal's keys are charged one at a time under the lock, so they
never overshoot the budget; a save charged and still on its way counts already. One process
counts what it writes: processes sharing a store (Ray shards) each recount once and then
count their own saves, so together they may hold up to one budget each.
"""

from __future__ import annotations

import threading
import time

from ctxactors.settings import DEFAULTS, Cap
from ctxactors.state import SessionRef, StateStore


class StateBudget:
    """Principal -> session id -> stored bytes, for one runtime's store; thread-safe."""

    def __init__(self, store: StateStore, cap: Cap | None = None) -> None:
        self.cap = DEFAULTS.state.cap("max_principal_bytes") if cap is None else cap
        self._store = store
        self._lock = threading.Lock()
        self._recounting = threading.Lock()  # one store query at a time (once per principal)
        self._totals: dict[str, int] = {}  # a principal's bytes: its sessions' sum
        self._sessions: dict[str, dict[str, int]] = {}
        # A store that expires sessions itself (Redis) tells no purge: each principal is
        # recounted once per retention period, so what expired stops counting.
        self._clock = time.monotonic
        self._max_age = store.retention
        self._stale_at: dict[str, float] = {}

    def charge(self, session: SessionRef, delta: int, force: bool = False) -> bool:
        """Count `delta` more bytes stored for `session`; False (nothing counted) when that
        would take its principal past the cap, unless `force` (a write that must land: a
        history written behind calls already answered). Never refuses a shrink.

        Raises `StoreUnavailableError` when the principal's first charge here can't read
        what the store holds."""
        principal, session_id = session
        if principal is None or not delta:
            return True
        totals = self._totals
        if force:  # never a store query: a principal not counted yet is read from the store
            with self._lock:
                if principal in totals:
                    totals[principal] += delta
                    sessions = self._sessions[principal]
                    sessions[session_id] = sessions.get(session_id, 0) + delta
            return True
        while True:
            if principal not in totals or self._clock() >= self._stale_at[principal]:
                self._recount(principal)
            with self._lock:
                total = totals.get(principal)
                if total is None:
                    continue  # forgotten (a purge) since it was counted: count it again
                total += delta
                if delta > 0 and total > self.cap.value:
                    return False
                totals[principal] = total
                sessions = self._sessions[principal]
                sessions[session_id] = sessions.get(session_id, 0) + delta
            return True

    def held(self, principal: str) -> int | None:
        """The principal's bytes as counted (None: not counted in this process yet)."""
        with self._lock:
            return self._totals.get(principal)

    def refused(self, principal: str | None, delta: int) -> str:
        """What the caller of a refused save is told."""
        with self._lock:
            held = self._totals.get(principal or "", 0)
        return self.cap.exceeded(
            f"this principal's stored state would grow to {held + delta:,} bytes"
        )

    def _recount(self, principal: str) -> None:
        with self._recounting:
            if principal in self._totals and self._clock() < self._stale_at[principal]:
                return  # another thread counted it while this one waited
            stored = self._store.principal_bytes(principal)
            with self._lock:
                self._sessions[principal] = dict(stored)
                self._totals[principal] = sum(stored.values())
                self._stale_at[principal] = self._clock() + self._max_age

    def deleted(self, session: SessionRef) -> None:
        """The session was ended: what it held is free."""
        principal, session_id = session
        if principal is None:
            return
        with self._lock:
            sessions = self._sessions.get(principal)
            if sessions is not None:
                self._totals[principal] -= sessions.pop(session_id, 0)

    def forget(self) -> None:
        """Sessions expired (the retention purge): each principal is recounted from the
        store on its next save."""
        with self._lock:
            self._totals.clear()
            self._sessions.clear()
            self._stale_at.clear()
