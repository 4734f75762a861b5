"""Session working directories that outlive the workspace's actor, within the retention.

With a state store, a session's directory is named for the session and stays when its actor
stops (a reap, an eviction, a restart of the server); the processes don't. It goes with
`end_session`, or once the session has gone unused for the store's retention: its mtime is
the session's last use (every call of the session touches it, behind the calls, as the
store's touch does; sessions with a live actor are touched before each purge).

The name is an HMAC of the session's key under a secret kept in the root (mode 0600), so
nobody who can't read the root can derive a session's directory from its id (a plain hash
of a guessable session id would be guessable).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import shutil
import time

from ctxactors import sandbox as sandboxes
from ctxactors.state import SessionRef, encode_ref

_KEY_FILE = ".ctxactors-session-key"
_NAME = re.compile(r"ws-[0-9a-f]{48}")  # an ephemeral directory's random name never matches


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

    def __init__(self, root: str, sandbox: sandboxes.SandboxSettings) -> None:
        self.root = root
        self._sandbox = sandbox
        self._key: bytes | None = None

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
        return self._key

    def path(self, session: SessionRef) -> str:
        digest = hmac.new(self._secret(), encode_ref(session).encode(), hashlib.sha256)
        return os.path.join(self.root, "ws-" + digest.hexdigest()[:48])

    def open(self, session: SessionRef, ids: tuple[int, int]) -> str:
        """The session's directory, made (and handed to its principal's uid, `ids`) if new."""
        path = self.path(session)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            os.utime(path)  # in use again: a purge pass must not take it now
            if self._sandbox.switch_user and os.lstat(path).st_uid != ids[0]:
                _hand_over(path, ids)
        else:
            sandboxes.prepare_directory(self._sandbox, path, ids)
        return path

    def touched(self, sessions: list[SessionRef]) -> None:
        for session in sessions:
            try:
                os.utime(self.path(session))
            except FileNotFoundError:
                pass  # the session never ran a command

    def deleted(self, session: SessionRef) -> None:
        shutil.rmtree(self.path(session), ignore_errors=True)

    def purge(self, retention: float) -> None:
        try:
            names = [n for n in os.listdir(self.root) if _NAME.fullmatch(n)]
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(self.root, name)
            try:
                idle = time.time() - os.stat(path).st_mtime
            except FileNotFoundError:
                continue
            if idle >= retention:
                shutil.rmtree(path, ignore_errors=True)


def _hand_over(path: str, ids: tuple[int, int]) -> None:
    """Give a kept directory and everything in it to the principal's uid: it was made for
    another (the single sandbox user of an earlier version). Walked by descriptor without
    following links, so what the sandbox put there can't point the chown elsewhere."""
    os.chown(path, *ids, follow_symlinks=False)
    for _, dirs, files, fd in os.fwalk(path, follow_symlinks=False):
        for name in dirs + files:
            os.chown(name, *ids, dir_fd=fd, follow_symlinks=False)
