"""Session working directories that outlive the workspace's actor, within the retention.

With a state store, a session's directory is named for the session and stays when its actor
stops (a reap, an eviction, a restart of the server); the processes don't. It goes with
`end_session`, or once the session has gone unused for the store's retention. The last use
is the server's record, never a time of the directory: that directory is the sandbox's
``/workspace``, whose owner may date it in 2100 (``touch -d``). The record is the mtime of a
file of the server's, ``<root>/.ctxactors-last-use/<directory's name>``, which no sandbox
sees (only its own directory is mounted); every call of the session sets it, behind the
calls, as the store's touch does, and sessions with a live actor are touched before each
purge.

A principal's directories are in its own area, ``<root>/principals/<hash of the
principal>/`` (on a root server, its own loop-mounted filesystem: `ctxactors.sandbox_disk`);
callers with no principal keep theirs in the root itself. A principal's directory kept in
the root by a version without areas moves into its area at the session's first call
(`ctxactors.servers.workspace_legacy`), never used where it is.

The name is an HMAC of the session's key under a secret kept in the root (mode 0600), so
nobody who can't read the root can derive a session's directory from its id (a plain hash
of a guessable session id would be guessable).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import secrets
import subprocess
import time

from ctxactors import sandbox as sandboxes
from ctxactors.errors import ToolError
from ctxactors.logs import get_logger
from ctxactors.sandbox_disk import (
    MAX_DEPTH,
    MAX_ENTRIES,
    DiskBudgets,
    area_path,
    plain_area,
    plain_areas,
)
from ctxactors.sandbox_disk import remove as remove_tree
from ctxactors.servers import workspace_legacy as legacy_dirs
from ctxactors.state import SessionRef, encode_ref

_KEY_FILE = ".ctxactors-session-key"
_USES = ".ctxactors-last-use"  # the directory of last-use records (see the module docstring)
_NAME = legacy_dirs.SESSION  # an ephemeral directory's random name never matches


_KEY_BYTES = 32


def _read_key(path: str) -> bytes:
    """The secret, only from a file that is ours, private and whole: a key another user
    planted (or an empty one) would make every session's directory name guessable."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        status = os.fstat(f.fileno())
        key = f.read(_KEY_BYTES + 1)
    if status.st_uid != os.geteuid() or status.st_mode & 0o077 or len(key) != _KEY_BYTES:
        raise RuntimeError(
            f"{path}: the workspace key must be this user's, mode 0600 and "
            f"{_KEY_BYTES} bytes; remove it to make a new one (kept directories are lost)"
        )
    return key


class SessionDirs:
    """The kept directories under `root`; a `SessionListener` of the runtime's durability."""

    def __init__(
        self, root: str, sandbox: sandboxes.SandboxSettings, disks: DiskBudgets | None = None
    ) -> None:
        self.root = root
        self._sandbox = sandbox
        self._disks = disks  # None: principals' areas are plain directories
        self._key: bytes | None = None
        self._refusals = legacy_dirs.Refusals()  # root directories too big to move

    def _secret(self) -> bytes:
        if self._key is None:
            sandboxes.make_root(self._sandbox, self.root)
            path = os.path.join(self.root, _KEY_FILE)
            if not os.path.exists(path):
                # Written whole under a temporary name, then linked: a second process racing
                # here reads one complete key, never a half-written one.
                temporary = f"{path}.{secrets.token_hex(8)}"
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(secrets.token_bytes(_KEY_BYTES))
                    f.flush()
                    os.fsync(f.fileno())  # a crash must not leave an empty key behind
                try:
                    os.link(temporary, path)
                except FileExistsError:
                    pass
                finally:
                    os.unlink(temporary)
            self._key = _read_key(path)
            # Made now, while there is room: ending a session must lock it on a full disk.
            legacy_dirs.prepare(self.root)
        return self._key

    def path(self, session: SessionRef) -> str:
        """The session's directory (in its principal's area; nothing is made or mounted)."""
        return os.path.join(area_path(self.root, session[0]), self._name(session))

    def _name(self, session: SessionRef) -> str:
        digest = hmac.new(self._secret(), encode_ref(session).encode(), hashlib.sha256)
        return "ws-" + digest.hexdigest()[:48]

    def _area(self, principal: str | None) -> str:
        """The principal's area, made (or mounted) if needed."""
        if self._disks is not None:
            return self._disks.area(principal)
        return plain_area(self.root, principal)

    def open(self, session: SessionRef, ids: tuple[int, int]) -> str:
        """The session's directory, made (and handed to its principal's uid, `ids`) if new."""
        area = self._area(session[0])
        path = self.path(session)
        if _mtime(self._use_file(path)) == 0:  # ended, its disk unmountable then: see deleted
            remove_tree(path)
        if session[0] is not None:
            self._adopt(session, area)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if self._sandbox.switch_user and os.lstat(path).st_uid != ids[0]:
                _hand_over(path, ids)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            raise ToolError(
                "this principal's workspace disk is full: no new session directory fits; "
                "delete files in another session (rm) or end sessions"
            ) from None
        else:
            sandboxes.prepare_directory(self._sandbox, path, ids)
        self._record_use(path)  # in use (again): a purge pass must not take it now
        return path

    def _adopt(self, session: SessionRef, area: str) -> None:
        """Move the session's directory kept by a version without areas into its
        principal's `area` (`ctxactors.servers.workspace_legacy`), if there is one."""
        legacy = os.path.join(self.root, self._name(session))
        if not legacy_dirs.is_directory(legacy):
            return
        self._record_use(legacy)  # in use: a purge pass must not take it while it moves
        name = os.path.basename(legacy)
        with legacy_dirs.moving(self.root, name):
            if not legacy_dirs.is_directory(legacy):  # moved by another server meanwhile
                legacy_dirs.forget(self.root, name)  # which, there, left this one's file
                return
            free = self._free(session[0])
            try:
                moved = legacy_dirs.move(legacy, area, free, self._refusals)
                legacy_dirs.forget(self.root, name)
                self._refusals.drop(name)
            except legacy_dirs.TooBig as exc:
                if exc.past_bound:
                    raise ToolError(
                        "this session's files, kept by an earlier version outside its "
                        f"principal's workspace disk, are more than {MAX_ENTRIES:,} files and "
                        f"directories, or nested more than {MAX_DEPTH} deep, or in one the "
                        "server may not read: more than the server counts, so they are not "
                        "moved onto that disk. They stay as they are, unused, until the "
                        "session ends: end this session to drop them"
                    ) from None
                raise ToolError(
                    f"this session's files, kept by an earlier version outside its principal's "
                    f"workspace disk, take {exc.held:,} bytes: more than that disk has free "
                    f"({exc.free:,} bytes; its size is CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES). "
                    "They stay as they are, unused, until the session ends: free space in "
                    "other sessions (rm) and call again, or end this session to drop them"
                ) from None
        if self._disks is not None:
            self._disks.forget()  # the root's count and the area's changed
        get_logger("ctxactors.workspace").info(
            "workspace_moved_into_area",
            directory=os.path.join(area, os.path.basename(legacy)),
            copied=moved,
        )

    def _free(self, principal: str | None) -> int | None:
        """Bytes the principal's own filesystem has free within its budget (None: its area
        is a plain directory, held by the measured budget)."""
        disks = self._disks
        if disks is None or disks.images is None:
            return None
        used, capacity = disks.images.usage(principal)
        return max(min(capacity, disks.budget.principal_disk_bytes) - used, 0)

    def touched(self, sessions: list[SessionRef]) -> None:
        for session in sessions:
            path = self.path(session)
            # Else the session never ran a command (its record exists from its first: the
            # directory may be on a principal's disk that is not mounted in this run).
            if os.path.isdir(path) or os.path.exists(self._use_file(path)):
                self._record_use(path)

    def deleted(self, session: SessionRef) -> None:
        """Delete the session's directory. Ending a session always works: if its
        principal's disk can't be mounted now, what is reachable goes, and its last-use
        record is dated to the epoch, so the next purge deletes the rest (and `open`
        before it, should the session come back first)."""
        path = self.path(session)
        mounted = True
        if session[0] is not None and os.path.exists(self._use_file(path)):
            try:
                self._area(session[0])  # its disk, mounted, to delete what it holds
            except ToolError as exc:
                get_logger("ctxactors.workspace").warning(
                    "workspace_delete_deferred", directory=path, error=str(exc)
                )
                mounted = False
        name = self._name(session)
        legacy = os.path.join(self.root, name)
        # Under the name's lock: a move of the session's directory kept in the root by a
        # version without areas ends first, and can't bring it back once removed.
        with legacy_dirs.removing(self.root, name):
            remove_tree(legacy)
            legacy_dirs.forget(self.root, name)
            self._refusals.drop(name)
            if not mounted:
                with contextlib.suppress(FileNotFoundError):  # a purge took it meanwhile
                    os.utime(self._use_file(path), (0, 0))
                return
            remove_tree(path)
            copy = os.path.join(os.path.dirname(path), legacy_dirs.COPY + name)
            remove_tree(copy)
        _unlink(self._use_file(path))
        if self._disks is not None:
            self._disks.forget(path)
            self._disks.forget(legacy)

    def _directories(self) -> dict[str, str]:
        """Name -> path of every kept directory: the root's and every principal area's."""
        found: dict[str, str] = {}
        for area in [self.root, *self._areas()]:
            try:
                names = os.listdir(area)
            except FileNotFoundError:
                continue
            found.update((n, os.path.join(area, n)) for n in names if _NAME.fullmatch(n))
        return found

    def _areas(self) -> list[str]:
        """Every principal's area (mounting images)."""
        return self._disks.areas() if self._disks is not None else plain_areas(self.root)

    def purge(self, retention: float) -> None:
        if not os.path.isdir(self.root):
            return
        legacy_dirs.sweep(self.root, self._areas())
        directories = self._directories()
        names = set(directories)
        now = time.time()
        for path in directories.values():
            used = _mtime(self._use_file(path))
            if used is None:  # kept from before these records: its retention starts now
                self._record_use(path)
            elif now - used >= retention and self._expire(path):
                _unlink(self._use_file(path))
                if self._disks is not None:
                    self._disks.forget()
        # Records whose directory went another way (a touch racing an end_session).
        uses = os.path.join(self.root, _USES)
        for name in os.listdir(uses) if os.path.isdir(uses) else ():
            used = _mtime(os.path.join(uses, name))
            if name not in names and used is not None and now - used >= retention:
                _unlink(os.path.join(uses, name))
        if self._disks is not None:
            self._disks.release()  # the images mounted for this purge alone

    def _expire(self, path: str) -> bool:
        """Remove a session directory past its retention; one in the root only under its
        name's lock, and not while a move holds it (it may be copying it: the next pass
        takes it). False if it stays."""
        if os.path.dirname(path) != self.root:
            remove_tree(path)
            return True
        name = os.path.basename(path)
        with legacy_dirs.unmoved(self.root, name) as free:
            if not free:
                return False
            remove_tree(path)
            legacy_dirs.forget(self.root, name)
            self._refusals.drop(name)
        return True

    def _use_file(self, directory: str) -> str:
        return os.path.join(self.root, _USES, os.path.basename(directory))

    def _record_use(self, directory: str) -> None:
        """The session of `directory` is in use now (the record's mtime; made if new)."""
        record = self._use_file(directory)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(record, flags, 0o600)
        except FileNotFoundError:  # the first record under this root
            os.makedirs(os.path.dirname(record), mode=0o700, exist_ok=True)
            fd = os.open(record, flags, 0o600)
        try:
            os.utime(fd)
        finally:
            os.close(fd)


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _hand_over(path: str, ids: tuple[int, int]) -> None:
    """Give a kept directory and everything in it to the principal's uid: it was made for
    another (the single sandbox user of an earlier version). Coreutils' ``chown -R``
    walks without recursing (a tree the sandbox nested thousands deep ends no walk) and,
    with ``-P -h``, never follows a link, so what the sandbox put there can't point the
    chown elsewhere. On failure the top goes back to its owner: `SessionDirs.open` tells
    a directory still to hand over by its top's owner, so the next call tries again."""
    before = os.lstat(path)
    done = subprocess.run(
        ["chown", "-R", "-P", "-h", f"{ids[0]}:{ids[1]}", "--", path],
        capture_output=True,
        text=True,
        errors="replace",  # a tenant's file name in an error need not be UTF-8
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        os.chown(path, before.st_uid, before.st_gid, follow_symlinks=False)
        detail = done.stderr.strip() or f"exit status {done.returncode}"
        raise OSError(f"chown of {path}: {detail}")
