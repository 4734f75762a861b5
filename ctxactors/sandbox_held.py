"""Disk a command holds in files it deleted but keeps open: `Processes` and `held`.

A walk of a command's directory sees only files with a name. A command can write a file,
unlink it and keep it open: its blocks stay taken on the host, and no walk counts them
(60 files of 3 MiB against a 4 MiB budget went unseen until the command's timeout). So the
disk watch (`ctxactors.sandbox_diskwatch`) also looks at each running command's processes:
every descriptor of theirs open on a regular file with no name left (``st_nlink`` 0) on the
command's filesystem counts, each inode once.

A command's processes: the one the server started and its descendants (a sandbox's
orphans are adopted by its PID namespace's first process, still a descendant), and any in
the session it started (``start_new_session``), found from ``/proc/<pid>/stat`` (one read
of ``/proc`` at most every second, or when a new command starts, whatever the number of
commands: about 2 ms for 100 processes here, so not at every pass; this kernel has no
``/proc/<pid>/task/<tid>/children``). A process started since is found at the next read: up
to a second more of overshoot. A process whose descriptors the server may not read (another
uid, when the server is not root; or one that made itself non-dumpable) is not counted:
the server's disk floor (`ctxactors.sandbox_disk.DiskBudgets.reserve`) is what holds then.
"""

from __future__ import annotations

import os
import stat
import time

MAX_DESCRIPTORS = 10_000  # a principal's descriptors looked at a pass; past them: too many


class Processes:
    """Every process's parent and session, as ``/proc`` showed them once."""

    def __init__(self) -> None:
        self.taken = time.monotonic()
        self.children: dict[int, list[int]] = {}
        self.sessions: dict[int, list[int]] = {}
        self.pids: set[int] = set()
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    line = f.read()
            except OSError:  # gone meanwhile
                continue
            # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
            fields = line[line.rfind(b")") + 2 :].split()
            if len(fields) < 4:
                continue
            pid = int(name)
            self.pids.add(pid)
            self.children.setdefault(int(fields[1]), []).append(pid)
            self.sessions.setdefault(int(fields[3]), []).append(pid)

    def of(self, pid: int) -> set[int]:
        """`pid`, its descendants, and the processes in the session it leads."""
        found = {pid, *self.sessions.get(pid, ())}
        pending = list(found)
        while pending:
            for child in self.children.get(pending.pop(), ()):
                if child not in found:
                    found.add(child)
                    pending.append(child)
        return found


def held(pids: set[int], device: int, limit: int) -> tuple[dict[tuple[int, int], int], int]:
    """The files on `device` with no name left that `pids` hold open: (device, inode) ->
    bytes allocated; and how many descriptors it looked at, at most `limit` (past it, it
    stops: ``limit + 1``, the count is short). A stat each: a pass looks at no more than
    `MAX_DESCRIPTORS` of a principal's, however many its commands open."""
    found: dict[tuple[int, int], int] = {}
    looked = 0
    for pid in sorted(pids):
        directory = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(directory)
        except OSError:  # gone, or not the server's to read
            continue
        for fd in fds:
            looked += 1
            if looked > limit:
                return found, looked
            try:
                st = os.stat(os.path.join(directory, fd))  # the open file itself
            except OSError:
                continue
            if st.st_nlink == 0 and st.st_dev == device and stat.S_ISREG(st.st_mode):
                found[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return found, looked
