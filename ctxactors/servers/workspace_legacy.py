"""Session directories kept by a version without principals' areas, moved into their area.

Before each principal had an area (``<root>/principals/<hash>/``, on a root server its own
loop-mounted filesystem: `ctxactors.loop_images`), every kept session directory was
``<root>/ws-<name>``, with the same name as now (an HMAC of the session's key). Used where
it is, a principal's such directory would be outside its disk budget, on the root's
filesystem, for as long as the session kept being used. So its first use in this version
moves it into the principal's area (`move`); one never used again stays in the root,
where the server-wide budget counts it (the root's walk), until its retention ends. The
name alone can't say whose it is (the HMAC is one way), which is why the move waits for a
call of the session.

Within one filesystem (the measured fallback's plain areas) the move is a rename. Into an
image it is a copy, made crash-safe by its order:

1. ``cp -a`` into ``<area>/.ctxactors-migrating-<name>`` (a name no lookup or purge takes
   for a session's), then ``sync -f`` of that filesystem;
2. the copy renamed to ``<area>/<name>``, the area synced: from here the copy is the
   session's directory, and the root's is stale;
3. the root's renamed to ``<root>/.ctxactors-migrated-<name>`` and removed.

A ``kill -9`` anywhere leaves either the whole root directory and maybe a partial copy (the
next move removes the copy and starts again) or the whole copy and maybe the stale root
one (the next move, or `sweep` in the purge, removes that): never two directories a
session could use, and nothing lost. ``cp`` runs under ``setpriv --pdeathsig KILL``, so a
killed server leaves no copier writing on. A directory larger than what the principal's
image has free is not moved (`TooBig`): its files stay in the root, unused, until the
session ends or its retention does; so is one past the walk's bound (more than
`MAX_ENTRIES` files, nested deeper than it counts: its size is unknown), refused before
anything is copied. A refusal is remembered (`Refusals`) until the directory changes, the
principal's disk has more free than it lacked, or `RETRY` seconds pass: each call of that
session doesn't measure and copy it again, and a copy that failed for a passing lack of
room (another command's files, deleted since) is tried again. (Renamed into a measured area, one larger than the
budget is moved all the same: the principal is then over its budget, and its commands
can't write files until it deletes some, as for any principal over it.)

A move holds an exclusive ``flock`` on its directory's lock file
(``<root>/.ctxactors-move-locks/<name>``), as does ending any session; a purge pass takes
each name's lock without waiting (`unmoved`) before it removes anything of that name, and
skips the name while a move holds it. Servers sharing a root, and a purge or an
``end_session`` racing a move, never see half of one; moves of different sessions don't
wait for each other; and no stream of calls can keep the purge from the other names
(one root-wide lock shared by moves was never free while a session's calls queued on it).
A move also holds that root-wide lock shared once it has its name's (``moving``), for a
server of the previous version on the same root, whose purge still takes it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from ctxactors.sandbox_disk import MAX_ENTRIES, measure
from ctxactors.sandbox_disk import remove as remove_tree

COPY = ".ctxactors-migrating-"  # a copy being made, in the area
TRASH = ".ctxactors-migrated-"  # a root directory already copied, being removed
_OLD_LOCK = ".ctxactors-migrate.lock"  # the previous version's purge: see `moving`
SESSION = re.compile(r"ws-[0-9a-f]{48}")  # a kept session directory's name (an HMAC)
_LOCKS = ".ctxactors-move-locks"  # a lock file per directory being moved
_TIMEOUT = 3600.0  # seconds a copy may take (the most a budget holds, on a slow disk)
RETRY = 300.0  # seconds a refusal holds at most: after ENOSPC, free may come back only as it was
_clock = time.monotonic  # (a test's to move)


class TooBig(Exception):
    """A directory needs more than the principal's disk has free: (bytes held, free);
    `past_bound`: it holds more than the walk counts (`MAX_ENTRIES`), `held` a floor."""

    def __init__(self, held: int, free: int, *, past_bound: bool = False) -> None:
        super().__init__(held, free, past_bound)
        self.held = held
        self.free = free
        self.past_bound = past_bound


class _Refusal(NamedTuple):
    stamp: tuple[int, int, int]  # the directory's (inode, mtime, ctime) when refused
    need: int  # free bytes the next try needs (`sys.maxsize`: none will do)
    error: TooBig
    until: float  # `_clock()` after which it is tried again


class Refusals:
    """The root directories a move refused (`TooBig`), each until it changes, the
    principal's disk has the room it lacked, or `RETRY` seconds pass; one process's, guarded by each name's move
    lock (a name is only read or written under it)."""

    def __init__(self) -> None:
        self._by_name: dict[str, _Refusal] = {}

    def check(self, legacy: str, free: int | None) -> None:
        """Raise the last refusal of `legacy` if it still holds."""
        last = self._by_name.get(os.path.basename(legacy))
        room = sys.maxsize - 1 if free is None else free  # no budget of its own
        if last is None or _clock() >= last.until:
            return
        if room < last.need and last.stamp == _stamp(legacy):
            raise last.error

    def refuse(self, legacy: str, error: TooBig, need: int, stamp: tuple[int, int, int]) -> TooBig:
        self._by_name[os.path.basename(legacy)] = _Refusal(stamp, need, error, _clock() + RETRY)
        return error

    def drop(self, name: str) -> None:
        """`name`'s directory moved or went."""
        self._by_name.pop(name, None)


def _stamp(path: str) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns


@contextlib.contextmanager
def moving(root: str, name: str) -> Iterator[None]:
    """Held while the directory `name` moves: the name's lock, exclusive (moves of other
    sessions go on at once: one principal's long copy stalls no one else's), then the
    root's old lock shared, which a purge of the previous version (a server on the same
    root, mid-upgrade) takes exclusively; taken second, it is held only by a move under
    way, never by a call waiting for one. The lock files must be made: a move on a full
    root disk fails."""
    with _held(_name_lock(root, name), fcntl.LOCK_EX, make=True):
        with _held(os.path.join(root, _OLD_LOCK), fcntl.LOCK_SH, make=True):
            yield


@contextlib.contextmanager
def removing(root: str, name: str) -> Iterator[None]:
    """Held while a session with a root directory `name` ends: no move of it is under way.
    On a full disk with no lock file there, none is (a move makes the file first)."""
    with _held(_name_lock(root, name), fcntl.LOCK_EX, make=False):
        yield


@contextlib.contextmanager
def unmoved(root: str, name: str) -> Iterator[bool]:
    """The name's lock, exclusive, if no move holds it now (yields False if one does):
    for a purge pass, which must not remove what a move is copying, nor wait for it. The
    lock file is made if there is room (a move starting meanwhile then waits for this);
    on a full disk none can be, and no move can start either."""
    with _held(_name_lock(root, name), fcntl.LOCK_EX | fcntl.LOCK_NB, make=False) as held:
        yield held


def prepare(root: str) -> None:
    """Make the lock files' place now, while there is room (see `removing`)."""
    os.makedirs(os.path.join(root, _LOCKS), mode=0o700, exist_ok=True)


def forget(root: str, name: str) -> None:
    """Remove `name`'s lock file (held) once its root directory is gone: nothing is done
    under it again (a waiter finds no directory), so a second file made later is harmless."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_name_lock(root, name))


def _name_lock(root: str, name: str) -> str:
    return os.path.join(root, _LOCKS, name)


@contextlib.contextmanager
def _held(path: str, how: int, *, make: bool) -> Iterator[bool]:
    """``flock(how)`` on `path` for a ``with`` block; yields False (holding nothing) if
    ``LOCK_NB`` and another holds it. Without `make`, a lock file that can't be made (a
    full disk) is no lock to take: yields True."""
    fd = _lock_file(path, make=make)
    if fd is None:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # and the lock with it


def _lock_file(path: str, *, make: bool) -> int | None:
    """The lock file's descriptor (made if missing); None if it can't be made for a full
    disk, or its directory is missing, and not `make`."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except FileNotFoundError:
        if not make:
            return None
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        return os.open(path, flags, 0o600)
    except OSError as exc:
        if make or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        return None


def is_directory(path: str) -> bool:
    """A real directory at `path` (never through a symlink)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def move(legacy: str, area: str, free: int | None, refusals: Refusals | None = None) -> bool:
    """Move the root's session directory `legacy` into `area` under its name (holding
    `moving`); `free`: the bytes a copy may take (None: no budget of its own). Returns
    False if the area held the directory already (a copy finished before a crash): the
    root's was stale, and is removed. Raises `TooBig` (remembered in `refusals`) for one
    that doesn't fit, or is past the walk's bound, before copying anything."""
    name = os.path.basename(legacy)
    target, copy = os.path.join(area, name), os.path.join(area, COPY + name)
    _remove(copy)  # a copy cut short by a crash
    if os.path.lexists(target):
        discard(legacy)
        return False
    if os.lstat(legacy).st_dev == os.stat(area).st_dev:
        os.rename(legacy, target)  # one filesystem: atomic, nothing to copy
        _sync_directory(area)
        _sync_directory(os.path.dirname(legacy))
        return True
    refusals = Refusals() if refusals is None else refusals
    refusals.check(legacy, free)
    stamp = _stamp(legacy)
    held, entries = measure(legacy)
    if entries > MAX_ENTRIES:  # its size unknown: a copy could only fill the disk
        raise refusals.refuse(legacy, TooBig(held, free or 0, past_bound=True), sys.maxsize, stamp)
    if free is not None and held > free:
        raise refusals.refuse(legacy, TooBig(held, free), held, stamp)
    try:
        # -a: links as links, hard links, owners, modes, times, xattrs; holes kept as holes.
        _run("cp", "-a", "--sparse=always", "-T", legacy, copy)
        _run("sync", "-f", copy)  # the copy's data on disk before its name says it is whole
    except _NoSpace:
        _remove(copy)
        lacked = TooBig(held, 0 if free is None else free)
        # Measured to fit, and didn't (ext4's own blocks): not again until there is more.
        raise refusals.refuse(legacy, lacked, lacked.free + 1, stamp) from None
    except BaseException:
        _remove(copy)
        raise
    os.rename(copy, target)
    _sync_directory(area)
    discard(legacy)
    return True


def discard(legacy: str) -> None:
    """Remove a root directory whose copy is whole: renamed first, so a crash part-way
    leaves a name `sweep` removes, never a half-removed directory a session could use."""
    trash = os.path.join(os.path.dirname(legacy), TRASH + os.path.basename(legacy))
    try:
        os.rename(legacy, trash)
    except FileNotFoundError:
        return
    _sync_directory(os.path.dirname(legacy))
    remove_tree(trash)


def sweep(root: str, areas: Iterable[str]) -> None:
    """What moves cut short by a crash left: partial copies in the areas, removals in the
    root, and root directories whose copy in an area is whole; each under its name's lock
    (`unmoved`: one moving now is left for the next pass). Only session directories'
    names: every image has a ``lost+found`` (as may the root), which is no session's."""
    moved: set[str] = set()
    for area in areas:
        for name in _names(area):
            if name.startswith(COPY) and SESSION.fullmatch(name[len(COPY) :]):
                _remove_unmoved(root, name[len(COPY) :], os.path.join(area, name))
            elif SESSION.fullmatch(name):
                moved.add(name)
    for name in _names(root):
        if name.startswith(TRASH) and SESSION.fullmatch(name[len(TRASH) :]):
            _remove_unmoved(root, name[len(TRASH) :], os.path.join(root, name))
        elif name in moved and is_directory(os.path.join(root, name)):
            with unmoved(root, name) as free:
                if free:
                    discard(os.path.join(root, name))
                    forget(root, name)


def _remove_unmoved(root: str, name: str, path: str) -> None:
    with unmoved(root, name) as free:
        if free:
            _remove(path)
            if not os.path.lexists(os.path.join(root, name)):  # nothing left to move
                forget(root, name)


class _NoSpace(Exception):
    """The copy's filesystem is full."""


def _run(*argv: str) -> None:
    """Run a program to its end, killed with this process if it dies (no copier left
    writing after a ``kill -9``); its failure is `OSError`, or `_NoSpace` (a full disk)."""
    done = subprocess.run(
        ["setpriv", "--pdeathsig", "KILL", "--", *argv],
        capture_output=True,
        text=True,
        errors="replace",  # a tenant's file name in an error need not be UTF-8
        timeout=_TIMEOUT,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        if "No space left on device" in detail or "Disk quota exceeded" in detail:
            raise _NoSpace(detail)
        raise OSError(f"{argv[0]}: {detail}")


def _names(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def _remove(path: str) -> None:
    if os.path.lexists(path):
        remove_tree(path)


def _sync_directory(path: str) -> None:
    """A rename in `path` on disk (not only in the page cache)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
