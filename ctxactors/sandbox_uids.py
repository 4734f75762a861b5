"""Each principal's own host uid for its sandboxes: `SandboxUids`.

The kernel keeps state per uid that no namespace separates: keyrings (``/proc/keys``),
inotify instances (128 per uid by default, counted across every user namespace), and the
``RLIMIT_NPROC`` count. Sandboxes of one uid share them, so one tenant could read or clear
another's keys or hold every inotify instance. A root server therefore runs each
principal's sandboxes as a uid (and gid) of its own, from the configured range
(``CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST``, ``..._UID_COUNT``).

The mapping is allocated, never hashed (two principals can't meet on one uid), and kept in
a small SQLite file in the workspace root, beside the directories whose files those uids
own: it outlives restarts, and every server on that root (several processes, Ray shards on
one host) allocates from it under one transaction. A uid is never given to another
principal, so an exhausted range is an error for new principals only; callers with no
principal are one tenant with one uid.
"""

from __future__ import annotations

import os
import sqlite3
import threading

from ctxactors.errors import ToolError

FILE = ".ctxactors-uids.db"
_MAX_UID = 2**32 - 2  # (uid_t)-1 means "no change" to the kernel
_SCHEMA = """
CREATE TABLE IF NOT EXISTS uids (
    principal BLOB PRIMARY KEY,  -- b"" for no principal, else b"p" + its UTF-8
    uid INTEGER NOT NULL UNIQUE
)
"""


def _key(principal: str | None) -> bytes:
    # surrogatepass: a principal is any str; this key must be one-to-one, never fail.
    return b"" if principal is None else b"p" + principal.encode("utf-8", "surrogatepass")


class SandboxUids:
    """The principal -> uid table of one workspace root; thread-safe."""

    def __init__(self, root: str, first: int, count: int) -> None:
        if first + count - 1 > _MAX_UID:
            raise ValueError(
                f"the sandbox uids {first} to {first + count - 1} "
                "(CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST, CTXACTORS_WORKSPACE_SANDBOX_UID_COUNT) "
                f"go past the largest uid, {_MAX_UID}"
            )
        self.first, self.count = first, count
        self.path = os.path.join(root, FILE)
        self._lock = threading.Lock()
        self._known: dict[str | None, int] = {}
        self._db: sqlite3.Connection | None = None  # opened on first use

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            os.close(fd)  # made private before SQLite opens it
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA busy_timeout=10000")
            db.execute(_SCHEMA)
            self._db = db
        return self._db

    def uid(self, principal: str | None) -> int:
        """The principal's uid (its gid is the same number), allocated on first use;
        `ToolError` when the range has none left for a new principal."""
        with self._lock:
            known = self._known.get(principal)
            if known is None:
                known = self._known[principal] = self._allocate(_key(principal))
            return known

    def _allocate(self, key: bytes) -> int:
        db = self._open()
        db.execute("BEGIN IMMEDIATE")  # one allocation at a time, across processes too
        try:
            row = db.execute("SELECT uid FROM uids WHERE principal = ?", (key,)).fetchone()
            if row is None:
                top = db.execute(
                    "SELECT max(uid) FROM uids WHERE uid >= ? AND uid < ?",
                    (self.first, self.first + self.count),
                ).fetchone()[0]
                uid = self.first if top is None else top + 1
                if uid >= self.first + self.count:
                    raise ToolError(
                        f"no sandbox uid is left for a new principal: all {self.count:,} from "
                        f"{self.first} (CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST, "
                        "CTXACTORS_WORKSPACE_SANDBOX_UID_COUNT) are taken; the operator must "
                        "widen the range"
                    )
                db.execute("INSERT INTO uids VALUES (?, ?)", (key, uid))
                row = (uid,)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
