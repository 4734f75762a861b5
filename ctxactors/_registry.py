"""Key -> actor: spawn once, track calls in flight, reap idle actors, cap the live count.

Everything that decides an actor's life happens under one lock, in one place:

- `submit` gets or spawns the key's actor and counts the call as sent *before* the message
  is sent, so the reaper can never stop an actor that a call is on its way to. That is the
  only time a call takes the lock: the actor counts it as done on its own thread
  (`Entry.finished`; only that thread writes the count, the lock readers compare the two),
  so a reader may see a call as running a moment longer, never as done too early.
- An actor is retired (passivated) by removing its key from the table under the lock. From
  then on new calls for that key spawn a fresh incarnation; the retired one finishes the
  calls already sent to it and stops when its in-flight count reaches zero. There is no
  window in which a call can reach a stopping actor, so no call is ever lost.
- The table is an `OrderedDict` in least-recently-sent order, which makes both the TTL pass
  (stop at the first entry sent a call within the TTL) and the LRU caps (first idle entry)
  cheap. Each principal
  also has its own LRU table: over its own cap, or over the global cap while it holds more
  than its fair share of it (the cap divided by the principals with live keys), a principal
  gives up its own least recently used idle key. So a flood of sessions from one principal
  passivates that principal's keys, not another's.
- A `Key` is ``(server, (principal, session_id), ...)``: its `session` groups the actors
  that `end_session` stops and the state they share (`SessionState`), which each entry
  holds too, so its actor reaches it without the lock.

We keep our own dict rather than pykka's `ActorRegistry`, which is a linear list.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import pykka

from ctxactors._actors import KeyActor, Lifecycle, current_actor
from ctxactors._call import Envelope
from ctxactors._scheduler import PoolActor
from ctxactors.context import SessionKey
from ctxactors.errors import RuntimeClosedError
from ctxactors.logs import get_logger, info_enabled
from ctxactors.tools import Key

# Stop messages sent between two yields of the GIL (see `Registry._stop`).
_STOP_BATCH = 64
# Entries one reaper slice looks at with the registry's lock held (see `Registry.reap`).
_REAP_SLICE = 1024


class SessionState:
    """The objects a session's actors share, each made on first use (see `session_state`).

    Its own lock guards only the making, so reading a value never waits for the registry.
    """

    __slots__ = ("_values", "_lock", "live")

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}  # read without the lock; written under it
        self._lock = threading.Lock()
        self.live = True  # False once the session's last actor is retired

    def get(self, name: str, factory: Callable[[], Any]) -> Any:
        value = self._values.get(name)
        if value is None:
            with self._lock:
                value = self._values.get(name)
                if value is None:
                    value = self._values[name] = factory()
        return value


class Entry(Lifecycle):
    """One incarnation of a key's actor and its bookkeeping.

    `sent`, `sent_at`, `retiring` and `stopping` change under the registry lock; `done` and
    `last_used` only in the actor's thread (`finished`), written in that order, so a reader
    that sees a call done also sees when it ended.
    """

    __slots__ = (
        "key",
        "actor",
        "sent",
        "done",
        "sent_at",
        "last_used",
        "retiring",
        "stopping",
        "shared",
        "_registry",
    )

    def __init__(self, key: Key, now: float, shared: SessionState, registry: Registry) -> None:
        super().__init__()
        self.key = key
        self.actor: Any = None  # a `KeyActor` or a `ctxactors._scheduler.PoolActor`
        self.sent = 0
        self.done = 0
        self.sent_at = now
        self.last_used = now
        self.retiring = False
        self.stopping = False
        self.shared = shared
        self._registry = registry

    def idle(self) -> bool:
        server = self.server
        return self.sent == self.done and not (server is not None and server.is_busy())

    def finished(self) -> None:
        self.last_used = self._registry.clock()
        self.done += 1
        if self.retiring:
            self._registry.drained(self)


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
        launch: Callable[[Callable[[], Any], Lifecycle], Any] = KeyActor.launch,
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
        self.clock = clock
        self._launch = launch  # (factory, lifecycle) -> a started actor of the key
        self._log = log if log is not None else get_logger("ctxactors")
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, Entry] = OrderedDict()
        self._by_session: dict[SessionKey, set[Key]] = {}
        self._session_state: dict[SessionKey, SessionState] = {}
        self._draining: set[Entry] = set()  # retired, stopping once their calls are done
        # principal -> its live entries in LRU order (the caps evict a principal's own first).
        self._by_principal: dict[str | None, OrderedDict[Key, Entry]] = {}
        self._closed = False
        self._counts = {"spawned": 0, "reaped": 0, "evicted": 0, "ended": 0}
        self._calls = 0  # apart from `_counts`: one add on every call's path
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

    def submit(self, key: Key, factory: Callable[[], Any], call: Envelope) -> None:
        """Send `call` to the actor of `key`, spawning it first if there is none."""
        lock = self._lock
        lock.acquire()  # not `with`: the only lock a call takes, and `with` costs it twice
        try:
            if self._closed:
                raise RuntimeClosedError("the runtime is closed")
            entry = self._entries.get(key)
            if entry is None:
                entry, victims = self._admit(key, factory)
            else:
                victims = None
                self._entries.move_to_end(key)
                self._by_principal[key[1][0]].move_to_end(key)
            entry.sent += 1
            entry.sent_at = entry.last_used = self.clock()
            self._calls += 1
        finally:
            lock.release()
        if victims:
            self._stop(victims)
        assert entry.actor is not None
        entry.actor.post(call)

    def _admit(self, key: Key, factory: Callable[[], Any]) -> tuple[Entry, list[Entry]]:
        """Spawn the actor of a new key, and pick who makes room for it (lock held)."""
        entry = self._spawn(key, factory)
        victims: list[Entry] = []
        own = self._by_principal[key.principal]
        cap = self.max_actors_per_principal
        if cap is not None and len(own) > cap:
            victims = self._evict_lru(own, entry, "max_actors_per_principal")
        if len(self._entries) > self.max_actors:
            # A principal holding more than its fair share of the cap pays with its own
            # keys: a flood of sessions from one principal passivates its own, not
            # another's. Otherwise the global least recently used key goes.
            share = self.max_actors / len(self._by_principal)
            mine = self._evict_lru(own, entry, "max_actors") if len(own) > share else []
            victims += mine or self._evict_lru(self._entries, entry, "max_actors")
        return entry, victims

    def session_state(self, session: SessionKey, name: str, factory: Callable[[], Any]) -> Any:
        """The shared object `name` of `session` (a ``(principal, session_id)`` pair), made
        by `factory` on first use, or None.

        It lives exactly as long as the session has a live actor: it goes when the last
        one is reaped, evicted or ended, and a session with no live actor gets None (so
        nothing is kept for a session that is gone). For what all of a session's actors
        add to, like the operation history; it must be thread-safe, as they all use it.
        From one of the session's own actors (every call's history record) it takes no
        registry lock: the actor's entry holds the session's state, until it is retired.
        """
        here = current_actor()
        if type(here) is Entry and here.key[1] == session:
            # One of the session's own actors (every call's history record): no lock, and
            # None once it is retired (nothing to add to).
            shared = here.shared
            if not shared.live:
                return None
            value = shared._values.get(name)  # the lock-free read of `get`
            return shared.get(name, factory) if value is None else value
        with self._lock:
            found = self._session_state.get(session)
            return None if found is None else found.get(name, factory)

    def has_session(self, session: SessionKey) -> bool:
        with self._lock:
            return session in self._by_session

    def _spawn(self, key: Key, factory: Callable[[], Any]) -> Entry:
        shared = self._session_state.get(key.session)
        if shared is None:
            shared = self._session_state[key.session] = SessionState()
        entry = Entry(key, self.clock(), shared, self)
        entry.actor = self._launch(factory, entry)
        self._entries[key] = entry
        self._by_session.setdefault(key.session, set()).add(key)
        self._by_principal.setdefault(key.principal, OrderedDict())[key] = entry
        self._counts["spawned"] += 1
        self._peak = max(self._peak, len(self._entries))
        if info_enabled(self._log):
            self._log.info("actor_spawned", **_describe(key), actors=len(self._entries))
        return entry

    def drained(self, entry: Entry) -> None:
        """A retired entry finished a call (its actor's thread): stop it after its last."""
        with self._lock:
            if entry.stopping or entry.sent != entry.done:
                return
            entry.stopping = True
            self._draining.discard(entry)
        self._stop([entry])

    # -- passivation ---------------------------------------------------------------------

    def _retire(self, entry: Entry) -> bool:
        """Remove an entry from the table (lock held); True if it can be stopped at once.

        Otherwise its actor stops itself after its last call (`drained`): `retiring` is set
        before `done` is read here, and `finished` counts before it reads `retiring`, so one
        of the two always sees the last call done; `stopping` makes sure only one stops it.
        """
        key = entry.key
        del self._entries[key]
        keys = self._by_session.get(key.session)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_session[key.session]
                shared = self._session_state.pop(key.session, None)
                if shared is not None:
                    shared.live = False
        own = self._by_principal[key.principal]
        del own[key]
        if not own:
            del self._by_principal[key.principal]
        entry.retiring = True
        if entry.sent != entry.done:
            self._draining.add(entry)
            return False
        entry.stopping = True
        return True

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
        n = 0
        stop_if_idle = PoolActor.stop_if_idle  # no bound method a key: see `info_enabled`
        for entry in entries:
            actor = entry.actor
            try:
                if actor is None:
                    continue
                # A pooled actor nobody runs stops here and now: no job for a worker.
                if type(actor) is PoolActor and stop_if_idle(actor):
                    continue
                actor.stop()  # a plain message after the calls already queued
            except pykka.ActorDeadError:
                entry.closed.set()
            n += 1
            if n % _STOP_BATCH == 0:
                # Let the actors told so far finish stopping before waking more: thousands
                # of woken threads queued on the GIL made one pass in a few take 10x longer.
                time.sleep(0)

    def reap(self) -> int:
        """One TTL pass: stop every idle actor unused for longer than `ttl`.

        In slices of `_REAP_SLICE` entries, the lock let go between them: a million keys
        expiring together must not hold up every call for the whole pass.
        """
        cutoff = self.clock() - self.ttl
        reaped = 0
        skip: set[Key] = set()  # expired but busy: passed over, not reaped this pass
        while True:
            with self._lock:
                victims: list[Entry] = []
                for key, entry in self._entries.items():
                    if entry.sent_at > cutoff or len(victims) >= _REAP_SLICE:
                        break  # in the order sent: every later entry was sent a call since
                    # idle first: an actor that has finished has already written `last_used`
                    if key not in skip:
                        if entry.idle() and entry.last_used <= cutoff:
                            victims.append(entry)
                        else:
                            skip.add(key)
                for entry in victims:
                    self._retire(entry)
                self._counts["reaped"] += len(victims)
            self._stop(victims)
            if victims and info_enabled(self._log):
                for entry in victims:
                    self._log.info("actor_reaped", **_describe(entry.key), reason="ttl")
            reaped += len(victims)
            if not victims:
                return reaped

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
            inflight = sum(e.sent - e.done for e in self._entries.values())
            inflight += sum(e.sent - e.done for e in self._draining)
            return {
                "actors": len(self._entries),
                "inflight": inflight,
                "peak_actors": self._peak,
                "sessions": len(self._by_session),
                **self._counts,
                "calls": self._calls,
            }

    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._entries)


def _describe(key: Key) -> dict[str, Any]:
    """A key's fields for a log line."""
    return {
        "server": key.server,
        "principal": key.principal,
        "session_id": key.session[1],
        "key": list(key),
    }
