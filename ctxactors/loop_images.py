"""A principal's workspace files on a filesystem of its own: `LoopImages`.

Each principal's session directories live in an ext4 filesystem made in a sparse file,
``<root>/.ctxactors-disks/<group>.img``, loop-mounted at ``<root>/principals/<group>/``
(`ctxactors.cgroups.group_name`: a hash of the principal). The filesystem's size is the
principal's budget, so the kernel enforces it: past it every write of that principal fails
with ``ENOSPC``, and no other principal's (nor the store's). Deleting works on a full ext4
(an unlink needs no new block), so a full principal can always free space or end sessions.
The images persist: a restart mounts them again and nothing is recounted.

Why loop images rather than project quotas: ext4 and xfs project quotas need the
filesystem mounted with ``prjquota`` (this machine's ``/`` is not) and the quota tools;
a loop device needs only root, ``/dev/loop-control`` and ``mkfs.ext4``, works on whatever
filesystem holds the root, and its limit can't be lifted from inside the sandbox (bubblewrap
binds the session directory, a directory of that filesystem). Sparse images take on the
host only what their files hold; mounted with ``discard``, deleting gives the blocks back.

The filesystem is fitted to the budget when mounted (offline: ``e2fsck``, ``resize2fs``):
grown if the budget grew; shrunk if it was lowered and what is stored fits, else left as it
is (the caller then refuses writes while
the principal is above its budget: `usage`). Several servers on one root share the images:
a shared ``flock`` on ``<group>.use`` while a server uses one, and an exclusive one on
``<group>.mount`` around mounting and unmounting; a server unmounts at close only if it is
the last user.
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

from ctxactors import cgroups
from ctxactors.logs import get_logger

DISKS = ".ctxactors-disks"  # in the workspace root: the images and their lock files
AREAS = "principals"  # in the workspace root: one directory (mount point) per principal
_MIN_IMAGE = 16 << 20  # ext4's journal and tables need a few MiB
_FITS = 4  # resizing passes at most
_MOUNT_TRIES = 5  # see _mount_image
_TIMEOUT = 120.0  # seconds for mkfs, mount, fsck, resize2fs
_MOUNT_OPTIONS = "nodev,nosuid,discard"


class Unavailable(Exception):
    """Why this server can't mount images (one line, for the startup log)."""


class Usage(NamedTuple):
    """A mounted filesystem's bytes used, and what a principal may hold in it."""

    used: int
    capacity: int


def _run(*argv: str) -> None:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise OSError(f"{' '.join(argv[:2])}: {detail}")


def _mount_image(image: str, point: str) -> None:
    """Mount `image` at `point` on a free loop device, trying again a few times: processes
    mounting at once can race for the same free device (one of them then reads another's
    image, or a device still being released: "bad superblock on /dev/loopN")."""
    for attempt in range(_MOUNT_TRIES):
        try:
            _run("mount", "-t", "ext4", "-o", f"loop,{_MOUNT_OPTIONS}", image, point)
            return
        except OSError:
            if attempt == _MOUNT_TRIES - 1 or os.path.ismount(point):
                raise
            time.sleep(0.05 * (attempt + 1) + random.random() * 0.05)


def check(root: str) -> None:
    """Raise `Unavailable` unless this process may make and mount an image under `root`:
    it makes, mounts and removes a small one (once per root and process)."""
    with _probe_lock:
        if root not in _probed:
            _probed[root] = _probe(root)
        problem = _probed[root]
    if problem is not None:
        raise Unavailable(problem)


_probed: dict[str, str | None] = {}
_probe_lock = threading.Lock()


def _probe(root: str) -> str | None:
    if os.geteuid() != 0:
        return "not root (mounting a loop device needs it)"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control (the loop module, or a container without loop devices)"
    for program in ("mkfs.ext4", "mount", "umount", "losetup", "resize2fs", "e2fsck"):
        if shutil.which(program) is None:
            return f"{program} not found (Debian: e2fsprogs, mount)"
    os.makedirs(root, mode=0o700, exist_ok=True)
    probe = tempfile.mkdtemp(prefix="probe-disk-", dir=root)
    image, point = os.path.join(probe, "probe.img"), os.path.join(probe, "mnt")
    try:
        _make(image, _MIN_IMAGE)
        os.mkdir(point)
        _mount_image(image, point)
        _run("umount", point)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"can't mount an ext4 image: {exc}"
    finally:
        if os.path.ismount(point):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        shutil.rmtree(probe, ignore_errors=True)
    return None


def _make(image: str, size: int) -> None:
    """A new sparse image of `size` bytes holding an empty ext4 (no blocks kept for root:
    the tenant's uid may use them all)."""
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    try:
        _run(
            "mkfs.ext4", "-q", "-F", "-m", "0", "-L", "ctxactors",
            "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0", image,
        )  # fmt: skip
    except BaseException:
        os.unlink(image)
        raise


def _usage(point: str) -> Usage:
    s = os.statvfs(point)
    # What a non-root user may hold: everything but the blocks kept for root and ext4's own.
    capacity = (s.f_blocks - (s.f_bfree - s.f_bavail)) * s.f_frsize
    return Usage(capacity - s.f_bavail * s.f_frsize, capacity)


class LoopImages:
    """The mounted images of one runtime; thread-safe."""

    def __init__(self, root: str, budget: int) -> None:
        self.root = root
        self.budget = budget
        self.disks = os.path.join(root, DISKS)
        self.areas = os.path.join(root, AREAS)
        self._lock = threading.Lock()
        self._uses: dict[str, int] = {}  # group -> the fd of its shared .use lock
        self.notes: list[str] = []  # what fitting could not do, for the log

    def _paths(self, group: str) -> tuple[str, str]:
        return os.path.join(self.disks, group + ".img"), os.path.join(self.areas, group)

    def area(self, principal: str | None) -> str:
        """The principal's mounted filesystem (made and fitted to the budget if new)."""
        group = cgroups.group_name(principal)
        with self._lock:
            if group not in self._uses:
                self._mount(group)
            return self._paths(group)[1]

    def mounted(self) -> Iterator[str]:
        """The mount points of every image this root holds, mounting those that aren't
        (for the retention purge, which must see every principal's directories)."""
        try:
            names = sorted(n[: -len(".img")] for n in os.listdir(self.disks) if n.endswith(".img"))
        except FileNotFoundError:
            return
        for group in names:
            if not group.startswith("p-"):
                continue
            with self._lock:
                if group not in self._uses:
                    self._mount(group)
            yield self._paths(group)[1]

    def usage(self, principal: str | None) -> Usage:
        return _usage(self.area(principal))

    def allocated(self) -> int:
        """Bytes the images take on the host now (sparse: only what is written)."""
        total = 0
        try:
            with os.scandir(self.disks) as entries:
                for entry in entries:
                    if entry.name.endswith(".img"):
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
        except FileNotFoundError:
            pass
        return total

    def _mount(self, group: str) -> None:
        image, point = self._paths(group)
        os.makedirs(self.disks, mode=0o700, exist_ok=True)
        os.makedirs(self.areas, mode=0o711, exist_ok=True)
        use = _lock_file(os.path.join(self.disks, group + ".use"), fcntl.LOCK_SH)
        try:
            with _locked(os.path.join(self.disks, group + ".mount")):
                if not os.path.ismount(point):
                    try:
                        self._mount_fitted(image, point)
                    except BaseException:  # not left mounted with nobody to unmount it
                        if os.path.ismount(point):
                            subprocess.run(["umount", "-l", point], capture_output=True)
                        raise
        except BaseException:
            os.close(use)
            raise
        self._uses[group] = use

    def _mount_fitted(self, image: str, point: str) -> None:
        """Mount the image, fitted to the budget: resized offline (unmounted, checked, then
        ``resize2fs``) until a principal may hold its budget and little more. Offline, as
        growing online needs ``CAP_SYS_RESOURCE``, which a container's root may not have."""
        if not os.path.exists(image):
            _make(image, max(_MIN_IMAGE, _round(self.budget)))
        os.makedirs(point, mode=0o711, exist_ok=True)
        for _ in range(_FITS):
            _mount_image(image, point)
            used, capacity = _usage(point)
            size = os.stat(image).st_size
            if capacity < self.budget:  # each size changes the fs's own overhead a little
                target = _round(size + (self.budget - capacity) * 65 // 64)
            elif capacity > self.budget + _slack(self.budget) and size > _MIN_IMAGE:
                target = max(_MIN_IMAGE, _round(size - (capacity - self.budget)))
            else:
                break
            try:
                _run("umount", point)
                _run("e2fsck", "-f", "-p", image)
                if target > size:
                    os.truncate(image, target)
                _run("resize2fs", image, f"{target // 1024}K")
                if target < size:
                    os.truncate(image, target)
            except OSError as exc:  # e.g. shrinking below what is stored: kept as it is
                note = f"{image} kept at {capacity:,} bytes, {used:,} used: {exc}"
                self.notes.append(note)
                get_logger("ctxactors.workspace").warning("disk_not_resized", note=note)
                if not os.path.ismount(point):
                    _mount_image(image, point)
                break
        os.chmod(point, 0o711)  # principals' uids enter it to reach their own directories

    def close(self) -> list[str]:
        """Unmount the images no other server uses; returns mount points left mounted."""
        left = []
        with self._lock:
            for group, use in sorted(self._uses.items()):
                os.close(use)
                image, point = self._paths(group)
                with _locked(os.path.join(self.disks, group + ".mount")):
                    last = _try_lock(os.path.join(self.disks, group + ".use"))
                    if last is None:
                        continue  # another server on this root still uses it
                    try:
                        if os.path.ismount(point):
                            done = subprocess.run(["umount", point], capture_output=True)
                            if done.returncode != 0:  # busy: detached once nothing holds it
                                subprocess.run(["umount", "-l", point], capture_output=True)
                        if os.path.ismount(point):
                            left.append(point)
                    finally:
                        os.close(last)
            self._uses.clear()
        return left


def _slack(budget: int) -> int:
    """How far above the budget a filesystem may be (growth goes by whole MiB, and the
    smallest image holds more than a tiny budget) before a mount shrinks it."""
    return max(_MIN_IMAGE - budget, 0) + budget // 32 + (2 << 20)


def _round(size: int) -> int:
    return -(-size // (1 << 20)) << 20  # whole MiB


def _lock_file(path: str, how: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, how)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _try_lock(path: str) -> int | None:
    """An exclusive lock on `path` if nobody holds it (its fd), else None."""
    try:
        return _lock_file(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None


class _locked:
    """An exclusive ``flock`` on `path` for a ``with`` block."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> None:
        self.fd = _lock_file(self.path, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
