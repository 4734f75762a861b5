"""Key state beyond its actor: loaded on the key's first call, saved after every change.

A server is durable when it declares ``State`` (a msgspec type) with ``snapshot()`` and
``restore(state)``, or, declaring none, has public attributes, which are then its state
(`ctxactors._attribute_state`). With a store, each call to a durable key is run between
`Durability.load` and `Durability.save`:

- before the first call of an incarnation the key's state is loaded from the store and the
  revision remembered (a load that fails is retried on the next call, so recovery from a
  store outage is automatic);
- after a call to a tool not marked ``read_only``, the snapshot is encoded (msgpack) and,
  if it changed, saved through the runtime's `GroupCommit` with a compare-and-set on that
  revision; the caller gets its result only once the save is durable;
- a save refused as stale (another process wrote the key) turns the call into an error
  result and reloads the key from the store; a store that is down puts the in-memory state
  back to the last saved snapshot, so nothing visible changes, and the call gets an error
  result. Reads of live keys don't touch the store and keep working while it is down.

When the store is busy writing other keys' saves, the actor does not wait for its own: it
queues the save with the rest of the call (the reply, the history record, the count of
calls done) and runs its next message, and the thread that writes the batch answers the
caller once the store has it (one thread wake-up less per call). The key's next call first
waits for that outcome and settles it (`load`): the new revision, or the state
rolled back or reloaded, so no call ever runs on state the store did not take. A call whose
body a wrapper times (metrics, tracing) waits for its save in the actor, as it must return
its final result.

A server whose state is too big to save whole on every change (content: a session's
documents) also declares parts (`Parted`): its snapshot is then the small rest, and each
save carries only the parts that changed, written atomically with the snapshot under the
same revision compare-and-set.

The bookkeeping (revision, the bytes last saved) rides on the server instance, so it lives
and dies with the actor that owns it; only that actor's thread touches it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol, cast

import msgspec

from ctxactors._attribute_state import state_type
from ctxactors.logs import get_logger
from ctxactors.results import ToolResult
from ctxactors.settings import Cap
from ctxactors.state import (
    GroupCommit,
    Outcome,
    Pending,
    Record,
    SessionRef,
    StaleStateError,
    StateKey,
    StateStore,
    StoreError,
    StoreUnavailableError,
    Write,
)
from ctxactors.state_budget import StateBudget
from ctxactors.tools import Key, Server

_SLOT = "_ctxactors_durable"
_BARRIER: StateKey = ("",)  # never a server's name: deleting it is a no-op write
_encode = msgspec.msgpack.Encoder().encode
_decoders: dict[type[Server], msgspec.msgpack.Decoder[Any]] = {}
# Decoders are built one at a time. msgspec (0.22, with the GIL) caches a struct type's
# decoding info on the class before it has filled in its fields' types, and filling them
# in runs Python code (annotations are evaluated), where the GIL may pass to another
# thread: one that builds a decoder for the same type then gets the half-built info, and
# its first decode crashes the process (SIGSEGV in msgspec's mpack_decode). A shard hit
# it when several sessions moved in at once, each loading its state on its own worker.
_decoders_lock = threading.Lock()


def is_durable(server: type[Server]) -> bool:
    """Whether the server's keys have state to keep (after `declare`, for a server without
    a ``State``)."""
    return state_type(server) is not None


class Parted(Protocol):
    """A durable server whose state is saved in parts as well as its snapshot.

    `restore_parts` replaces every part with the stored ones (on each load) and starts
    tracking changes; from then on `changed_parts` gives each part changed since the last
    `settle_parts` (its bytes, or None when it went), and `settle_parts(saved=False)` puts
    those parts back as they were (the save failed). Without a store nothing loads, so
    nothing is tracked.
    """

    def restore_parts(self, parts: dict[str, bytes]) -> None: ...

    def changed_parts(self) -> dict[str, bytes | None]: ...

    def settle_parts(self, saved: bool) -> None: ...


_parted: dict[type[Server], bool] = {}


def as_parted(server: Server) -> Parted | None:
    """`server` if it is `Parted`, else None (a cached class check: it runs on every call)."""
    kind = type(server)
    found = _parted.get(kind)
    if found is None:
        found = _parted[kind] = all(
            callable(getattr(kind, m, None))
            for m in ("restore_parts", "changed_parts", "settle_parts")
        )
    return cast(Parted, server) if found else None


def state_key(key: Key) -> tuple[SessionRef, StateKey]:
    """A runtime key ``(server, (principal, session), ...)`` as the store's two halves."""
    return key.session, (key.server, *key[2:])


def encode_state(server: Server) -> bytes:
    return _encode(server.snapshot())


def decode_state(server: type[Server], data: bytes) -> Any:
    decoder = _decoders.get(server)
    if decoder is None:
        with _decoders_lock:
            decoder = _decoders.get(server)
            if decoder is None:
                decoder = _decoders[server] = msgspec.msgpack.Decoder(state_type(server))
    return decoder.decode(data)


class _Follower(Protocol):
    """Writes behind the calls of one session (its history)."""

    def flush(self) -> None: ...

    def drain(self, timeout: float) -> bool: ...

    def close(self) -> None: ...


class SessionListener(Protocol):
    """What keeps session data outside the store (the workspace's directories) and must
    follow the session's retention: told of uses, deletes and purge passes."""

    def touched(self, sessions: list[SessionRef]) -> None:
        """These sessions were just used (or have a live actor): their retention restarts."""

    def deleted(self, session: SessionRef) -> None:
        """The session was ended: forget its data now."""

    def purge(self, retention: float) -> None:
        """Forget data untouched for `retention` seconds (sessions in use were touched just
        before)."""


class _Slot:
    """What one incarnation of a key knows about its stored state."""

    __slots__ = ("revision", "data", "empty", "loaded", "saving", "session", "key", "parted")

    def __init__(self, empty: bytes, key: Key, parted: Parted | None) -> None:
        # Where it is stored, and the server as `Parted` (or None): looked up once, not
        # on every call.
        self.session, self.key = state_key(key)
        self.parted = parted
        self.revision = 0  # the stored revision `data` was loaded or saved as (0: none)
        self.data = empty  # the snapshot the store holds, as bytes
        self.empty = empty  # a fresh instance's snapshot: what "nothing stored" restores
        self.loaded = False
        self.saving: _Saving | None = None  # a save the actor went on without


class _Saving(Pending):
    """A save on its way to the store while its actor runs on (`Durability.save` with
    `then`). The writing thread records the outcome, answers the caller (`then`) and only
    then marks it `settled`; the actor settles the outcome before the key's next call.
    One object per save (it is the group commit's queue entry too): this runs per call, so
    a lock is made only when the next call must wait (`wait`)."""

    __slots__ = ("durability", "result", "then", "charged", "settled", "_waiter")

    def __init__(
        self,
        durability: Durability,
        write: Write,
        result: ToolResult,
        then: Callable[[ToolResult], None],
        charged: int,
    ) -> None:
        # Pending's fields set here, not by its __init__: one call less on every save.
        self.write, self.done, self.wake, self.outcome, self.batch = write, None, None, None, None
        self.durability = durability
        self.result = result
        self.then = then
        self.charged = charged  # the bytes the state budget counts in flight for it
        self.settled = False
        self._waiter: threading.Lock | None = None

    def answer(self, outcome: Outcome | StoreError) -> None:
        """In the writing thread, once the store has answered (only for a queued save)."""
        self.outcome = outcome
        result = self.result
        if self.charged:  # answered: no longer in flight (given back if not taken)
            self.durability.budget.landed(self.write.session, self.charged, type(outcome) is int)
        try:
            if type(outcome) is not int:
                result = self.durability.answer(self.write, outcome, result)
        except Exception as exc:  # noqa: BLE001 - the caller must get an answer still
            result = _unavailable(exc)
        try:
            self.then(result)
        except Exception as exc:  # noqa: BLE001 - one caller must not strand the batch's rest
            self.durability._log.error("save_callback_failed", exc_info=exc)
        finally:
            # In this order, against `wait`'s: one of the two sees the other's write (the
            # GIL orders them), so a waiter is either released here or never waits.
            self.settled = True
            waiter = self._waiter
            if waiter is not None:
                waiter.release()

    def wait(self, timeout: float | None) -> bool:
        """In the actor: wait until `settled` (False when `timeout` passed first)."""
        waiter = threading.Lock()
        waiter.acquire()
        self._waiter = waiter
        if self.settled:
            return True
        return waiter.acquire(True, -1 if timeout is None else timeout)


class Durability:
    """The store side of a runtime: one group-commit writer, the load/save of every key."""

    def __init__(
        self,
        store: StateStore,
        *,
        save_timeout: float = 30.0,
        flush_delay: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        live: Callable[[], Iterable[SessionRef]] = tuple,
        max_principal_bytes: Cap | None = None,
    ) -> None:
        self.store = store
        # Each principal's stored bytes, charged before its saves (`ctxactors.state_budget`);
        # the cap is ``state.max_principal_bytes`` (its default unless given).
        self.budget = StateBudget(store, max_principal_bytes)
        self.save_timeout = save_timeout
        self.flush_delay = flush_delay
        self.commit = GroupCommit(store)
        self._log = get_logger("ctxactors.durable")
        self._clock = clock
        self._purged_at = clock()
        # Retention counts from a session's last use, reads included: a used session is
        # touched in the store behind its calls, at most once per `touch_every` seconds;
        # and every session with a live actor (`live`) is touched before each purge.
        self.touch_every = store.retention / 100
        self._live = live
        self._used: dict[SessionRef, float] = {}  # session -> when its last touch was sent
        self._to_touch: set[SessionRef] = set()
        self._listeners: list[SessionListener] = []
        # Per session, what writes behind the calls (the history): closed on delete.
        self._followers: weakref.WeakValueDictionary[SessionRef, _Follower] = (
            weakref.WeakValueDictionary()
        )
        # Followers with a write waiting, flushed by the flusher thread `flush_delay`
        # seconds later: a busy session's history costs one write per delay, not per call
        # (with a write per call, the history's bytes halved a SQLite store's throughput).
        self._deferred: dict[SessionRef, _Follower] = {}
        self._deferred_lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._flusher = threading.Thread(
            target=self._flush_forever, name="ctxactors-flusher", daemon=True
        )
        self._flusher.start()

    def load(self, server: Server, key: Key) -> ToolResult | None:
        """Before a call: load the key's state on its incarnation's first call (or after
        a failed one). None when ready, else the error result the call gets instead."""
        slot: _Slot | None = getattr(server, _SLOT, None)
        if slot is None:
            slot = _Slot(encode_state(server), key, as_parted(server))
            setattr(server, _SLOT, slot)
        elif slot.saving is not None:
            saving, slot.saving = slot.saving, None
            if not saving.settled:  # not answered yet (seldom): wait
                self._wait_saving(saving)
            outcome, data = saving.outcome, saving.write.data
            if type(outcome) is int and slot.parted is None and data is not None:
                slot.revision, slot.data = outcome, data  # saved: `_settle`'s common case
            else:
                assert outcome is not None
                self._settle(server, slot, saving.write, outcome)
        if not slot.loaded:
            try:
                self._load(server, slot)
            except StoreError as exc:
                return _unavailable(exc)
        return None

    def save(
        self,
        server: Server,
        key: Key,
        result: ToolResult,
        then: Callable[[ToolResult], None] | None = None,
    ) -> ToolResult | None:
        """After a call that may have written: save the state if it changed.

        Without `then`, wait for the store and return what the caller gets: `result`, or
        the error result of a refused save. With `then`, return None at once and call it
        (in the writing thread) with that once the store has answered: the actor goes on
        to its next message, whose `load` first waits for this outcome (see `_Saving`).
        """
        slot: _Slot = getattr(server, _SLOT)
        try:
            data = _encode(server.snapshot())
        except TypeError as exc:  # a value set since registration that msgspec can't encode
            self._roll_back(server, slot)
            return ToolResult.error(
                f"not saved: the state of {type(server).__name__} can't be encoded ({exc}); "
                "nothing was changed"
            )
        if slot.parted is None:
            if data == slot.data:
                self.used(slot.session)  # no save to restart the session's retention
                return result
            write = Write(slot.session, slot.key, data, slot.revision)
        else:
            parts = slot.parted.changed_parts()
            if data == slot.data and not parts:
                self.used(slot.session)
                return result
            write = Write(slot.session, slot.key, data, slot.revision, tuple(parts.items()))
        # Charged before it is written (concurrent saves of one principal never overshoot),
        # given back in `_settle` if the store doesn't take it.
        grows = len(data) - (len(slot.data) if slot.revision else 0)
        if grows and slot.session[0] is not None:
            refused = self._charge(server, slot, grows)
            if refused is not None:
                return refused
        else:
            grows = 0  # nothing charged, nothing in flight
        outcome: Outcome | StoreError | TimeoutError | None
        if then is not None:
            saving = _Saving(self, write, result, then, grows)
            if not self.commit.write_or_queue(saving):
                slot.saving = saving  # settled before the key's next call (`load`)
                return None
            outcome = saving.outcome
            assert outcome is not None
        else:
            try:
                outcome = self.commit.save(write, timeout=self.save_timeout)
            except (StoreError, TimeoutError) as exc:
                outcome = exc
        if grows:  # a timed-out save counts still, as it may land (over, never under)
            self.budget.landed(slot.session, grows, not isinstance(outcome, StoreError))
        self._settle(server, slot, write, outcome)
        return self.answer(write, outcome, result)

    def _charge(self, server: Server, slot: _Slot, grows: int) -> ToolResult | None:
        """Count the save's `grows` bytes for its principal; if over its budget (or its first
        count can't be read), the state as last saved and the error the caller gets."""
        try:
            if self.budget.charge(slot.session, grows):
                return None
            error = ToolResult.error(
                f"not saved: {self.budget.refused(slot.session[0], grows)}; nothing was "
                "changed (end the sessions this principal no longer needs to free some)"
            )
        except StoreError as exc:
            error = _unavailable(exc)
        self._roll_back(server, slot)
        return error

    def _load(self, server: Server, slot: _Slot) -> None:
        record = self.store.load(slot.session, slot.key)
        if record is None:
            if slot.data != slot.empty:  # forgotten by the store (retention): start afresh
                server.restore(decode_state(type(server), slot.empty))
            slot.revision, slot.data = 0, slot.empty
        else:
            server.restore(decode_state(type(server), record.data))
            slot.revision, slot.data = record.revision, record.data
        if slot.parted is not None:
            slot.parted.restore_parts({} if record is None else record.parts)
        slot.loaded = True

    def answer(
        self, write: Write, outcome: Outcome | StoreError | TimeoutError, result: ToolResult
    ) -> ToolResult:
        """What the caller of a save gets: its result, or why its change was not kept."""
        if isinstance(outcome, int):
            return result
        if isinstance(outcome, StaleStateError):
            self._log.warning(
                "stale_state", session=list(write.session), key=list(write.key), error=str(outcome)
            )
            return ToolResult.error(
                f"not saved: {outcome}. Another process changed this state; it is reloaded "
                "from the store, so check it and retry the call"
            )
        return _unavailable(outcome)

    def _settle(
        self,
        server: Server,
        slot: _Slot,
        write: Write,
        outcome: Outcome | StoreError | TimeoutError,
    ) -> None:
        """In the actor's thread, once a save's outcome is known: the key's memory follows
        the store (the save's revision, or the newer state, or the last saved one)."""
        assert write.data is not None
        if isinstance(outcome, int):
            if slot.parted is not None:
                slot.parted.settle_parts(saved=True)
            slot.revision, slot.data = outcome, write.data
            return
        # Not taken: its charge was given back when it landed (`StateBudget.landed`); a
        # stale save's key is reloaded, and what another process stored there counts.
        if isinstance(outcome, StaleStateError):
            before = len(slot.data) if slot.revision else 0
            slot.loaded = False
            try:
                self._load(server, slot)
                self.budget.adjust(slot.session, (len(slot.data) if slot.revision else 0) - before)
            except StoreError:
                self._roll_back(server, slot)  # and reload on the next call
        else:
            self._roll_back(server, slot)
            if isinstance(outcome, TimeoutError):
                slot.loaded = False  # the save may yet land: read back what the store has

    def _wait_saving(self, saving: _Saving) -> None:
        """Wait for the outcome of the key's last save, which went on without its actor
        (`load` then settles it: no call ever runs on state the store refused)."""
        if saving.wait(self.save_timeout):
            return
        if self.commit.withdraw(saving.write):  # never to be written: say so here
            saving.answer(StoreUnavailableError("the state store did not confirm the save in time"))
        else:
            saving.wait(None)  # being written: the store's own timeouts bound it

    @staticmethod
    def _roll_back(server: Server, slot: _Slot) -> None:
        """The state as last saved: the snapshot, and the parts changed since put back."""
        server.restore(decode_state(type(server), slot.data))
        if slot.parted is not None:
            slot.parted.settle_parts(saved=False)

    def follow(self, session: SessionRef, follower: _Follower) -> _Follower | None:
        """Close `follower` when the session is deleted (it writes behind the calls);
        returns the one it replaces (a previous incarnation's, maybe still writing)."""
        previous = self._followers.get(session)
        self._followers[session] = follower
        return previous

    def load_written(self, session: SessionRef, key: StateKey) -> Record | None:
        """What the store holds for `key` once the writes behind the session's calls (its
        history) are written: a peek right after a reap must not miss the last call."""
        follower = self._followers.get(session)
        if follower is not None:
            follower.drain(self.save_timeout)
        return self.store.load(session, key)

    def delete_session(self, session: SessionRef) -> int:
        """Forget the session's stored state, after every save already queued for it (a
        history written behind its last call must not land after the delete)."""
        follower = self._followers.pop(session, None)
        if follower is not None:
            follower.close()
            # A write it handed over just before may not be queued yet: it must land
            # before the delete, not after (it would bring the session's history back).
            follower.drain(self.save_timeout)
        for listener in self._listeners:
            listener.deleted(session)
        try:
            self.commit.save(Write(session, _BARRIER, None, 0), timeout=self.save_timeout)
        except TimeoutError as exc:
            raise StoreUnavailableError(f"the state store did not answer: {exc}") from None
        deleted = self.store.delete_session(session)
        self.budget.deleted(session)
        return deleted

    def used(self, session: SessionRef) -> None:
        """The session was just used (any call): start its retention again, soon and cheaply
        (a touch written behind the calls, at most once per `touch_every`)."""
        now = self._clock()
        last = self._used.get(session)
        if last is not None and now - last < self.touch_every:
            return
        with self._deferred_lock:
            self._used[session] = now
            self._to_touch.add(session)
        self._wake.set()

    def listen(self, listener: SessionListener) -> None:
        self._listeners.append(listener)

    def _touch(self, sessions: list[SessionRef]) -> None:
        for listener in self._listeners:
            listener.touched(sessions)
        try:
            self.store.touch(sessions)
        except StoreError as exc:
            self._log.warning("touch_failed", error=str(exc))
            with self._deferred_lock:  # touch them again on their next use
                for session in sessions:
                    self._used.pop(session, None)

    def purge(self, every: float) -> int:
        """Forget sessions past their retention, at most once every `every` seconds; never
        one with a live actor (its retention starts again now)."""
        now = self._clock()
        if now - self._purged_at < every:
            return 0
        self._purged_at = now
        with self._deferred_lock:
            self._used = {s: t for s, t in self._used.items() if now - t < self.touch_every}
            waiting, self._to_touch = self._to_touch, set()
        self._touch([*waiting, *self._live()])
        for listener in self._listeners:
            listener.purge(self.store.retention)
        purged = self.store.purge()
        if purged:
            self.budget.forget()  # which sessions went is the store's: recount each principal
            self._log.info("sessions_purged", sessions=purged)
        return purged

    def defer(self, session: SessionRef, follower: _Follower) -> None:
        with self._deferred_lock:
            if self._deferred.get(session) is follower:
                return  # the flusher's next pass writes it (a busy session: every call)
            self._deferred[session] = follower
        self._wake.set()

    def _flush_all(self) -> None:
        with self._deferred_lock:
            waiting = list(self._deferred.values())
            self._deferred.clear()
            touch, self._to_touch = self._to_touch, set()
        for follower in waiting:
            follower.flush()
        if touch:
            self._touch(list(touch))

    def _flush_forever(self) -> None:
        while not self._closing.is_set():
            self._wake.wait()
            self._wake.clear()
            self._closing.wait(self.flush_delay)  # let more records gather
            self._flush_all()

    def flush(self) -> None:
        """Write what waits behind the calls (the histories, the touches) now, and wait."""
        with self._deferred_lock:
            touch, self._to_touch = self._to_touch, set()
        if touch:
            self._touch(list(touch))
        for follower in list(self._followers.values()):
            follower.drain(self.save_timeout)

    def close(self) -> None:
        """Write what waits, then stop the writer (after the actors have stopped)."""
        self._closing.set()
        self._wake.set()
        self._flusher.join()
        self.flush()
        self.commit.close()


def _unavailable(exc: BaseException) -> ToolResult:
    return ToolResult.error(
        f"the state store is unavailable ({exc}); nothing was changed, retry the call later"
    )
