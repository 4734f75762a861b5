"""Disk space held back so that a full disk can still be emptied: `Reserve`.

SQLite in WAL mode writes every change, a ``DELETE`` too, to the WAL file before the
database: on a full disk the retention purge and ``end_session`` failed like every save,
so the disk stayed full for good. The store keeps a preallocated file of `size` bytes
beside the database and removes it when a delete finds the disk full; the delete then
has that much room for its WAL frames. Once checkpointed, the WAL file keeps its size and
SQLite writes the next frames over it from the start, and deleted rows leave their pages
on the database's freelist, which the next saves reuse: saves resume inside the space the
delete freed, before the file system has any more. The reserve is made again as soon as
the file system has room for it twice over (it must not take the last space saves need).
"""

from __future__ import annotations

import os
from pathlib import Path


class Reserve:
    """A file of `size` bytes at `path`, given up to let a delete through."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.held = False

    def hold(self) -> bool:
        """Make the file (blocks allocated, not sparse) if the file system has room for it
        twice over; whether it is held now."""
        if self.held or self.size == 0:
            return self.held
        try:
            status = os.statvfs(self.path.parent)
            if status.f_bavail * status.f_frsize < 2 * self.size and not self.path.exists():
                return False
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
        except OSError:  # ENOSPC meanwhile, or no fallocate here: try again later
            self.path.unlink(missing_ok=True)
            return False
        self.held = True
        return True

    def release(self) -> bool:
        """Give the space back to the file system; whether there was any to give."""
        if not self.held:
            return False
        self.path.unlink(missing_ok=True)
        self.held = False
        return True
