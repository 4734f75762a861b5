"""What a principal's workspace files may take on disk: `DiskBudgets`.

Without a budget one tenant could fill the disk under every other tenant's workspaces and
the state store. Two budgets hold: ``workspace.budget.principal_disk_bytes`` (all of one
principal's session directories) and ``workspace.budget.server_disk_bytes`` (every
workspace file together; by default 3/4 of what the root's filesystem had free at start
plus what the workspaces already held, so a quarter of the free space always stays for the
store and the system).

- Kernel, where the server may mount loop devices (root, ``/dev/loop-control``): each
  principal's directories are on a filesystem of its own sized to its budget
  (`ctxactors.loop_images`); past it its writes fail with ``ENOSPC``, and no one else's.
- Measured, elsewhere (not root, no loop devices, ``CTXACTORS_WORKSPACE_DISK=off``), and
  always for callers with no principal (one tenant under the server's budget only, whose
  directories stay in the root): the server walks the principal's directories (at its
  first command of this run, and after each command ends; a bounded walk: past
  `MAX_ENTRIES` names the principal counts as over) and starts each command under an
  ``RLIMIT_FSIZE`` of what is left, so no one file passes the budget. That caps one
  file, not what a command writes: while commands run, `ctxactors.sandbox_diskwatch`
  walks their directories again (a pass every 50 ms to 1 s) and stops those that grew
  the principal past its budget; the overshoot is what they write between two passes.

Once a principal is at a budget, or past what the walk counts (more than `MAX_ENTRIES`
entries, deeper than `MAX_DEPTH`, or a directory the server may not read), its commands
still start (deleting files with ``rm`` is a command, and must always work) but
delete-only: under an ``RLIMIT_FSIZE`` of 0 (no file can grow) and a seccomp filter that
refuses creating files, directories, links, fifos and sockets, ``fallocate`` and extended
attributes with ``EDQUOT`` (`ctxactors.sandbox_seccomp`; the limit alone doesn't stop
them: a principal past the walk's bound made 95 MiB of directories in 2 s under it). The
call's answer and the process's output say which budget is full and how to free it. The
server-wide budget is measured in both modes (the images are sparse: what they hold on the
host), when a command starts and, while commands run, by the same watch: past it, the
commands whose files grew are stopped. So are files, counted as inodes: under a quarter of
the root's free inodes at start (`DiskBudgets.inode_reserve`), measured commands start
delete-only and the watch stops those that grew. Ending a session only deletes, which
needs no space.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import threading
from typing import TYPE_CHECKING, NamedTuple

from ctxactors import cgroups, loop_images
from ctxactors.errors import SandboxUnavailableError, ToolError
from ctxactors.logs import get_logger
from ctxactors.settings import Cap, WorkspaceSettings

if TYPE_CHECKING:
    Listing = os._ScandirIterator[str]  # what os.scandir returns: an iterator with close()

MAX_ENTRIES = 200_000  # names (files, directories, links) the measured walk visits per principal
MAX_DEPTH = 256  # directories nested deeper count as past the bound (an open fd a level)
_FULL = 64 << 10  # a kernel-held filesystem with less than this free counts as full


def area_path(root: str, principal: str | None) -> str:
    """Where a principal's session directories go: its area (the root's own for callers
    with no principal)."""
    if principal is None:
        return root
    return os.path.join(root, loop_images.AREAS, cgroups.group_name(principal))


def plain_area(root: str, principal: str | None) -> str:
    """The principal's area as a plain directory (no image), made if new."""
    path = area_path(root, principal)
    if principal is not None:
        os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
        os.makedirs(path, mode=0o711, exist_ok=True)
    return path


def plain_areas(root: str) -> list[str]:
    """Every principal's area directory under `root`."""
    parent = os.path.join(root, loop_images.AREAS)
    try:
        return [os.path.join(parent, n) for n in sorted(os.listdir(parent))]
    except FileNotFoundError:
        return []


class Admission(NamedTuple):
    """How a command starts: the largest file it may write, and why it may write nothing."""

    file_bytes: int
    full: str | None = None

    @property
    def delete_only(self) -> bool:
        """May write no byte: then it may create nothing either (`ctxactors.sandbox_seccomp`:
        ``RLIMIT_FSIZE`` 0 doesn't stop ``mkdir``, ``ln``, ``mkfifo``, ``fallocate``, ...)."""
        return self.file_bytes == 0


def remove(path: str) -> None:
    """Delete a tree a sandbox wrote, however deep. ``shutil.rmtree`` recurses (Python
    3.11) and holds a descriptor a level: its RecursionError passes through
    ``ignore_errors``, and its EMFILE (a deep tree under the process's open-files limit)
    is swallowed by it, leaving the tree in place with no error; either would keep a
    tenant's files past a retention purge. So whatever it left goes with coreutils'
    ``rm``, which walks without recursing, within any descriptor limit, and never follows
    a link."""
    with contextlib.suppress(RecursionError):
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        subprocess.run(
            ["rm", "-rf", "--one-file-system", "--", path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )


def measure(path: str, *, names: str | None = None) -> tuple[int, int]:
    """(bytes allocated, entries) under `path`, its own directory's blocks too, each inode
    once, never following a link, visiting at most `MAX_ENTRIES` names (every name counts,
    a hard link's too; then it stops: the count is past the bound); `names`: only the
    top-level entries starting with it (`path` is then a shared parent: its own blocks are
    not counted).

    What can't be counted counts as past the bound too (entries ``MAX_ENTRIES + 1``): a
    directory nested deeper than `MAX_DEPTH`, or one the server may not list (its owner,
    the sandbox, can ``chmod 100`` it and write in it by name, hidden from the count)."""
    total, entries = 0, 0
    seen: set[tuple[int, int]] = set()
    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return 0, 0
    except PermissionError:  # the sandbox owns its directory, and may chmod it 0
        return 0, MAX_ENTRIES + 1
    if names is None:
        # A directory's own blocks grow with its names (300,000 long names: 100 MiB).
        try:
            total += os.fstat(top).st_blocks * 512
        except BaseException:
            os.close(top)
            raise
    # Depth first with a stack, not recursion (os.fwalk recurses: a tree nested a few
    # thousand deep, which a sandbox can make, ends it in RecursionError): per level, an
    # open directory and its listing read lazily (os.scandir: a directory of millions of
    # names is never read whole, only up to the bound), both closed once popped.
    listing = _listing(top)
    if listing is None:
        return total, MAX_ENTRIES + 1
    frames: list[tuple[int, Listing]] = [(top, listing)]
    try:
        while frames:
            fd, pending = frames[-1]
            entry = next(pending, None)
            if entry is None:
                frames.pop()
                _close(fd, pending)
                continue
            name = entry.name
            if names is not None and len(frames) == 1 and not name.startswith(names):
                continue
            entries += 1
            if entries > MAX_ENTRIES:
                return total, entries
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted meanwhile
            if stat.S_ISDIR(st.st_mode):
                total += st.st_blocks * 512
                if len(frames) > MAX_DEPTH:
                    return total, MAX_ENTRIES + 1
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                try:
                    child = os.open(name, flags, dir_fd=fd)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # deleted, or replaced, meanwhile
                except PermissionError:
                    return total, MAX_ENTRIES + 1
                inside = _listing(child)
                if inside is None:
                    return total, MAX_ENTRIES + 1
                frames.append((child, inside))
                continue
            if st.st_nlink > 1:  # a hard link: its blocks once (its name counted above)
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    finally:
        for fd, pending in frames:
            _close(fd, pending)
    return total, entries


def _listing(fd: int) -> Listing | None:
    """The open directory `fd`'s names, read as they are asked for, or None (and `fd`
    closed) if the server may not list it; on any other error `fd` is closed and the
    error raised. (`os.scandir` reads a duplicate of `fd`: two descriptors a level.)"""
    try:
        return os.scandir(fd)
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, PermissionError):
            return None
        raise


def _close(fd: int, listing: Listing) -> None:
    listing.close()
    os.close(fd)


class DiskBudgets:
    """The disk budgets of one runtime's principals; thread-safe."""

    def __init__(
        self,
        settings: WorkspaceSettings,
        images: loop_images.LoopImages | None,
        why_measured: str = "",
    ) -> None:
        self.settings = settings
        self.budget = settings.budget
        self.root = settings.root
        self.images = images
        self._lock = threading.Lock()
        # Area name (`cgroups.group_name`) -> session directory -> its (bytes, entries),
        # of the measured areas walked in this run.
        self._dirs: dict[str, dict[str, tuple[int, int]]] = {}
        self._walked: set[str] = set()
        self._walks: dict[str, threading.Lock] = {}
        self._all_walked = False
        self.server_bytes = self.budget.server_disk_bytes or self._three_quarters()
        # The disk watch's floor: what the server-wide budget leaves free of the root's
        # filesystem, at most a quarter (what its default leaves; a budget set lower must
        # not make the store's or the system's growth stop commands). Free space below it
        # is taken by what no count sees (open deleted files, ...).
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        s = os.statvfs(self.root)
        had = s.f_bavail * s.f_frsize + (images.allocated() if images is not None else 0)
        self.reserve = max(min(had - self.server_bytes, had // 4), 0)
        # Its inode floor: a quarter of the root's free inodes. Measured areas count an
        # empty file as a few bytes, so 200k of them per principal stay far under a byte
        # budget, and a few dozen principals would use every inode of the host; below it,
        # measured commands may create nothing (images hold their own inodes; a filesystem
        # with no fixed count, f_files 0, never goes below 0).
        self.inode_reserve = s.f_favail // 4
        if images is not None:
            self.enforcement = (
                f"kernel: an ext4 image per principal, loop-mounted under {images.areas} "
                "(no principal: measured)"
            )
        else:
            self.enforcement = (
                "measured: each principal's directories walked after its commands, "
                f"RLIMIT_FSIZE to what is left{why_measured}"
            )

    @classmethod
    def open(cls, settings: WorkspaceSettings) -> DiskBudgets:
        """Loop images when this server may mount them, else measured; with
        ``disk=require`` no images is `SandboxUnavailableError`."""
        if settings.budget.disk == "off":
            return cls(settings, None, " (CTXACTORS_WORKSPACE_DISK=off)")
        try:
            loop_images.check(settings.root)
        except (loop_images.Unavailable, OSError) as exc:
            if settings.budget.disk == "require":
                raise SandboxUnavailableError(
                    f"CTXACTORS_WORKSPACE_DISK=require, but no image can be mounted: {exc}"
                ) from None
            return cls(settings, None, f" (no loop images: {exc})")
        budget = settings.budget
        images = loop_images.LoopImages(
            settings.root, budget.principal_disk_bytes, preallocate=budget.disk_preallocate
        )
        disks = cls(settings, images)
        # The server's reserve: what the server-wide budget leaves of the root's filesystem
        # (a quarter of its free space by default), which no image may be given.
        s = os.statvfs(settings.root)
        images.reserve = max(s.f_bavail * s.f_frsize + images.allocated() - disks.server_bytes, 0)
        return disks

    def describe(self) -> str:
        return (
            f"{self.enforcement}; server-wide {self.server_bytes:,} bytes, measured; "
            "running commands watched, stopped when they write past a budget"
        )

    def _kernel(self, principal: str | None) -> bool:
        return self.images is not None and principal is not None

    def area(self, principal: str | None) -> str:
        """Where the principal's session directories go (made, or mounted, if needed)."""
        if self.images is not None and principal is not None:
            try:
                return self.images.area(principal)
            except loop_images.NoRoom as exc:
                get_logger("ctxactors.workspace").error("disk_no_room", error=str(exc))
                raise ToolError(
                    "the server has no disk space left for this principal's workspace disk "
                    f"({self.budget.principal_disk_bytes:,} bytes: "
                    "CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES); try again later, or ask the "
                    "server's operator"
                ) from None
            except (OSError, subprocess.SubprocessError) as exc:  # no loop device left, ...
                get_logger("ctxactors.workspace").error("disk_mount_failed", error=str(exc))
                raise ToolError(
                    "this principal's workspace disk can't be mounted now (the server's log "
                    "says why: disk_mount_failed); try again later"
                ) from None
        return plain_area(self.root, principal)

    def areas(self) -> list[str]:
        """Every principal's area (mounting images), for the retention purge."""
        if self.images is not None:
            return list(self.images.mounted())
        return plain_areas(self.root)

    def release(self) -> None:
        """After a purge: unmount the images `areas` mounted for it alone."""
        if self.images is not None:
            self.images.release()

    def measure(self, principal: str | None, directory: str | None = None) -> tuple[int, int]:
        """Count the principal's files again: (bytes, entries). After a command, only its
        session's `directory` is walked (a principal's other sessions didn't change, and
        callers with no principal may hold thousands); the first time in this run, all of
        the principal's directories. A kernel-held principal: its filesystem's count."""
        if self._kernel(principal):
            assert self.images is not None
            return self.images.usage(principal).used, 0
        name = cgroups.group_name(principal)
        with self._lock:
            walked = name in self._walked
        if walked and directory is not None:
            found = measure(directory)
            with self._lock:
                self._dirs.setdefault(name, {})[directory] = found
        elif not walked:
            self._walk(name, self.area(principal))
        return self._total(name)

    def _walk(self, name: str, area: str) -> None:
        """Walk every session directory of an area (callers with no principal: the root's)."""
        with self._lock:
            walk = self._walks.setdefault(name, threading.Lock())
        with walk:  # one full walk of an area at a time
            try:
                names = [n for n in os.listdir(area) if area != self.root or n.startswith("ws-")]
            except FileNotFoundError:
                names = []
            found = {os.path.join(area, n): measure(os.path.join(area, n)) for n in names}
            with self._lock:
                self._dirs[name] = found
                self._walked.add(name)

    def last(self, principal: str | None, directory: str) -> tuple[int, int]:
        """A measured principal's `directory` at its last count: (bytes, entries)."""
        with self._lock:
            return self._dirs.get(cgroups.group_name(principal), {}).get(directory, (0, 0))

    def counted(
        self, fresh: dict[str, dict[str, tuple[int, int]]]
    ) -> tuple[dict[str, tuple[int, int]], int]:
        """With `fresh` counts (area name -> directory -> (bytes, entries)) in place of the
        last ones of those directories: each measured area's (bytes, entries), and the bytes
        of every measured area together (for `ctxactors.sandbox_diskwatch`; nothing kept)."""
        with self._lock:
            areas = {name: dict(found) for name, found in self._dirs.items()}
        for name, found in fresh.items():
            areas.setdefault(name, {}).update(found)
        totals = {
            name: (sum(b for b, _ in found.values()), sum(e for _, e in found.values()))
            for name, found in areas.items()
        }
        return totals, sum(b for b, _ in totals.values())

    def _total(self, name: str) -> tuple[int, int]:
        with self._lock:
            counts = list(self._dirs.get(name, {}).values())
        return sum(b for b, _ in counts), sum(e for _, e in counts)

    def forget(self, directory: str | None = None) -> None:
        """Files went another way: a session's `directory` was removed (its end), or with
        None, any (a purge, a legacy move: every area is walked again before its next
        command). The counts stay until then, stale: dropped, the server-wide total (and
        the watch's) would lose every directory with no running command."""
        with self._lock:
            if directory is None:
                self._walked.clear()
                self._all_walked = False
                return
            for found in self._dirs.values():
                found.pop(directory, None)

    def server_used(self) -> int:
        """Every workspace file: the images' blocks on the host, and the measured areas."""
        if not self._all_walked:
            # Areas not walked yet in this run (after a restart): walked once, so that the
            # server-wide count holds them from the start.
            self._all_walked = True
            areas = [] if self.images is not None else self.areas()
            for name, path in [(cgroups.group_name(None), self.root)] + [
                (os.path.basename(a), a) for a in areas
            ]:
                if name not in self._walked:
                    self._walk(name, path)
            with self._lock:  # stale counts (`forget`) of areas gone meanwhile
                for name in [n for n in self._dirs if n not in self._walked]:
                    del self._dirs[name]
        with self._lock:
            measured = sum(b for found in self._dirs.values() for b, _ in found.values())
        return measured + (self.images.allocated() if self.images is not None else 0)

    def admit(self, principal: str | None) -> Admission:
        """How the principal's next command may write (see the module docstring)."""
        file_bytes = self.settings.sandbox.file_bytes
        if self._kernel(principal):
            assert self.images is not None
            used, capacity = self.images.usage(principal)
            left = min(capacity, self.budget.principal_disk_bytes) - used
            if used > self.budget.principal_disk_bytes:  # a lowered budget, not shrunk yet
                return Admission(0, self.full("principal_disk_bytes", used))
            note = self.full("principal_disk_bytes", used) if left < _FULL else None
            server = self._server_left()
            if server <= 0:
                return Admission(0, self.full("server_disk_bytes", self.server_used()))
            return Admission(min(file_bytes, server), note)
        used, entries = self.measure(principal)
        if entries > MAX_ENTRIES:
            return Admission(0, self.too_many())
        inodes = os.statvfs(self.root).f_favail
        if inodes < self.inode_reserve:
            return Admission(0, self.inode_floor(inodes))
        left = self._server_left()
        if principal is not None:
            left = min(left, self.budget.principal_disk_bytes - used)
        if left <= 0:
            setting = "server_disk_bytes" if principal is None else "principal_disk_bytes"
            if principal is not None and self._server_left() <= 0:
                setting = "server_disk_bytes"
            shown = self.server_used() if setting == "server_disk_bytes" else used
            return Admission(0, self.full(setting, shown))
        return Admission(min(file_bytes, left))

    def _server_left(self) -> int:
        return self.server_bytes - self.server_used()

    def full(self, setting: str, used: int) -> str:
        whose = "this principal's" if setting == "principal_disk_bytes" else "the server's"
        cap = (
            Cap(self.budget.cap("server_disk_bytes").setting, self.server_bytes)
            if setting == "server_disk_bytes"
            else self.budget.cap(setting)
        )
        return (
            cap.exceeded(f"{whose} workspace files take {used:,} bytes of disk")
            + "; until some are deleted (rm) or sessions ended, commands can't write files"
        )

    def floor(self, free: int) -> str:
        """Why commands that grew were stopped, the root's free space under `reserve`."""
        return (
            f"the server's disk has {free:,} bytes free, under the {self.reserve:,} the "
            "server-wide budget keeps free (CTXACTORS_WORKSPACE_SERVER_DISK_BYTES); until "
            "some are deleted (rm) or sessions ended, commands can't write files"
        )

    def inode_floor(self, free: int) -> str:
        """Why measured commands may create nothing: the root's free inodes under
        `inode_reserve`."""
        return (
            f"the server's disk has {free:,} inodes (files and directories) free, under the "
            f"{self.inode_reserve:,} the server-wide budget keeps free (a quarter of those "
            "free at its start); until some are deleted (rm) or sessions ended, commands "
            "can't write files"
        )

    def too_many(self) -> str:
        """Why a principal past the walk's bound may not write."""
        return (
            f"this principal's workspace holds more than {MAX_ENTRIES:,} files and "
            f"directories, or nests them more than {MAX_DEPTH} deep, or in one the server "
            "may not read: more than the server counts; commands can't write files until "
            "some are deleted (rm) or sessions ended"
        )

    def _three_quarters(self) -> int:
        """3/4 of what the root's filesystem has free now plus what workspaces hold."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        s = os.statvfs(self.root)
        held = self.images.allocated() if self.images is not None else 0
        return max((s.f_bavail * s.f_frsize + held) * 3 // 4, 1)

    def close(self) -> list[str]:
        """Unmount the images (after the sandboxes are killed); returns any left mounted."""
        return self.images.close() if self.images is not None else []
