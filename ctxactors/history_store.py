"""A session's operation history in the state store, under the session's own key
``("history",)``, so it outlives the session's actors (reaps, evictions, restarts).

The history is written behind the calls, not before their replies: it is what the tools
just did, while the keys' own states are what they did. Each record is encoded (msgpack)
once, by the first write that carries it; a write of the history is the bounded list of
those encodings (at most the configured operations), not a fresh encoding of every record,
so a record costs its encoding once however many writes carry it, and nothing when the
bound pushes it out first. The first record after a write leaves the history waiting; the
runtime's flusher hands it to the group commit `history.write_delay` later (1 s,
`Durability.flush_delay`), with every record added meanwhile, and a reply never waits for
it. While one write of a session is under way, newer records wait for it. So a busy
session costs one history write per delay, not one per call, and a crash loses at most
the last delay's history, never a key's state. A call takes no lock of its own here:
the saver's state is guarded by the history's lock, which the call holds anyway to add its
record, and it tells the flusher only when nothing of the session waits yet.

Stored, the history is one msgpack array of its records (`Stored`, or `StoredCall` for a
common call, whose record is made only when read), zlib-compressed (`pack`); the first
format, the same array uncompressed, still reads. Rewriting the bounded history on each
write beat appending the new records as parts of the key: compressed, a busy session's
whole history is smaller than a page, and parts take a SQLite batch off its one-statement
path (about 17 µs more per history write, measured).

Each write is charged to the principal's state budget (`ctxactors.state_budget`) like a
key's save: one that would take a principal past ``state.max_principal_bytes`` is not
written (a shrink always is), or a principal over its budget could still store up to the
bound for every new session it opens, without end. The calls it records were answered
already, with their results: their records stay in the session's live history (what
``get_recent_context`` reads) and go with the session's next write that fits the budget;
they are lost only if the session's actors go first (reaped, or a restart). The refusal is
logged once (a warning with the principal, the session and the budget's own wording), and
the principal's saves of key state are refused with the same words as long as it is over.
The flusher writes every principal's histories, so it never waits for one principal's
recount (a store query: a Redis SCAN): a write whose principal isn't counted yet starts
that count on another thread and waits for the flusher's next pass (`_charge`).

`end_session` closes the session's saver (nothing more is written) and waits for the
writes already queued before it deletes. A write that fails (the store is down, or another
process wrote this session's history) makes the next record (or read) reload from the
store, merge what it holds with what this process kept, and carry on from its revision.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import msgspec

from ctxactors._decoding import build_now
from ctxactors.durable import Durability
from ctxactors.logs import lazy_logger
from ctxactors.state import SessionRef, StoreError, Write, answering
from ctxactors.tools import Scope

KEY = ("history",)
# After a failed read of the stored history, the calls of the next second don't try again:
# with the store down, each would wait for its timeout (seconds on Redis) under the lock.
_RETRY_LOAD = 1.0


class Stored(msgspec.Struct, array_like=True):
    """One stored record: its wall-clock time and ``[scope, operation]`` (as
    `OperationRecord` encodes). The only kind before `StoredCall`, so still read."""

    wall: float
    op: Any


class StoredCall(msgspec.Struct, array_like=True):
    """One stored call, as the history keeps a common call in memory (`_Pending`): its
    record (metadata and all) is made when the history is read, not on the call's path.
    `text` is the result's text (its JSON when `structured`), empty when the metadata
    can't need it (a plain text result that is no error)."""

    wall: float
    scope: Scope
    tool: str
    arguments: dict[str, Any]
    text: str
    is_error: bool
    structured: bool
    assistant_id: str | None
    thread_id: str | None


_log = lazy_logger("ctxactors.history")
_encode = msgspec.msgpack.Encoder().encode
# The stored history is a msgpack array of `Stored` and `StoredCall` (told apart by their
# length): read as each record's own bytes (`Raw`), so a reloaded record is not encoded
# again on the next write.
_decode_history = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode
build_now(Stored, StoredCall)  # each worker loading a history converts records to them
_decode_any = msgspec.msgpack.Decoder(list[Any]).decode

# Written compressed behind this tag (zlib, fastest level), which no msgpack array starts
# with: a history written whole uncompressed (the first format) still reads. A busy
# session's 50 records are alike (one tool, similar arguments): 6 KB of msgpack became
# 0.6 KB for 15 µs, and in SQLite a row under ~1 KB needs no overflow pages (with 32
# sessions of ``scripts/bench_store.py``, SQLite's CPU per history write went from about
# 120 µs to 60 µs).
_ZLIB = b"z"
# Far above any history's size (50 bounded records): more is not ours, read as unreadable.
_MAX_HISTORY_BYTES = 64 * 1024 * 1024


def pack(records: list[bytes]) -> bytes:
    """The stored form of a history: its records' encodings (each made once, by the first
    write that carries it: msgpack of `Stored` or `StoredCall`), as one compressed array."""
    return _ZLIB + zlib.compress(_encode([msgspec.Raw(r) for r in records]), 1)


def unpack(data: bytes) -> list[tuple[Stored | StoredCall, bytes]]:
    """The records of a stored history with their encodings, oldest first (either format).
    Raises ValueError (or a subclass) when the bytes are not a history."""
    if data.startswith(_ZLIB):
        inflate = zlib.decompressobj()
        data = inflate.decompress(data[len(_ZLIB) :], _MAX_HISTORY_BYTES)
        if inflate.unconsumed_tail or not inflate.eof:
            raise ValueError("a stored history too large or cut short")
    return [(decode(raw), bytes(raw)) for raw in _decode_history(data)]


def decode(raw: msgspec.Raw) -> Stored | StoredCall:
    """One stored record (raises `msgspec.ValidationError` if it is neither kind)."""
    fields = _decode_any(raw)
    if len(fields) == 2:
        return msgspec.convert(fields, Stored)
    return msgspec.convert(fields, StoredCall)


class HistorySaver:
    """The store side of one session's history.

    Guarded by the history's own lock (`bind`): `load` and `changed` run with it held, on a
    call's path; `flush` (in the runtime's flusher) and `_done` (in the group-commit
    writer) take it, and submit without it (a write may be made, and answered, in the
    submitting thread).
    """

    def __init__(self, durable: Durability, session: SessionRef) -> None:
        self._durable = durable
        self._session = session
        self._lock = threading.Lock()  # the history's own, once bound
        self._encodings: Callable[[], list[bytes]] = list
        self._merge: Callable[[], object] = lambda: None
        self._next = 0  # the revision the next write expects
        # The bytes the store holds (None: not read yet) and those of the write under way,
        # charged to the principal's state budget (a write it refuses waits for the next
        # record; `_refused`: that was logged, until a write is taken again).
        self._stored: int | None = None
        self._writing = 0
        self._refused = False
        self._retry_at = 0.0  # no store read before this (`time.monotonic`): see `load`
        self.loaded = False  # read by the history on every record, under its lock
        self._waiting = False  # records wait for a write (the flusher was told)...
        self._inflight = False  # ...one write at a time per session: the newest waits
        self._closed = False
        self._idle = threading.Event()  # set while no write is under way
        self._idle.set()
        # The saver of this session's previous incarnation (reaped or evicted a moment
        # ago) may still have writes to make: read the store only once they are done.
        self._previous = durable.follow(session, self)

    def bind(
        self,
        lock: threading.Lock,
        encodings: Callable[[], list[bytes]],
        merge: Callable[[], object],
    ) -> None:
        """Share the history's `lock`; `encodings()` (called with it held) lists the
        records to write, oldest first, each as msgpack of a `Stored` or `StoredCall`;
        `merge()` (with it held) takes in what the store holds (`load`)."""
        self._lock = lock
        self._encodings = encodings
        self._merge = merge

    def load(self) -> list[tuple[Stored | StoredCall, bytes]] | None:
        """(lock held) What the store holds: each record and its encoding, oldest first;
        None when the store can't be read now (read it next time).

        Never in a thread answering a batch of saves (a record added by a save's caller
        there): waiting for the previous incarnation's writes would wait for that very
        thread, so the records wait for the next read (or the flusher's `flush`)."""
        if answering():
            return None
        previous, self._previous = self._previous, None
        if previous is not None:
            previous.drain(self._durable.save_timeout)
        now = time.monotonic()
        if now < self._retry_at:
            return None  # the store failed a moment ago: don't make every call wait on it
        try:
            record = self._durable.store.load(self._session, KEY)
        except StoreError:
            self._retry_at = now + _RETRY_LOAD
            return None
        self.loaded = True
        self._next = 0 if record is None else record.revision
        stored = 0 if record is None else len(record.data)
        if self._stored is not None:  # read again (a write failed): someone else's bytes
            self._durable.budget.adjust(self._session, stored - self._stored)
        self._stored = stored
        if record is None:
            return []
        try:
            return unpack(record.data)
        except (ValueError, zlib.error) as exc:  # msgspec's errors are ValueErrors too
            # Written by something else: unreadable, it is replaced by the next write.
            _log.warning("history_unreadable", session=list(self._session), error=str(exc))
            return []

    def changed(self) -> bool:
        """(lock held) Records were added: True when the caller must `defer` (after
        releasing the lock), False when a write is waiting already or under way (whose
        `_done` hands the new records on)."""
        if self._waiting or self._closed:
            return False
        self._waiting = True
        return not self._inflight

    def defer(self) -> None:
        """Have the flusher write what waits, `Durability.flush_delay` from now."""
        self._durable.defer(self._session, self)

    def flush(self, recount: bool = False) -> None:
        """Submit the waiting history now, unless a write of it is still under way. Not
        read from the store yet (first used in a writing thread, or after a failed write),
        it is read and merged first; if the store can't be read, the flusher tries again
        a delay later (nothing is written blind over what the store holds). Without
        `recount` (the flusher), a principal whose bytes aren't counted yet is counted on
        another thread, and its history waits a delay too."""
        with self._lock:
            if not self._waiting or self._inflight or self._closed:
                return
            if not self.loaded:
                self._merge()
            unread = not self.loaded
            if not unread:
                self._waiting = False
                self._inflight = True
                self._idle.clear()
                records, expected = self._encodings(), self._next
        if unread:
            self.defer()
            return
        write = Write(self._session, KEY, pack(records), expected)
        assert write.data is not None
        self._writing = len(write.data) - (self._stored or 0)
        if self._charge(recount):
            self._durable.commit.submit(write, self._done)

    def _charge(self, recount: bool) -> bool:
        """Charge the write under way to the principal's budget: False when it is not to
        be written (over the budget, or the budget can't read the store: then it is read,
        merged and written again like a refused write; or, without `recount`, its
        principal is being counted: written a delay later), and no write is under way."""
        budget = self._durable.budget
        try:
            if recount:
                taken: bool | None = budget.charge(self._session, self._writing)
            else:
                taken = budget.charge_counted(self._session, self._writing)
            if taken:
                self._refused = False
                return True
            unread = False
        except StoreError:
            unread = True
        if not unread and taken is None:
            with self._lock:  # its principal is being counted: the next pass writes it
                self._waiting = True
                self._inflight = False
                self._idle.set()
                again = not self._closed
            if again:
                self.defer()
            return False
        with self._lock:
            if unread:
                self.loaded = False
                self._waiting = True  # the flusher's next pass reads, merges, tries again
            # Else the records wait for the next one, which writes them all (the bound),
            # and the refusal is logged once.
            refused = not unread and not self._refused
            self._refused = self._refused or refused
            self._inflight = False
            self._idle.set()
            again = unread and not self._closed
        if refused:
            principal = self._session[0]
            _log.warning(
                "history_not_saved",
                principal=principal,
                session=self._session[1],
                error=f"{budget.refused(principal, self._writing)}; this session's history is "
                "kept in memory only until a write fits",
            )
        if again:
            self.defer()
        return False

    def _done(self, outcome: object) -> None:
        with self._lock:
            if isinstance(outcome, BaseException):  # stale or unavailable: re-read, merge
                self.loaded = False
                self._waiting = True  # written again, merged, by the flusher's next pass
                self._durable.budget.landed(self._session, self._writing, kept=False)
            else:
                assert isinstance(outcome, int)
                self._durable.budget.landed(self._session, self._writing, kept=True)
                self._next = outcome
                self._stored = (self._stored or 0) + self._writing
            self._inflight = False
            self._idle.set()
            again = self._waiting and not self._closed
        if again:
            self.defer()

    def drain(self, timeout: float) -> bool:
        """Write everything waiting and wait until it is written (or `timeout` passes)."""
        deadline = time.monotonic() + timeout
        merged = False
        while True:
            self.flush(recount=True)  # not the flusher: it may wait for a count
            with self._lock:
                if not self._inflight and (not self._waiting or self._closed):
                    return True
                unread = not self._inflight and not self.loaded
            if unread:  # a write was refused: the next flush reads and merges first
                if merged:
                    return False  # the store can't be read now: nothing to wait for
                merged = True
            elif not self._idle.wait(max(deadline - time.monotonic(), 0.0)):
                return False

    def close(self) -> None:
        """The session was ended: write nothing more (a late write would bring it back)."""
        with self._lock:
            self._closed = True
            self._waiting = False


def wall_to_clock(wall: float, clock_now: float) -> float:
    """A stored wall-clock instant on the history's (monotonic) clock."""
    return clock_now - (time.time() - wall)
