"""WAL checkpoints off the commit path.

SQLite checkpoints a WAL file (copies it back into the database) in whichever connection
commits past ``wal_autocheckpoint`` pages, and with ``synchronous=NORMAL`` a checkpoint is
where the fsyncs happen: a caller whose save happened to trip it waited for two fsyncs (up
to 40 ms here on a busy disk, a fifth of a single stream's time). A thread with its own
connection runs a PASSIVE checkpoint (it never blocks the writer) every `interval` seconds
instead; the writer keeps a large autocheckpoint only as a backstop.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

BACKSTOP_PAGES = 10_000  # the writer checkpoints itself only past this (about 40 MiB of WAL)


class Checkpointer:
    """Checkpoints a WAL database every `interval` seconds until `close`."""

    def __init__(self, path: Path, *, interval: float = 0.5) -> None:
        self._path = path
        self._interval = interval
        self._stop = threading.Event()
        self.checkpoints = 0
        self._thread = threading.Thread(target=self._run, name="ctxactors-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        db = sqlite3.connect(self._path, isolation_level=None)
        try:
            db.execute("PRAGMA busy_timeout=1000")
            while not self._stop.wait(self._interval):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                except sqlite3.Error:
                    pass  # busy or failing now: the next pass (or the backstop) does it
        finally:
            db.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
