"""The SQLite store: one file, WAL mode, every batch of saves in one transaction.

WAL with ``synchronous=NORMAL`` (SQLite's recommended setting for WAL): a commit is
written to the WAL file but not fsynced, so a committed save survives a crash or kill -9
of the process (the kernel has it), while a power loss or kernel crash may lose the
commits since the last checkpoint (never corrupting the file). Checkpoints, which fsync,
run every half second in a background connection (`ctxactors.state._checkpoint`). Pass
``synchronous="FULL"`` to fsync every commit (about ten times the cost of a commit here).
Group commit (`ctxactors.state.GroupCommit`) makes many saves share a transaction.

The retention purge deletes a batch of expired sessions per transaction (`PURGE_BATCH`) and
lets the saves and loads that wait go between two batches, so after a long downtime a
purge of a million sessions delays a save by one batch, and its WAL stays checkpointed.

On a full disk a save is refused (`StoreUnavailableError`, nothing of it kept), a load
still reads, and a delete (purge, `end_session`) goes through on the space of a reserve
file (`ctxactors.state._reserve`); saves then resume by themselves.

Sessions and keys are stored as JSON arrays (`encode_ref`), so no two tuples collide.
Retention uses the wall clock: it must mean the same after a restart.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ctxactors.state._base import (
    Outcome,
    Part,
    Record,
    SessionRef,
    StaleStateError,
    StateKey,
    StoreUnavailableError,
    Write,
    encode_ref,
    principal_prefix,
)
from ctxactors.state._checkpoint import BACKSTOP_PAGES, Checkpointer
from ctxactors.state._reserve import Reserve
from ctxactors.state._turns import TurnLock

# Held back for deletes on a full disk (see _reserve): half for the WAL not yet checkpointed,
# half for the delete (measured: deleting 1.6 MB of content in 27 sessions wrote under 30
# pages of WAL). It also caps the WAL the writer lets grow before it checkpoints itself:
# 1,024 pages, past which the checkpointer thread (every 0.5 s) is already behind.
RESERVE_BYTES = 8 << 20

# Sessions a purge deletes per transaction: each batch holds the store's lock (a save waits
# for at most one) and adds its pages to the WAL, which a checkpoint can copy back and
# reuse between batches. One transaction for a million sessions took 1,049-1,436 s, every
# save waiting all along, and grew the WAL to 3.2 GB.
PURGE_BATCH = 256
# A purge that finds this many batches of expired sessions (after a downtime) deletes them in
# key order, scanning the sessions this many batches at a time: each batch's rows are then
# neighbours in the file, which halved the CPU and the pages written (100,000 sessions:
# `scripts/bench_restart.py --purge-only`). Fewer are found by age, through the index.
PURGE_SCAN = 16

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session TEXT PRIMARY KEY,
    touched REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS state (
    session TEXT NOT NULL,
    key TEXT NOT NULL,
    revision INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (session, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_by_age ON sessions (touched);
CREATE TABLE IF NOT EXISTS parts (
    session TEXT NOT NULL,
    key TEXT NOT NULL,
    part TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (session, key, part)
);
"""


_T = TypeVar("_T")

# SQLite's answers for a file that is not (or no longer) a whole database.
_DAMAGED = ("SQLITE_NOTADB", "SQLITE_CORRUPT")


def _unusable(path: Path, exc: sqlite3.DatabaseError) -> str:
    """What an operator reads when the file can't be opened: which file, what is wrong,
    what to do (``serve`` prints it as its one line)."""
    if getattr(exc, "sqlite_errorname", None) in _DAMAGED:
        return (
            f"the state store {path} is damaged ({exc}): move it aside to start with an "
            "empty store, or restore it from a backup"
        )
    return (
        f"the state store {path} can't be opened ({exc}): check that this user may read "
        "and write it and its directory, and that the disk has room"
    )


def _open(path: Path, synchronous: str, reserve_bytes: int) -> sqlite3.Connection:
    """The store's connection, its schema made; `StoreUnavailableError` (saying what to do)
    for a file SQLite can't use."""
    db: sqlite3.Connection | None = None
    try:
        # Autocommit mode: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("PRAGMA busy_timeout=5000")
        # The WAL a full disk can't checkpoint any more must fit in half the reserve (the
        # other half is the delete's): past that, the writer checkpoints itself.
        page = db.execute("PRAGMA page_size").fetchone()[0]
        backstop = min(BACKSTOP_PAGES, max(reserve_bytes // (2 * page), 16))
        db.execute(f"PRAGMA wal_autocheckpoint={backstop}")
        # Debian's SQLite zeroes every page a delete frees (SECURE_DELETE), which writes
        # as much WAL as the data deleted: a purge then needs the disk space it is meant to
        # free. FAST zeroes only what costs no extra write; the file is the server's (0600),
        # and freed pages are overwritten by the next saves.
        db.execute("PRAGMA secure_delete=FAST")
        db.executescript(_SCHEMA)
    except sqlite3.DatabaseError as exc:
        if db is not None:
            db.close()
        raise StoreUnavailableError(_unusable(path, exc)) from None
    return db


class SQLiteStore:
    """Key state in a SQLite file. One connection under a lock: writes come in batches
    from the group-commit thread, loads only on a key's first call after a restart."""

    def __init__(
        self,
        path: str | Path,
        *,
        retention: float = 3600.0,
        synchronous: str = "NORMAL",
        clock: Callable[[], float] = time.time,
        reserve_bytes: int = RESERVE_BYTES,
        purge_batch: int = PURGE_BATCH,
    ) -> None:
        if synchronous.upper() not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        if purge_batch < 1:
            raise ValueError(f"purge_batch must be at least 1, got {purge_batch!r}")
        self.purge_batch = purge_batch
        self.retention = retention
        self.path = Path(path)
        self._clock = clock
        self._lock = TurnLock()
        # session -> when this store last touched it: see `_refresh`.
        self._touched: dict[SessionRef, float] = {}
        self._touch_every = retention / 100
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = _open(self.path, synchronous.upper(), reserve_bytes)
        self._checkpointer = Checkpointer(self.path)
        self._reserve = Reserve(Path(f"{self.path}-reserve"), reserve_bytes)
        self._reserve.hold()

    def load(self, session: SessionRef, key: StateKey) -> Record | None:
        sid, kid = encode_ref(session), encode_ref(key)
        with self._lock:
            now = self._clock()
            try:
                with self._transaction():
                    touched = self._refresh([session], now)
                    row, parts = self._read(sid, kid)
                self._touched.update(touched)
            except StoreUnavailableError as exc:
                if not _full(exc):
                    raise
                # A full disk can't take the touch: read without it (an expired session
                # reads as gone, as the purge would have left it).
                with self._transaction("BEGIN"):
                    row, parts = (None, []) if self._expired(sid, now) else self._read(sid, kid)
        if row is None:
            return None
        return Record(row[0], bytes(row[1]), {name: bytes(data) for name, data in parts})

    def touch(self, sessions: Iterable[SessionRef]) -> None:
        sessions = list(sessions)
        sids = [encode_ref(s) for s in sessions]
        if not sids:
            return
        with self._lock:
            now = self._clock()
            with self._transaction():
                self._db.executemany(
                    "UPDATE sessions SET touched = ? WHERE session = ?", [(now, s) for s in sids]
                )
            self._touched.update((s, now) for s in sessions)

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        with self._lock:
            now = self._clock()
            if all(w.data is None for w in writes):  # deletes: they must go through
                outcomes, touched = self._freeing(lambda: self._write(writes, now))
            else:
                outcomes, touched = self._write(writes, now)
            self._touched.update(touched)  # only once committed
            self._reserve.hold()  # a statvfs while it is given up: held again once there is room
            return outcomes

    def _write(
        self, writes: Sequence[Write], now: float
    ) -> tuple[list[Outcome], dict[SessionRef, float]]:
        with self._transaction():
            touched = self._refresh({w.session for w in writes}, now)
            outcomes = self._updated(writes)
            if outcomes is None:
                outcomes = [self._apply(w) for w in writes]
        return outcomes, touched

    def _freeing(self, work: Callable[[], _T]) -> _T:
        """`work`, a delete (lock held); if the disk is full, again with the reserve's room
        and the WAL checkpointed into the database and truncated, then truncated again, so
        the room the delete made goes back to the file system for the next saves."""
        try:
            return work()
        except StoreUnavailableError as exc:
            if not _full(exc):
                raise
        self._reserve.release()
        self._truncate_wal()
        done = work()
        self._truncate_wal()
        return done

    def _truncate_wal(self) -> None:
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error:
            pass  # a reader holds it, or no room to grow the database: the delete still tries

    def _updated(self, writes: Sequence[Write]) -> list[Outcome] | None:
        """A batch of plain updates (a save of a key that exists, no parts: the common case
        under load) in one statement, or None when the batch needs `_apply` write by write:
        another kind of write is in it, or a compare-and-set failed (undone here)."""
        if len(writes) < 2:
            return None
        rows = []
        for w in writes:  # one pass: this runs for every save under load
            if w.expected == 0 or w.data is None or w.parts:
                return None
            rows.append((w.data, encode_ref(w.session), encode_ref(w.key), w.expected))
        self._db.execute("SAVEPOINT updates")
        cur = self._db.executemany(
            "UPDATE state SET revision = revision + 1, data = ?"
            " WHERE session = ? AND key = ? AND revision = ?",
            rows,
        )
        # Each statement matches at most one row (the primary key): all of them matched,
        # or some key's revision moved and each write must learn its own outcome.
        if cur.rowcount == len(writes):
            self._db.execute("RELEASE updates")
            return [w.expected + 1 for w in writes]
        self._db.execute("ROLLBACK TO updates")
        self._db.execute("RELEASE updates")
        return None

    def _refresh(self, sessions: Iterable[SessionRef], now: float) -> dict[SessionRef, float]:
        """Expire and touch the sessions not touched by this store in the last 1% of the
        retention (lock held, in a transaction); returns those it touched.

        Two statements per session on every write more than doubled a save's cost; a
        session's retention may now start up to 1% of it early, which is harmless.
        """
        touched = {}
        for session in sessions:
            last = self._touched.get(session)
            if last is None or now - last >= self._touch_every:
                sid = encode_ref(session)
                self._expire_if_old(sid, now)
                self._touch(sid)
                touched[session] = now
        return touched

    def _apply(self, w: Write) -> Outcome:
        sid, kid = encode_ref(w.session), encode_ref(w.key)
        if w.expected == 0 and w.data is not None:
            cur = self._db.execute(
                "INSERT INTO state VALUES (?, ?, 1, ?) ON CONFLICT DO NOTHING",
                (sid, kid, w.data),
            )
        elif w.data is None:
            cur = self._db.execute(
                "DELETE FROM state WHERE session = ? AND key = ? AND revision = ?",
                (sid, kid, w.expected),
            )
        else:
            cur = self._db.execute(
                "UPDATE state SET revision = revision + 1, data = ?"
                " WHERE session = ? AND key = ? AND revision = ?",
                (w.data, sid, kid, w.expected),
            )
        if cur.rowcount == 1:
            if w.data is None:
                self._db.execute("DELETE FROM parts WHERE session = ? AND key = ?", (sid, kid))
                return 0
            if w.parts:
                self._write_parts(sid, kid, w.parts)
            return w.expected + 1
        row = self._db.execute(
            "SELECT revision FROM state WHERE session = ? AND key = ?", (sid, kid)
        ).fetchone()
        current = 0 if row is None else int(row[0])
        if w.data is None and w.expected == current == 0:
            return 0  # deleting what was never saved: nothing to do
        return StaleStateError(w.key, w.expected, current)

    def _write_parts(self, sid: str, kid: str, parts: Sequence[Part]) -> None:
        gone = [(sid, kid, name) for name, data in parts if data is None]
        kept = [(sid, kid, name, data) for name, data in parts if data is not None]
        if gone:
            self._db.executemany(
                "DELETE FROM parts WHERE session = ? AND key = ? AND part = ?", gone
            )
        if kept:
            self._db.executemany(
                "INSERT INTO parts VALUES (?, ?, ?, ?)"
                " ON CONFLICT DO UPDATE SET data = excluded.data",
                kept,
            )

    def delete_session(self, session: SessionRef) -> int:
        sid = encode_ref(session)
        with self._lock:
            self._touched.pop(session, None)
            deleted = self._freeing(lambda: self._delete_session(sid))
            self._reserve.hold()
            return deleted

    def _delete_session(self, sid: str) -> int:
        with self._transaction():
            self._forget(sid)
            return int(self._db.execute("DELETE FROM state WHERE session = ?", (sid,)).rowcount)

    def part_bytes(self, principal: str, key: StateKey) -> dict[str, int]:
        low, high = _principal_range(principal)
        with self._lock:
            cutoff = self._clock() - self.retention
            with self._transaction("BEGIN"):
                rows = self._db.execute(
                    "SELECT parts.session, sum(length(parts.data)) FROM parts "
                    "LEFT JOIN sessions ON sessions.session = parts.session "
                    "WHERE parts.key = ? AND parts.session >= ? AND parts.session < ? "
                    "AND (sessions.touched IS NULL OR sessions.touched > ?) "
                    "GROUP BY parts.session",
                    (encode_ref(key), low, high, cutoff),
                ).fetchall()
        return {str(json.loads(sid)[1]): int(size) for sid, size in rows}

    def principal_bytes(self, principal: str) -> dict[str, int]:
        low, high = _principal_range(principal)
        with self._lock:
            cutoff = self._clock() - self.retention
            with self._transaction("BEGIN"):
                # A range of the state table's primary key (session, key): no full scan.
                rows = self._db.execute(
                    "SELECT state.session, sum(length(state.data)) FROM state "
                    "LEFT JOIN sessions ON sessions.session = state.session "
                    "WHERE state.session >= ? AND state.session < ? "
                    "AND (sessions.touched IS NULL OR sessions.touched > ?) "
                    "GROUP BY state.session",
                    (low, high, cutoff),
                ).fetchall()
        return {str(json.loads(sid)[1]): int(size) for sid, size in rows}

    def purge(self) -> int:
        """Forget the sessions past their retention now, `purge_batch` per transaction;
        between two, each save or load waiting for the store goes first."""
        cutoff = self._clock() - self.retention
        scan = PURGE_SCAN * self.purge_batch
        with self._lock, self._transaction("BEGIN"):
            (expired,) = self._db.execute(
                "SELECT count(*) FROM (SELECT 1 FROM sessions WHERE touched <= ? LIMIT ?)",
                (cutoff, scan),
            ).fetchone()
        # None: by age; else the last session scanned, in key order
        after: str | None = "" if expired == scan else None
        purged, more = 0, True
        while more:
            with self._lock:
                batch, after, more = self._freeing(functools.partial(self._purge, cutoff, after))
                self._reserve.hold()
            purged += batch
            if more:
                self._lock.yield_turn()
        with self._lock:
            # (a session saved meanwhile was touched after `cutoff`: it stays)
            self._touched = {k: t for k, t in self._touched.items() if t > cutoff}
        return purged

    def _purge(self, cutoff: float, after: str | None) -> tuple[int, str | None, bool]:
        """Delete up to `purge_batch` sessions touched at or before `cutoff`, in one
        transaction: chosen inside it, so a session touched since the purge began (a save
        between two batches) is no longer chosen. By age (`after` None), or the next ones
        in key order after `after`, scanning at most `PURGE_SCAN` batches' worth of
        sessions. Returns how many went, where the scan stopped, and whether to go on."""
        with self._transaction():
            if after is None:
                old = self._db.execute(
                    "SELECT session FROM sessions WHERE touched <= ? LIMIT ?",
                    (cutoff, self.purge_batch),
                ).fetchall()
                more = len(old) == self.purge_batch
            else:
                old, after, more = self._scan(cutoff, after)
            self._db.executemany("DELETE FROM sessions WHERE session = ?", old)
            self._db.executemany("DELETE FROM parts WHERE session = ?", old)
            self._db.executemany("DELETE FROM state WHERE session = ?", old)
        return len(old), after, more

    def _scan(self, cutoff: float, after: str) -> tuple[list[tuple[str]], str, bool]:
        """The next expired sessions in key order after `after` (up to `purge_batch` of
        them, in at most `PURGE_SCAN` batches' worth of sessions), the last session
        scanned, and whether any are left to scan."""
        window = PURGE_SCAN * self.purge_batch
        rows = self._db.execute(
            "SELECT session, touched <= ? FROM sessions WHERE session > ? ORDER BY session LIMIT ?",
            (cutoff, after, window),
        )
        old: list[tuple[str]] = []
        scanned = 0
        try:
            for sid, expired in rows:
                after, scanned = sid, scanned + 1
                if expired:
                    old.append((sid,))
                    if len(old) == self.purge_batch:
                        return old, after, True
        finally:
            rows.close()  # (stopped early: not left reading the table the batch deletes from)
        return old, after, scanned == window

    def close(self) -> None:
        self._checkpointer.close()
        with self._lock:
            self._db.close()

    # -- inside a transaction ---------------------------------------------------------------

    def _read(self, sid: str, kid: str) -> tuple[Any, list[Any]]:
        row = self._db.execute(
            "SELECT revision, data FROM state WHERE session = ? AND key = ?", (sid, kid)
        ).fetchone()
        parts = self._db.execute(
            "SELECT part, data FROM parts WHERE session = ? AND key = ?", (sid, kid)
        ).fetchall()
        return row, parts

    def _expired(self, sid: str, now: float) -> bool:
        row = self._db.execute("SELECT touched FROM sessions WHERE session = ?", (sid,)).fetchone()
        return row is not None and now - row[0] >= self.retention

    def _expire_if_old(self, sid: str, now: float) -> None:
        row = self._db.execute("SELECT touched FROM sessions WHERE session = ?", (sid,)).fetchone()
        if row is not None and now - row[0] >= self.retention:
            self._db.execute("DELETE FROM state WHERE session = ?", (sid,))
            self._db.execute("DELETE FROM parts WHERE session = ?", (sid,))

    def _forget(self, sid: str) -> None:
        """Delete the session's row and parts (its state rows are the caller's)."""
        self._db.execute("DELETE FROM sessions WHERE session = ?", (sid,))
        self._db.execute("DELETE FROM parts WHERE session = ?", (sid,))

    def _touch(self, sid: str) -> None:
        self._db.execute(
            "INSERT INTO sessions VALUES (?, ?) ON CONFLICT DO UPDATE SET touched = excluded.touched",
            (sid, self._clock()),
        )

    def _transaction(self, begin: str = "BEGIN IMMEDIATE") -> _Transaction:
        return _Transaction(self._db, begin, self.path)


def _full(exc: StoreUnavailableError) -> bool:
    """Whether SQLite refused for lack of disk space."""
    cause = exc.__cause__
    return getattr(cause, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


def _unavailable(exc: sqlite3.Error, path: Path) -> StoreUnavailableError:
    # (a ProgrammingError, a closed connection, has no code)
    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        return StoreUnavailableError(
            f"the disk of {path} is full: nothing of this write was kept; saves resume by "
            "themselves once sessions are ended or expire, or the disk has room"
        )
    return StoreUnavailableError(f"SQLite store unavailable: {exc}")


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK and `StoreUnavailableError` on any SQLite error
    (a full disk, a locked or corrupt file): a failed batch leaves nothing behind."""

    def __init__(self, db: sqlite3.Connection, begin: str, path: Path) -> None:
        self._db = db
        self._begin = begin
        self._path = path

    def __enter__(self) -> None:
        try:
            self._db.execute(self._begin)
        except sqlite3.Error as exc:
            raise _unavailable(exc, self._path) from exc

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            try:
                self._db.execute("COMMIT")
                return
            except sqlite3.Error as commit_exc:
                exc = commit_exc
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise _unavailable(exc, self._path) from exc


def _principal_range(principal: str) -> tuple[str, str]:
    """The encoded sessions of `principal` are the texts in [low, high)."""
    low = principal_prefix(principal)
    return low, low[:-1] + chr(ord(",") + 1)  # past every text that starts with `low`
