"""The store bytes of each principal, all its sessions and keys together: `StateBudget`.

Every server caps one key's state (a thread's goals, a session's playbooks), which doesn't
stop a principal that opens many sessions, assistants and threads: one tenant could fill the
disk (or the Redis memory) every tenant's state lives in. The runtime's durability charges
each save of a principal's key its delta against the record it replaces, before it is
written; a save that would take the principal past ``state.max_principal_bytes`` is refused
(it changes nothing), and a save that shrinks or deletes is always taken. A session's
history is charged the same way when it is written behind the calls (`history_store`): a
principal over its budget can't grow a history either, so opening session after session
stores nothing more (a history kept in memory only, see there). A failed save gives its
charge back (`landed`); ending a session and the retention purge subtract what the session
held, and are never refused. Callers with no principal are not capped (one tenant under the
server's own limits).

Sessions stored before this process started count too: the first save of a principal here
asks the store once for the bytes of its stored sessions (`StateStore.principal_bytes`);
after that each save costs a lock and a few dict operations, no store query. Content's
documents (a key's parts) are not counted here: ``content.max_principal_bytes`` caps them.

Concurrent saves of one principal's keys are charged one at a time under the lock, so they
never overshoot the budget; a save charged and still on its way counts already. Those saves
are also kept apart as in flight until the store answered (`landed`): a recount (after a
purge, or once per retention period on Redis) reads only what the store holds, so it adds
what is still in flight, and a save charged while the store is read is not lost either. A
save the store took just before the read but answered just after counts twice until its
session ends or the principal is recounted: over, never under. Each principal is recounted
under its own lock (a Redis recount scans the keyspace: other principals' first saves don't
wait for it). One process counts what it writes: processes sharing a store (Ray shards) each
recount once and then count their own saves, so together they may hold up to one budget
each.

A thread that writes for every principal (the runtime's history flusher) never recounts:
`charge_counted` starts the recount on a recounting thread of this budget's (at most
`RECOUNTERS`, gone once none is wanted) and, for a principal not counted yet, answers None:
the write waits for a later pass. One principal's slow count (a Redis SCAN after a purge)
delays only its own writes. A count only stale (once per retention) is charged against
meanwhile, as a save charged during a recount is.
"""

from __future__ import annotations

import threading
import time

from ctxactors.logs import lazy_logger
from ctxactors.settings import DEFAULTS, Cap
from ctxactors.state import SessionRef, StateStore, StoreError

RECOUNTERS = 2  # recounts run at once for `charge_counted` (each a store query)
_log = lazy_logger("ctxactors.state_budget")


class StateBudget:
    """Principal -> session id -> stored bytes, for one runtime's store; thread-safe.

    Each `charge` of a save is followed by one `landed` once the store has answered it;
    `adjust` corrects the count to what the store holds (another process's write)."""

    def __init__(self, store: StateStore, cap: Cap | None = None) -> None:
        self.cap = DEFAULTS.state.cap("max_principal_bytes") if cap is None else cap
        self._store = store
        self._lock = threading.Lock()
        # One store query at a time per principal (once per principal, or per retention).
        self._recounting: dict[str, threading.Lock] = {}
        self._totals: dict[str, int] = {}  # a principal's bytes: its sessions' sum
        self._sessions: dict[str, dict[str, int]] = {}
        # Charged and not answered by the store yet: what a recount must add to its read.
        # Kept through `forget` (those saves still land): [bytes, saves] per session.
        self._inflight: dict[str, dict[str, list[int]]] = {}
        # Per principal being recounted, the saves that landed meanwhile: the read may
        # have missed them, so they are added (over, never under).
        self._landing: dict[str, dict[str, int]] = {}
        # A store that expires sessions itself (Redis) tells no purge: each principal is
        # recounted once per retention period, so what expired stops counting.
        self._clock = time.monotonic
        self._max_age = store.retention
        self._stale_at: dict[str, float] = {}
        # Principals to recount on a recounting thread (`charge_counted`), in order, and
        # those being recounted there; `_recounters`: how many such threads run.
        self._wanted: dict[str, None] = {}
        self._counting: set[str] = set()
        self._recounters = 0

    def charge(self, session: SessionRef, delta: int) -> bool:
        """Count a save of `delta` more bytes for `session`, in flight until `landed`;
        False (nothing counted, nothing to land) when that would take its principal past
        the cap. Never refuses a shrink.

        Raises `StoreUnavailableError` when the principal's first charge here can't read
        what the store holds."""
        taken = self._charge(session, delta, recount=True)
        assert taken is not None
        return taken

    def charge_counted(self, session: SessionRef, delta: int) -> bool | None:
        """`charge`, but never a store query in this thread: None (nothing counted) when
        its principal isn't counted yet, whose count is started on another thread (a
        stale count is recounted there too, and charged meanwhile)."""
        return self._charge(session, delta, recount=False)

    def _charge(self, session: SessionRef, delta: int, *, recount: bool) -> bool | None:
        principal, session_id = session
        if principal is None or not delta:
            return True
        totals = self._totals
        while True:
            # (`get`: a purge may forget the count between the two reads.)
            if principal not in totals or self._clock() >= self._stale_at.get(principal, 0.0):
                if recount:
                    self._recount(principal)
                else:
                    self._recount_later(principal)
                    if principal not in totals:
                        return None
                    # Stale only (Redis, once per retention): charged against the last
                    # count, which the recount then corrects (it adds what is in flight).
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
                flying = self._inflight.setdefault(principal, {}).setdefault(session_id, [0, 0])
                flying[0] += delta
                flying[1] += 1
            return True

    def landed(self, session: SessionRef, delta: int, kept: bool) -> None:
        """The store answered a save `charge`d `delta`: taken (`kept`: it counts now as
        stored), or not (its bytes are given back)."""
        principal, session_id = session
        if principal is None or not delta:
            return
        with self._lock:
            inflight = self._inflight.get(principal)
            flying = None if inflight is None else inflight.get(session_id)
            if flying is None:
                return  # its session was ended (and what it held freed) meanwhile
            flying[0] -= delta
            flying[1] -= 1
            if not flying[1]:
                del inflight[session_id]  # type: ignore[union-attr]
                if not inflight:
                    del self._inflight[principal]
            landing = self._landing.get(principal)
            if kept and landing is not None:
                landing[session_id] = landing.get(session_id, 0) + delta
            sessions = self._sessions.get(principal)
            if not kept and sessions is not None and session_id in sessions:
                self._totals[principal] -= delta
                sessions[session_id] -= delta

    def adjust(self, session: SessionRef, delta: int) -> None:
        """What the store holds for `session` changed by `delta` without a save of ours
        (another process wrote it): never refused, never a store query (a principal not
        counted yet is read from the store on its next charge)."""
        principal, session_id = session
        if principal is None or not delta:
            return
        with self._lock:
            sessions = self._sessions.get(principal)
            if sessions is not None:
                self._totals[principal] += delta
                sessions[session_id] = sessions.get(session_id, 0) + delta

    def held(self, principal: str) -> int | None:
        """The principal's bytes as counted (None: not counted in this process yet)."""
        with self._lock:
            return self._totals.get(principal)

    def in_flight(self, principal: str) -> int:
        """The bytes of the principal's saves charged and not answered by the store yet."""
        with self._lock:
            return sum(flying[0] for flying in self._inflight.get(principal, {}).values())

    def refused(self, principal: str | None, delta: int) -> str:
        """What the caller of a refused save is told."""
        with self._lock:
            held = self._totals.get(principal or "", 0)
        return self.cap.exceeded(
            f"this principal's stored state would grow to {held + delta:,} bytes"
        )

    def _recount(self, principal: str) -> None:
        with self._lock:
            recounting = self._recounting.setdefault(principal, threading.Lock())
        with recounting:
            if principal in self._totals and self._clock() < self._stale_at[principal]:
                return  # another thread counted it while this one waited
            with self._lock:
                self._landing.setdefault(principal, {})
            try:
                stored = self._store.principal_bytes(principal)
            except BaseException:
                with self._lock:
                    self._landing.pop(principal, None)
                raise
            with self._lock:
                landed = self._landing.pop(principal, {})
                # What the store holds, and the saves it may have missed: those still in
                # flight, and those answered while it was read. (A charge made meanwhile,
                # against a stale count by `charge_counted`, is among those: in flight,
                # or answered.)
                sessions = dict(stored)
                for session_id, (delta, _) in self._inflight.get(principal, {}).items():
                    sessions[session_id] = sessions.get(session_id, 0) + delta
                for session_id, delta in landed.items():
                    sessions[session_id] = sessions.get(session_id, 0) + delta
                self._sessions[principal] = sessions
                self._totals[principal] = sum(sessions.values())
                self._stale_at[principal] = self._clock() + self._max_age

    def _recount_later(self, principal: str) -> None:
        """Have a recounting thread count `principal` (once, however often asked)."""
        with self._lock:
            if principal in self._wanted or principal in self._counting:
                return
            self._wanted[principal] = None
            if self._recounters >= RECOUNTERS:
                return  # a running one takes it next
            self._recounters += 1
        try:
            threading.Thread(
                target=self._recount_wanted, name="ctxactors-recount", daemon=True
            ).start()
        except BaseException:
            # Wanted by no thread: left in `_wanted`, the next ask would return at once
            # and the principal would wait for another principal's recount thread.
            with self._lock:
                self._recounters -= 1
                self._wanted.pop(principal, None)
            raise

    def _recount_wanted(self) -> None:
        """A recounting thread: count the wanted principals, one at a time, then end."""
        while True:
            with self._lock:
                if not self._wanted:
                    self._recounters -= 1
                    return
                principal = next(iter(self._wanted))
                del self._wanted[principal]
                self._counting.add(principal)
            try:
                self._recount(principal)
            except StoreError as exc:  # the store is down: asked again by the write's next try
                _log.warning("state_recount_failed", principal=principal, error=str(exc))
            except Exception:  # noqa: BLE001 - a bug: this thread must still end, and say why
                _log.error("state_recount_failed", principal=principal, exc_info=True)
            finally:
                with self._lock:
                    self._counting.discard(principal)

    def deleted(self, session: SessionRef) -> None:
        """The session was ended: what it held is free."""
        principal, session_id = session
        if principal is None:
            return
        with self._lock:
            sessions = self._sessions.get(principal)
            if sessions is not None:
                self._totals[principal] -= sessions.pop(session_id, 0)
            inflight = self._inflight.get(principal)
            if inflight is not None:
                inflight.pop(session_id, None)  # deleted behind its last writes
                if not inflight:
                    del self._inflight[principal]

    def forget(self) -> None:
        """Sessions expired (the retention purge): each principal is recounted from the
        store on its next save (its saves in flight still count then)."""
        with self._lock:
            self._totals.clear()
            self._sessions.clear()
            self._stale_at.clear()
            # The locks of recounts under way stay (a second one would run beside them).
            self._recounting = {p: lock for p, lock in self._recounting.items() if lock.locked()}
