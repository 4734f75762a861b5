"""Stop the commands that push a disk budget over while they run: `DiskWatch`.

``RLIMIT_FSIZE`` (`ctxactors.sandbox_disk.DiskBudgets.admit`) caps one file, not what a
command writes: a loop of files each under it would write until the command's timeout (up
to an hour) and could fill the disk under every tenant and the store. In kernel mode a
principal's filesystem holds its own budget, but the images are sparse, so nothing but this
watch holds them all together to ``server_disk_bytes``.

One thread per runtime, started with the first running command and gone once none runs
(no command, no thread, no polling). Each pass:

- Measured principals (and callers with no principal, in either mode): the directories
  their running commands can write (their session's directory: the sandbox's only
  writable disk path) are walked again, with `sandbox_disk.measure`'s bounded walk, as
  far as the principal's `PASS_ENTRIES` a pass go (see `DiskWatch._walk`); the rest of the
  principal's count is the last one. The files their processes deleted but keep open
  count too (`ctxactors.sandbox_held`). Past ``principal_disk_bytes`` (or past
  `sandbox_disk.MAX_ENTRIES` entries), the principal's commands whose files grew since
  they started are stopped.
- Server-wide, in both modes: the measured directories as above plus what the images hold
  on the host (a stat each). Past ``server_disk_bytes``, the commands that grew their
  files since they started are stopped (kernel-held principals: their filesystem's use, a
  ``statvfs``); the others keep running.
- The floor: the root's filesystem's free space (a ``statvfs``) under what the server-wide
  budget leaves free (`DiskBudgets.reserve`), taken by what no count sees: every command
  that grew is stopped; so is every measured command that grew when the root's free
  inodes are under `DiskBudgets.inode_reserve` (a flood of empty files, each counted as a
  few bytes, by many principals).

Only commands that grew are stopped, and never one admitted delete-only (its filter creates
nothing and opens nothing for writing, `ctxactors.sandbox_seccomp`): deleting (``rm``)
always works, even over a budget or past the walk's bound (where deleting lets the partial
walk reach files it never counted, which read as growth), and a principal's reads or
another principal's commands are never in the way.

The pause between passes is 10 times what the last pass cost, between 50 ms and 1 s: a
pass of a few files costs well under a millisecond, so it runs 20 times a second. A
principal's walks take `PASS_ENTRIES` a pass on average: a directory at the bound
(200,000 entries, about a second) is walked once in 20 passes, in the pass that walks it
(then the pause is 1 s). The overshoot is what the principal writes in one pause plus one
pass (about 2 s of its write speed), more for a principal whose own directories hold more
than `PASS_ENTRIES` (its turn comes less often); past its budget its next command starts
with no file able to grow.
The server-wide budget's default is 3/4 of the free space, so the quarter kept free
absorbs that overshoot for the store and the system.

A stopped command reads as ``killed``; its output ends with a line saying which budget is
full and what to do, as does the ``warning`` of its poll's answer. The files it wrote stay,
so the principal can ``rm`` them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ctxactors import cgroups
from ctxactors.logs import get_logger
from ctxactors.sandbox_disk import MAX_ENTRIES, DiskBudgets, measure
from ctxactors.sandbox_held import MAX_DESCRIPTORS, Processes, held

_MIN_PAUSE = 0.05  # seconds between passes, at least
_MAX_PAUSE = 1.0  # and at most: the overshoot's bound
_COST_FACTOR = 10  # pause = this x the last pass's cost: the watch takes <= ~1/10 of a CPU
PASS_ENTRIES = 10_000  # entries a pass walks per principal, on average (see `_walk`)


@dataclass(eq=False)
class _Watched:
    """One running command: whose, where it writes, how to stop it, its first process
    (None: not known), and its files' count when it started: its directory's (bytes,
    entries), or its principal's filesystem's (bytes used, 0)."""

    principal: str | None
    directory: str
    stop: Callable[[str], None]
    start: tuple[int, int]
    kernel: bool
    pid: int | None = None
    delete_only: bool = False  # admitted delete-only: can't grow, never stopped
    stopped: bool = field(default=False)


class DiskWatch:
    """The watch of one runtime's running commands; thread-safe."""

    def __init__(self, disks: DiskBudgets) -> None:
        self.disks = disks
        self._lock = threading.Condition()
        self._watched: dict[str, _Watched] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self.passes = 0  # for tests and the curious: passes made in this run
        self.walked = 0  # entries walked in this run (the bench's figure)
        # The pass thread's own: each watched directory's last count and the pass that
        # made it, and each area's entries still to walk (negative: walked ahead).
        self._counts: dict[str, tuple[int, int]] = {}
        self._when: dict[str, int] = {}
        self._credit: dict[str, int] = {}
        self._ended: set[str] = set()  # directories a command of which ended: walk again
        self._processes: Processes | None = None  # the last read of /proc

    def add(
        self,
        key: str,
        principal: str | None,
        directory: str,
        stop: Callable[[str], None],
        pid: int | None = None,
        *,
        delete_only: bool = False,
    ) -> None:
        """Watch a command from now until `remove(key)`; `stop(why)` kills it; `pid`: its
        first process (its descendants' open deleted files count too); `delete_only`: it
        runs delete-only, so it is counted but never stopped."""
        kernel = self.disks.images is not None and principal is not None
        start = (
            (_filesystem_used(directory), 0) if kernel else self.disks.last(principal, directory)
        )
        watched = _Watched(principal, directory, stop, start, kernel, pid, delete_only)
        with self._lock:
            if self._closed:
                return
            self._watched[key] = watched
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="ctxactors-diskwatch", daemon=True)
                try:
                    thread.start()
                except BaseException:  # no thread: the caller must not start the command
                    del self._watched[key]
                    raise
                self._thread = thread

    def remove(self, key: str) -> None:
        with self._lock:
            watched = self._watched.pop(key, None)
            if watched is not None:
                self._ended.add(watched.directory)
            if not self._watched:
                self._lock.notify_all()  # the thread ends now, not after its pause

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._watched.clear()
            self._lock.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        log = get_logger("ctxactors.workspace")
        failed = ""  # the last pass's error, logged once, not at every pass
        while True:
            with self._lock:
                watched = [w for w in self._watched.values() if not w.stopped]
                if not self._watched:
                    self._thread = None
                    return
            if not watched:  # only commands being stopped: nothing to count
                with self._lock:
                    self._lock.wait(_MIN_PAUSE)
                continue
            began = time.perf_counter()
            try:
                self._pass(watched)
                failed = ""
            except Exception as exc:  # a session ended meanwhile, ...: the next pass tries again
                if str(exc) != failed:
                    log.warning("disk_watch_failed", error=str(exc), exc_info=True)
                failed = str(exc)
            self.passes += 1
            cost = time.perf_counter() - began
            pause = min(max(_COST_FACTOR * cost, _MIN_PAUSE), _MAX_PAUSE)
            with self._lock:
                if self._watched:
                    self._lock.wait(pause)

    def _walk(self, watched: list[_Watched]) -> dict[str, dict[str, tuple[int, int]]]:
        """Each measured area's watched directories, counted: walked again, the oldest
        count first, as far as the area's credit goes (`PASS_ENTRIES` more at each pass;
        a directory costs what its last walk visited, and waits, with those after it,
        until the credit covers it), else their last count: one tenant's huge directories
        (a 200,000-entry walk costs about a second) make only its own counts older, not
        every pass slow. A directory past the bound isn't walked again until a command of
        it ends: it stays past."""
        with self._lock:
            ended, self._ended = self._ended, set()
        for directory in ended:
            self._counts.pop(directory, None)
        areas: dict[str, dict[str, tuple[int, int]]] = {}
        for w in watched:
            if not w.kernel:
                found = areas.setdefault(cgroups.group_name(w.principal), {})
                found[w.directory] = self._counts.get(w.directory, w.start)
        for name, found in areas.items():
            credit = min(self._credit.get(name, 0) + PASS_ENTRIES, MAX_ENTRIES + PASS_ENTRIES)
            for directory in sorted(found, key=lambda d: self._when.get(d, -1)):
                if directory in self._counts and found[directory][1] > MAX_ENTRIES:
                    continue
                if min(found[directory][1], MAX_ENTRIES) > credit:
                    break  # its turn: the next passes save up for it
                found[directory] = _measure(directory, found[directory])
                visited = min(found[directory][1], MAX_ENTRIES)
                credit -= max(visited, 1)
                self.walked += visited
                self._counts[directory] = found[directory]
                self._when[directory] = self.passes
            self._credit[name] = credit
        for name in [n for n, c in self._credit.items() if n not in areas and c >= 0]:
            del self._credit[name]  # its debt is kept: ending its commands doesn't clear it
        live = {w.directory for w in watched}
        for directory in [d for d in self._when if d not in live]:
            del self._when[directory]
            self._counts.pop(directory, None)
        return areas

    def _held(self, watched: list[_Watched]) -> dict[int, dict[tuple[int, int], int]]:
        """id(watched) -> the open deleted files of its processes, on its directory's
        filesystem (measured commands only: a kernel-held principal's filesystem counts
        them already); past its principal's `MAX_DESCRIPTORS` in this pass: an entry
        ``(-1, -1)`` (counted as past the bound)."""
        measured = [w for w in watched if not w.kernel and w.pid is not None]
        if not measured:
            return {}
        processes = self._processes
        if (
            processes is None
            or time.monotonic() - processes.taken >= _MAX_PAUSE
            or any(w.pid not in processes.pids for w in measured)
        ):
            processes = self._processes = Processes()
        found: dict[int, dict[tuple[int, int], int]] = {}
        left: dict[str | None, int] = {}  # each principal's descriptors still to look at
        for w in measured:
            assert w.pid is not None
            try:
                device = os.stat(w.directory).st_dev
            except OSError:
                continue
            limit = left.get(w.principal, MAX_DESCRIPTORS)
            files, looked = held(processes.of(w.pid), device, limit)
            left[w.principal] = limit - looked
            if looked > limit:
                files[(-1, -1)] = 0
            found[id(w)] = files
        return found

    def _pass(self, watched: list[_Watched]) -> None:
        disks = self.disks
        fresh = self._walk(watched)
        unlinked = self._held(watched)
        now: dict[int, tuple[int, int]] = {}  # id(watched) -> its count now, as its `start`
        for w in watched:
            if w.kernel:
                now[id(w)] = (_filesystem_used(w.directory), 0)
                continue
            used, entries = fresh[cgroups.group_name(w.principal)][w.directory]
            files = unlinked.get(id(w), {})
            if (-1, -1) in files:
                entries = MAX_ENTRIES + 1
            now[id(w)] = (used + sum(files.values()), entries)
        totals, measured = disks.counted(fresh)
        # Open deleted files, each once: per principal, and all together.
        per_area: dict[str, dict[tuple[int, int], int]] = {}
        for w in watched:
            per_area.setdefault(cgroups.group_name(w.principal), {}).update(unlinked.get(id(w), {}))
        for name, files in per_area.items():
            if name in totals:
                used, entries = totals[name]
                entries = MAX_ENTRIES + 1 if (-1, -1) in files else entries
                totals[name] = (used + sum(files.values()), entries)
        measured += sum(sum(files.values()) for files in per_area.values())
        # Only a command whose files grew is stopped, never a delete-only one (what it
        # deletes can let a partial walk reach files it never counted): rm must work.
        grew = [
            w
            for w in watched
            if not w.delete_only and (now[id(w)][0] > w.start[0] or now[id(w)][1] > w.start[1])
        ]
        why: dict[int, str] = {}
        for w in grew:
            if w.kernel or w.principal is None:
                continue  # its filesystem holds its budget, or it has none of its own
            used, entries = totals[cgroups.group_name(w.principal)]
            if entries > MAX_ENTRIES:
                why[id(w)] = disks.too_many()
            elif used > disks.budget.principal_disk_bytes:
                why[id(w)] = disks.full("principal_disk_bytes", used)
        server = measured + (disks.images.allocated() if disks.images is not None else 0)
        if server > disks.server_bytes:
            for w in grew:
                why.setdefault(id(w), disks.full("server_disk_bytes", server))
        # The floor: what no count sees (another's open deleted files, a server we can't
        # read the processes of, ...) still takes the host's space: under the reserve, every
        # command that grew stops.
        s = os.statvfs(disks.root)
        free = s.f_bavail * s.f_frsize
        if free < disks.reserve:
            for w in grew:
                why.setdefault(id(w), disks.floor(free))
        if s.f_favail < disks.inode_reserve:  # files made in measured areas: the root's
            for w in grew:
                if not w.kernel:
                    why.setdefault(id(w), disks.inode_floor(s.f_favail))
        for w in watched:
            if id(w) in why:
                w.stopped = True
                get_logger("ctxactors.workspace").warning(
                    "disk_budget_stopped", directory=w.directory, why=why[id(w)]
                )
                w.stop(why[id(w)])


def _measure(directory: str, last: tuple[int, int]) -> tuple[int, int]:
    """`measure`, and what can't be walked (an error) counted as past the bound: one
    directory must not blind the watch to every other."""
    try:
        return measure(directory)
    except OSError:
        return last[0], MAX_ENTRIES + 1


def _filesystem_used(directory: str) -> int:
    """Bytes used on the filesystem holding `directory` (a kernel-held principal's own):
    a ``statvfs``, never the images' lock, which a slow mount of another image can hold."""
    s = os.statvfs(directory)
    return (s.f_blocks - s.f_bfree) * s.f_frsize
