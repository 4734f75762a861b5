"""The SQLite store: one file, WAL mode, every batch of saves in one transaction.

WAL with ``synchronous=NORMAL`` (SQLite's recommended setting for WAL): a commit is
written to the WAL file but not fsynced, so a committed save survives a crash or kill -9
of the process (the kernel has it), while a power loss or kernel crash may lose the
commits since the last checkpoint (never corrupting the file). Checkpoints, which fsync,
run every half second in a background connection (`ctxactors.state._checkpoint`). Pass
``synchronous="FULL"`` to fsync every commit (about ten times the cost of a commit here).
Group commit (`ctxactors.state.GroupCommit`) makes many saves share a transaction.

Sessions and keys are stored as JSON arrays (`encode_ref`), so no two tuples collide.
Retention uses the wall clock: it must mean the same after a restart.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

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
)
from ctxactors.state._checkpoint import BACKSTOP_PAGES, Checkpointer

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


def _open(path: Path, synchronous: str) -> sqlite3.Connection:
    """The store's connection, its schema made; `StoreUnavailableError` (saying what to do)
    for a file SQLite can't use."""
    db: sqlite3.Connection | None = None
    try:
        # Autocommit mode: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("PRAGMA busy_timeout=5000")
        db.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
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
    ) -> None:
        if synchronous.upper() not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        self.retention = retention
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.Lock()
        # session -> when this store last touched it: see `_refresh`.
        self._touched: dict[SessionRef, float] = {}
        self._touch_every = retention / 100
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = _open(self.path, synchronous.upper())
        self._checkpointer = Checkpointer(self.path)

    def load(self, session: SessionRef, key: StateKey) -> Record | None:
        sid = encode_ref(session)
        with self._lock:
            now = self._clock()
            with self._transaction():
                touched = self._refresh([session], now)
                kid = encode_ref(key)
                row = self._db.execute(
                    "SELECT revision, data FROM state WHERE session = ? AND key = ?", (sid, kid)
                ).fetchone()
                parts = self._db.execute(
                    "SELECT part, data FROM parts WHERE session = ? AND key = ?", (sid, kid)
                ).fetchall()
            self._touched.update(touched)
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
            with self._transaction():
                touched = self._refresh({w.session for w in writes}, now)
                outcomes = self._updated(writes)
                if outcomes is None:
                    outcomes = [self._apply(w) for w in writes]
            self._touched.update(touched)  # only once committed
            return outcomes

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
        if w.data is None and w.expected == 0:
            return 0  # deleting what was never saved: nothing to do
        row = self._db.execute(
            "SELECT revision FROM state WHERE session = ? AND key = ?", (sid, kid)
        ).fetchone()
        return StaleStateError(w.key, w.expected, 0 if row is None else row[0])

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
        with self._lock, self._transaction():
            self._touched.pop(session, None)
            self._forget(sid)
            return self._db.execute("DELETE FROM state WHERE session = ?", (sid,)).rowcount

    def purge(self) -> int:
        cutoff = self._clock() - self.retention
        with self._lock, self._transaction():
            old = [
                r[0]
                for r in self._db.execute(
                    "SELECT session FROM sessions WHERE touched <= ?", (cutoff,)
                )
            ]
            for sid in old:
                self._forget(sid)
                self._db.execute("DELETE FROM state WHERE session = ?", (sid,))
            self._touched = {k: t for k, t in self._touched.items() if t > cutoff}
        return len(old)

    def close(self) -> None:
        self._checkpointer.close()
        with self._lock:
            self._db.close()

    # -- inside a transaction ---------------------------------------------------------------

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

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK and `StoreUnavailableError` on any SQLite error
    (a full disk, a locked or corrupt file): a failed batch leaves nothing behind."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"SQLite store unavailable: {exc}") from exc

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
            raise StoreUnavailableError(f"SQLite store unavailable: {exc}") from exc
