"""Key -> actor: spawn once, track calls in flight, reap idle actors, cap the live count.

Everything that decides an actor's life happens under one lock, in one place:

- `submit` gets or spawns the key's actor and counts the call as in flight *before* the
  message is sent, so the reaper can never stop an actor that a call is on its way to.
- An actor is retired (passivated) by removing its key from the table under the lock. From
  then on new calls for that key spawn a fresh incarnation; the retired one finishes the
  calls already sent to it and stops when its in-flight count reaches zero. There is no
  window in which a call can reach a stopping actor, so no call is ever lost.
- The table is an `OrderedDict` in least-recently-used order, which makes both the TTL pass
  (stop at the first fresh entry) and the LRU caps (first idle entry) cheap. Each principal
  also has its own LRU table: over its own cap, or over the global cap while it holds more
  than its fair share of it (the cap divided by the principals with live keys), a principal
  gives up its own least recently used idle key. So a flood of sessions from one principal
  passivates that principal's keys, not another's.
- A key is ``(server, (principal, session_id), ...)``: its second item names the session,
  which groups the actors that `end_session` stops and the state they share.

We keep our own dict rather than pykka's `ActorRegistry`, which is a linear list.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import pykka

from ctxactors.actors import Call, KeyActor, Lifecycle
from ctxactors.context import SessionKey
from ctxactors.logs import get_logger
from ctxactors.results import RuntimeClosedError

Key = tuple[Any, ...]


class Entry(Lifecycle):
    """One incarnation of a key's actor and its bookkeeping (guarded by the registry lock)."""

    __slots__ = ("key", "actor", "inflight", "last_used", "retiring")

    def __init__(self, key: Key, now: float) -> None:
        super().__init__()
        self.key = key
        self.actor: KeyActor | None = None
        self.inflight = 0
        self.last_used = now
        self.retiring = False

    def idle(self) -> bool:
        server = self.server
        return self.inflight == 0 and not (server is not None and server.is_busy())


class Registry:
    """The live actors, by key. Thread-safe; `close` stops them all and waits for cleanup."""

    def __init__(
        self,
        *,
        ttl: float,
        max_actors: int,
        max_actors_per_principal: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        scan_interval: float | None = None,
        log: Any = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        if max_actors < 1:
            raise ValueError("max_actors must be at least 1")
        if max_actors_per_principal is not None and max_actors_per_principal < 1:
            raise ValueError("max_actors_per_principal must be at least 1 (or None)")
        self.ttl = ttl
        self.max_actors = max_actors
        self.max_actors_per_principal = max_actors_per_principal
        self._clock = clock
        self._log = log if log is not None else get_logger("ctxactors")
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, Entry] = OrderedDict()
        self._by_session: dict[SessionKey, set[Key]] = {}
        self._session_state: dict[SessionKey, dict[str, Any]] = {}
        # principal -> its live entries in LRU order (the caps evict a principal's own first).
        self._by_principal: dict[str | None, OrderedDict[Key, Entry]] = {}
        self._closed = False
        self._counts = {"spawned": 0, "reaped": 0, "evicted": 0, "ended": 0, "calls": 0}
        self._inflight = 0
        self._peak = 0
        self._stop_reaper = threading.Event()
        # Run after each background reaper pass (the runtime's store retention purge).
        self.on_pass: Callable[[], None] | None = None
        self._reaper: threading.Thread | None = None
        if scan_interval is not None and scan_interval > 0:
            self._reaper = threading.Thread(
                target=self._reap_forever,
                args=(scan_interval,),
                name="ctxactors-reaper",
                daemon=True,
            )
            self._reaper.start()

    # -- calls ---------------------------------------------------------------------------

    def submit(self, key: Key, factory: Callable[[], Any], call: Call) -> None:
        """Send `call` to the actor of `key`, spawning it first if there is none."""
        victims: list[Entry] = []
        with self._lock:
            if self._closed:
                raise RuntimeClosedError("the runtime is closed")
            entry = self._entries.get(key)
            if entry is None:
                entry = self._spawn(key, factory)
                own = self._by_principal[key[1][0]]
                cap = self.max_actors_per_principal
                if cap is not None and len(own) > cap:
                    victims = self._evict_lru(own, entry, "max_actors_per_principal")
                if len(self._entries) > self.max_actors:
                    # A principal holding more than its fair share of the cap pays with its
                    # own keys: a flood of sessions from one principal passivates its own,
                    # not another's. Otherwise the global least recently used key goes.
                    share = self.max_actors / len(self._by_principal)
                    mine = self._evict_lru(own, entry, "max_actors") if len(own) > share else []
                    victims += mine or self._evict_lru(self._entries, entry, "max_actors")
            else:
                self._entries.move_to_end(key)
                self._by_principal[key[1][0]].move_to_end(key)
            entry.inflight += 1
            entry.last_used = self._clock()
            self._inflight += 1
            self._counts["calls"] += 1
        self._stop(victims)
        assert entry.actor is not None
        entry.actor.actor_ref.tell(call)

    def session_state(self, session: SessionKey, name: str, factory: Callable[[], Any]) -> Any:
        """The shared object `name` of `session` (a ``(principal, session_id)`` pair), made
        by `factory` on first use, or None.

        It lives exactly as long as the session has a live actor: it goes when the last
        one is reaped, evicted or ended, and a session with no live actor gets None (so
        nothing is kept for a session that is gone). For what all of a session's actors
        add to, like the operation history; it must be thread-safe, as they all use it.
        """
        with self._lock:
            if session not in self._by_session:
                return None
            shared = self._session_state.setdefault(session, {})
            value = shared.get(name)
            if value is None:
                value = shared[name] = factory()
            return value

    def has_session(self, session: SessionKey) -> bool:
        with self._lock:
            return session in self._by_session

    def _spawn(self, key: Key, factory: Callable[[], Any]) -> Entry:
        entry = Entry(key, self._clock())
        entry.actor = KeyActor.launch(factory, entry, lambda: self._finished(entry))
        self._entries[key] = entry
        self._by_session.setdefault(key[1], set()).add(key)
        self._by_principal.setdefault(key[1][0], OrderedDict())[key] = entry
        self._counts["spawned"] += 1
        self._peak = max(self._peak, len(self._entries))
        self._log.info("actor_spawned", **_describe(key), actors=len(self._entries))
        return entry

    def _finished(self, entry: Entry) -> None:
        """Called in the actor's thread after each message."""
        with self._lock:
            entry.inflight -= 1
            self._inflight -= 1
            entry.last_used = self._clock()
            if not entry.retiring:
                self._entries.move_to_end(entry.key)
                self._by_principal[entry.key[1][0]].move_to_end(entry.key)
                return
            stop_now = entry.inflight == 0
        if stop_now:
            self._stop([entry])

    # -- passivation ---------------------------------------------------------------------

    def _retire(self, entry: Entry) -> bool:
        """Remove an entry from the table (lock held); True if it can be stopped at once."""
        key = entry.key
        del self._entries[key]
        keys = self._by_session.get(key[1])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_session[key[1]]
                self._session_state.pop(key[1], None)
        own = self._by_principal[key[1][0]]
        del own[key]
        if not own:
            del self._by_principal[key[1][0]]
        entry.retiring = True
        return entry.inflight == 0

    def _evict_lru(
        self, table: OrderedDict[Key, Entry], newcomer: Entry, reason: str
    ) -> list[Entry]:
        """Retire the least recently used idle entry of `table` (lock held)."""
        for entry in table.values():
            if entry is not newcomer and entry.idle():
                self._retire(entry)
                self._counts["evicted"] += 1
                self._log.info("actor_evicted", **_describe(entry.key), reason=reason)
                return [entry]
        return []  # every actor is busy: the cap is exceeded until some become idle

    def _stop(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            try:
                if entry.actor is not None:
                    entry.actor.stop()  # a plain message after the calls already queued
            except pykka.ActorDeadError:
                entry.closed.set()

    def reap(self) -> int:
        """One TTL pass: stop every idle actor unused for longer than `ttl`."""
        with self._lock:
            cutoff = self._clock() - self.ttl
            victims = []
            for entry in self._entries.values():
                if entry.last_used > cutoff:
                    break  # LRU order: everything after this is fresher
                if entry.idle():
                    victims.append(entry)
            for entry in victims:
                self._retire(entry)
            self._counts["reaped"] += len(victims)
        self._stop(victims)
        for entry in victims:
            self._log.info("actor_reaped", **_describe(entry.key), reason="ttl")
        return len(victims)

    def end_session(self, session: SessionKey, wait: float | None = None) -> int:
        """Retire every actor of `session` (a ``(principal, session_id)`` pair); with
        `wait`, block until their cleanup is done."""
        with self._lock:
            keys = list(self._by_session.get(session, ()))
            entries = [self._entries[k] for k in keys]
            idle = [e for e in entries if self._retire(e)]
            self._counts["ended"] += len(entries)
        self._stop(idle)
        if wait is not None:
            deadline = time.monotonic() + wait
            for entry in entries:
                entry.wait_closed(max(deadline - time.monotonic(), 0.0))
        if entries:
            self._log.info(
                "session_ended", principal=session[0], session_id=session[1], actors=len(entries)
            )
        return len(entries)

    def _reap_forever(self, interval: float) -> None:
        while not self._stop_reaper.wait(interval):
            try:
                self.reap()
                if self.on_pass is not None:
                    self.on_pass()
            except Exception as exc:  # noqa: BLE001 - the reaper must outlive one bad pass
                self._log.error("reap_failed", exc_info=exc)

    # -- lifecycle -----------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking calls, retire every actor, and wait for their cleanup."""
        self._stop_reaper.set()
        with self._lock:
            self._closed = True
            entries = list(self._entries.values())
            idle = [e for e in entries if self._retire(e)]
        self._stop(idle)
        deadline = time.monotonic() + timeout
        for entry in entries:
            entry.wait_closed(max(deadline - time.monotonic(), 0.0))
        if self._reaper is not None and self._reaper is not threading.current_thread():
            self._reaper.join(timeout=1.0)

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "actors": len(self._entries),
                "inflight": self._inflight,
                "peak_actors": self._peak,
                "sessions": len(self._by_session),
                **self._counts,
            }

    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._entries)


def _describe(key: Key) -> dict[str, Any]:
    """A key's fields for a log line."""
    return {"server": key[0], "principal": key[1][0], "session_id": key[1][1], "key": list(key)}
