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
An image is made or grown only if the host has room for it beside the others (`NoRoom`;
optionally preallocated): see `LoopImages`.

The filesystem is fitted to the budget when mounted (offline: ``e2fsck``, ``resize2fs``):
grown if the budget grew; shrunk if it was lowered and what is stored fits, else left as it
is (the caller then refuses writes while
the principal is above its budget: `usage`). Several servers on one root share the images:
a shared ``flock`` on ``<group>.use`` while a server uses one, and an exclusive one on
``<group>.mount`` around mounting and unmounting; a server unmounts at close only if it is
the last user.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import shutil
import stat
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


def _mount_image(image: str, point: str, options: str = _MOUNT_OPTIONS) -> None:
    """Mount `image` at `point` on a free loop device. Processes mounting at once race for
    the same free device (one then reads another's image, or a device still being released:
    "bad superblock on /dev/loopN", "probably corrupted filesystem on /dev/loopN"): our
    servers on one host take turns (`_device_lock`: only the ``mount`` itself, quick, no
    fsck or resize), and a race with other software is tried again a few times."""
    for attempt in range(_MOUNT_TRIES):
        try:
            with _locked(_device_lock()):
                _run("mount", "-t", "ext4", "-o", f"loop,{options}", image, point)
            return
        except OSError:
            if attempt == _MOUNT_TRIES - 1 or os.path.ismount(point):
                raise
            time.sleep(0.05 * (attempt + 1) + random.random() * 0.05)


def _unmount_image(image: str, point: str) -> subprocess.CompletedProcess[bytes]:
    """Unmount `point` and wait (a few seconds at most) until no loop device holds `image`,
    under the same host-wide lock as `_mount_image`: a device still being released when
    another mount takes it reads as no filesystem ("VFS: Can't find ext4 filesystem")."""
    with _locked(_device_lock()):
        done = subprocess.run(["umount", point], capture_output=True, timeout=_TIMEOUT)
        if done.returncode == 0:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                held = subprocess.run(
                    ["losetup", "-j", image], capture_output=True, timeout=_TIMEOUT
                )
                if held.returncode != 0 or not held.stdout.strip():
                    break
                time.sleep(0.01)
        return done


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
        if _unmount_image(image, point).returncode != 0:
            raise OSError(f"umount {point} failed")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"can't mount an ext4 image: {exc}"
    finally:
        if os.path.ismount(point):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        shutil.rmtree(probe, ignore_errors=True)
    return None


def _make(image: str, size: int) -> None:
    """A new sparse image of `size` bytes holding an empty ext4."""
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    try:
        _mkfs(image)
    except BaseException:
        os.unlink(image)
        raise


def _mkfs(image: str) -> None:
    """An empty ext4 in `image` (no blocks kept for root: the tenant's uid may use them
    all)."""
    _run(
        "mkfs.ext4", "-q", "-F", "-m", "0", "-L", "ctxactors",
        "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0", image,
    )  # fmt: skip


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _usage(point: str) -> Usage:
    s = os.statvfs(point)
    # What a non-root user may hold: everything but the blocks kept for root and ext4's own.
    capacity = (s.f_blocks - (s.f_bfree - s.f_bavail)) * s.f_frsize
    return Usage(capacity - s.f_bavail * s.f_frsize, capacity)


class NoRoom(OSError):
    """The host can't hold a new image (or a grown one) beside the room the other images
    may still take and the server's reserve (`LoopImages.reserve`)."""


class LoopImages:
    """The mounted images of one runtime; thread-safe.

    Each principal's image has a lock of its own: mounting, fitting (``e2fsck``,
    ``resize2fs``: up to `_TIMEOUT` seconds each, several passes) or unmounting one
    principal's image never holds up another's `area` or `usage`. What stays shared is short:
    the dictionaries below (``_lock``), and the room check of a new or grown image (a
    ``flock`` on ``<disks>/.room``, across servers on one root too, so two images can't both
    take the last room). Loop devices need no lock of ours: `_mount_image` retries a race.

    Room: the images are sparse, so together their budgets may pass what the host has.
    Were the host to fill, every principal's loop writeback would fail and its ext4 abort.
    So an image is made, or grown, only if its new size fits what the root's filesystem has
    free less the server's `reserve` less what the other images may still take (their
    size less what they hold): else `NoRoom`, for that principal only. Other writers on that
    filesystem (the store, logs) still take from the same free space: `preallocate` takes
    every image's blocks on the host when it is made or grown (``fallocate``; mounted without
    ``discard``, which would give deleted files' blocks back), a hard guarantee. Off by
    default: a server with many tenants, most using little of their budget, would hold
    budget × principals on the host for nothing, and the room check already keeps the
    images' own total within the disk.
    """

    rescan = 1.0  # seconds: how stale `allocated` may be for an image nobody asked for

    def __init__(
        self, root: str, budget: int, *, reserve: int = 0, preallocate: bool = False
    ) -> None:
        self.root = root
        self.budget = budget
        self.reserve = reserve  # bytes of the root's filesystem no image may take
        self.preallocate = preallocate
        self.disks = os.path.join(root, DISKS)
        self.areas = os.path.join(root, AREAS)
        self._options = "nodev,nosuid" if preallocate else _MOUNT_OPTIONS
        self._lock = threading.Lock()  # the dictionaries below; never held while mounting
        self._groups: dict[str, threading.Lock] = {}  # group -> its mounting's lock
        self._uses: dict[str, int] = {}  # group -> the fd of its shared .use lock
        self._borrowed: set[str] = set()  # mounted by `mounted` only: `release` unmounts
        self._held: dict[str, tuple[int, int]] = {}  # image name -> (size, bytes on host)
        self._stale: set[str] = set()  # images whose bytes may have changed since counted
        self._counted = -float("inf")  # time.monotonic() of the last count of every image
        self.notes: list[str] = []  # what fitting could not do, for the log

    def _paths(self, group: str) -> tuple[str, str]:
        return os.path.join(self.disks, group + ".img"), os.path.join(self.areas, group)

    def area(self, principal: str | None) -> str:
        """The principal's mounted filesystem (made and fitted to the budget if new);
        `NoRoom` if it is new and the host has no room for it."""
        group = cgroups.group_name(principal)
        self._ensure(group, borrow=False)
        return self._paths(group)[1]

    def _ensure(self, group: str, *, borrow: bool) -> None:
        """Mount the group's image unless it is; `borrow`: for the purge only (see
        `release`), else it stays mounted until `close`."""
        with self._lock:
            if group in self._uses:  # mounted: nothing to wait for
                if not borrow:
                    self._borrowed.discard(group)
                    self._stale.add(group + ".img")
                return
            lock = self._groups.setdefault(group, threading.Lock())
        with lock:  # one mount of this group at a time; other groups go on
            with self._lock:
                mounted = group in self._uses
            use = None if mounted else self._mount(group)
            with self._lock:
                if use is not None:
                    self._uses[group] = use
                    if borrow:
                        self._borrowed.add(group)
                if not borrow:
                    self._borrowed.discard(group)
                self._stale.add(group + ".img")

    def mounted(self) -> Iterator[str]:
        """The mount points of every image this root holds, mounting those that aren't
        (for the retention purge, which must see every principal's directories; `release`
        unmounts those after it). An image that can't be mounted is logged and passed over:
        one broken image must not stop the purge of every other principal."""
        try:
            names = sorted(n[: -len(".img")] for n in os.listdir(self.disks) if n.endswith(".img"))
        except FileNotFoundError:
            return
        for group in names:
            if not group.startswith("p-"):
                continue
            try:
                self._ensure(group, borrow=True)
            except (OSError, subprocess.SubprocessError) as exc:
                get_logger("ctxactors.workspace").error(
                    "disk_mount_failed", image=self._paths(group)[0], error=str(exc)
                )
                continue
            yield self._paths(group)[1]

    def release(self) -> None:
        """Unmount the images `mounted` mounted for a purge that no session asked for since:
        a purge must not leave one loop device per principal behind it."""
        with self._lock:
            groups = sorted(self._borrowed)
        for group in groups:
            with self._lock:
                lock = self._groups.setdefault(group, threading.Lock())
            with lock:
                with self._lock:
                    if group not in self._borrowed:  # asked for meanwhile: it stays
                        continue
                    self._borrowed.discard(group)
                    use = self._uses.pop(group)
                self._unmount(group, use)

    def usage(self, principal: str | None) -> Usage:
        return _usage(self.area(principal))

    def allocated(self) -> int:
        """Bytes the images take on the host (sparse: only what is written). Counted again
        for the images asked for (`area`, `usage`: each command's) since the last count, and
        every image at most every `rescan` seconds (a long command's writes, other servers'
        images): not every image's ``stat`` on every command."""
        now = time.monotonic()
        with self._lock:
            every = now - self._counted >= self.rescan
            stale, self._stale = self._stale, set()
        if every:
            held = self._count()
            with self._lock:
                self._held, self._counted = held, now
        else:
            for name in stale:
                try:
                    st = os.stat(os.path.join(self.disks, name), follow_symlinks=False)
                except FileNotFoundError:
                    continue
                with self._lock:
                    self._held[name] = (st.st_size, st.st_blocks * 512)
        with self._lock:
            return sum(on_host for _, on_host in self._held.values())

    def _count(self) -> dict[str, tuple[int, int]]:
        """Image name -> (size, bytes on the host) of every image, read now."""
        found: dict[str, tuple[int, int]] = {}
        try:
            with os.scandir(self.disks) as entries:
                for entry in entries:
                    if entry.name.endswith(".img"):
                        st = entry.stat(follow_symlinks=False)
                        found[entry.name] = (st.st_size, st.st_blocks * 512)
        except FileNotFoundError:
            pass
        return found

    def _claim(self, image: str, size: int, *, new: bool = False) -> None:
        """Make the image `size` bytes long (`new`: a file made now), or refuse with
        `NoRoom` (see the class docstring); with the room lock held, so no other image
        takes the same room meanwhile."""
        with _locked(os.path.join(self.disks, ".room")):
            held = self._count()
            before, _ = held.get(os.path.basename(image), (0, 0))
            s = os.statvfs(self.disks)
            promised = sum(max(length - on_host, 0) for length, on_host in held.values())
            left = s.f_bavail * s.f_frsize - self.reserve - promised
            if size - before > left:
                raise NoRoom(
                    errno.ENOSPC,
                    f"{image}: no room for {size:,} bytes: {max(left, 0):,} are left beside "
                    f"the server's reserve ({self.reserve:,}) and the {promised:,} other "
                    "images may still take",
                )
            flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(image, flags | (os.O_CREAT | os.O_EXCL if new else 0), 0o600)
            try:
                _resize(fd, size, self.preallocate)
            finally:
                os.close(fd)
        with self._lock:
            self._stale.add(os.path.basename(image))

    def _mount(self, group: str) -> int:
        """Mount the group's image (made if new), fitted; the fd of its shared .use lock."""
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
        return use

    def _mount_fitted(self, image: str, point: str) -> None:
        """Mount the image, fitted to the budget: resized offline (unmounted, checked, then
        ``resize2fs``) until a principal may hold its budget and little more. Offline, as
        growing online needs ``CAP_SYS_RESOURCE``, which a container's root may not have."""
        if not os.path.exists(image):
            size = max(_MIN_IMAGE, _round(self.budget))
            try:
                self._claim(image, size, new=True)
                _mkfs(image)
            except BaseException:
                _unlink(image)
                raise
        elif self.preallocate:  # made sparse before: its blocks now, if the host has them
            fd = os.open(image, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                _resize(fd, os.fstat(fd).st_size, True)
            except NoRoom as exc:
                self.notes.append(f"{image} left sparse: {exc}")
            finally:
                os.close(fd)
        os.makedirs(point, mode=0o711, exist_ok=True)
        for _ in range(_FITS):
            _mount_image(image, point, self._options)
            used, capacity = _usage(point)
            size = os.stat(image).st_size
            if capacity < self.budget:  # each size changes the fs's own overhead a little
                target = _round(size + (self.budget - capacity) * 65 // 64)
            elif capacity > self.budget + _slack(self.budget) and size > _MIN_IMAGE:
                target = max(_MIN_IMAGE, _round(size - (capacity - self.budget)))
            else:
                break
            try:
                if target > size:  # the room first, while still mounted (may be NoRoom)
                    self._claim(image, target)
                done = _unmount_image(image, point)
                if done.returncode != 0:
                    raise OSError(f"umount: {done.stderr.decode(errors='replace').strip()}")
                _run("e2fsck", "-f", "-p", image)
                _run("resize2fs", image, f"{target // 1024}K")
                if target < size:
                    os.truncate(image, target)
            except OSError as exc:  # e.g. shrinking below what is stored: kept as it is
                note = f"{image} kept at {capacity:,} bytes, {used:,} used: {exc}"
                self.notes.append(note)
                get_logger("ctxactors.workspace").warning("disk_not_resized", note=note)
                if not os.path.ismount(point):
                    _mount_image(image, point, self._options)
                break
        os.chmod(point, 0o711)  # principals' uids enter it to reach their own directories

    def _unmount(self, group: str, use: int) -> bool:
        """Give up this server's use of the group's image (`use`: its .use lock's fd),
        unmounting it if no other server uses it; True if it is left mounted."""
        os.close(use)
        point = self._paths(group)[1]
        with _locked(os.path.join(self.disks, group + ".mount")):
            last = _try_lock(os.path.join(self.disks, group + ".use"))
            if last is None:
                return False  # another server on this root still uses it
            try:
                if os.path.ismount(point):
                    done = _unmount_image(self._paths(group)[0], point)
                    if done.returncode != 0:  # busy: detached once nothing holds it
                        subprocess.run(["umount", "-l", point], capture_output=True)
                return os.path.ismount(point)
            finally:
                os.close(last)

    def close(self) -> list[str]:
        """Unmount the images no other server uses; returns mount points left mounted."""
        left = []
        with self._lock:
            groups = sorted(self._uses)
        for group in groups:
            with self._lock:
                lock = self._groups.setdefault(group, threading.Lock())
            with lock:
                with self._lock:
                    use = self._uses.pop(group, None)
                    self._borrowed.discard(group)
                if use is not None and self._unmount(group, use):
                    left.append(self._paths(group)[1])
        return left


def _resize(fd: int, size: int, preallocate: bool) -> None:
    """The image file `size` bytes long (never shorter); `preallocate`: all its blocks
    taken on the host (`NoRoom` if they aren't there)."""
    if not preallocate:
        if size > os.fstat(fd).st_size:
            os.ftruncate(fd, size)
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        raise NoRoom(errno.ENOSPC, f"no room on the host for {size:,} bytes") from None


def _slack(budget: int) -> int:
    """How far above the budget a filesystem may be (growth goes by whole MiB, and the
    smallest image holds more than a tiny budget) before a mount shrinks it."""
    return max(_MIN_IMAGE - budget, 0) + budget // 32 + (2 << 20)


def _round(size: int) -> int:
    return -(-size // (1 << 20)) << 20  # whole MiB


def _device_lock() -> str:
    """The host-wide lock file around choosing a loop device: in a root-only directory of
    /run (a lock in world-writable /tmp could be taken, or pre-made, by any local user)."""
    path = "/run/ctxactors"
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return os.path.join(tempfile.gettempdir(), "ctxactors-loop-devices.lock")
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(errno.EPERM, f"{path} is not a directory only this user may write")
    return os.path.join(path, "loop-devices.lock")


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
