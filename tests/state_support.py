"""A real redis-server for the store tests, on a free loopback port, durable on every write;
with a password (``requirepass``), or an ACL user's with the rules docs/durable-state.md
gives, when asked."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ctxactors.testing import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The ACL rules of ctxactors' Redis user (docs/durable-state.md): its own keys, and the
# commands of the store, the Ray shard layout and call claims (scripts, MULTI), no others.
STORE_ACL = (
    "~ctxactors:* resetchannels -@all +@read +@write +@scripting +@transaction "
    "+@connection -@dangerous"
)


class RedisServer:
    """``redis-server`` with append-only fsync on every write; `restart` keeps its data.

    With a `password` it asks for it: as ``requirepass``, or with a `user` as that ACL
    user's (`STORE_ACL`), the default user then off. `url` carries the credentials,
    `bare_url` none. With `strangers` (and a `user`) the default user stays on without a
    password, a misconfiguration `serve` must refuse."""

    def __init__(
        self,
        directory: Path,
        *,
        password: str | None = None,
        user: str | None = None,
        strangers: bool = False,
    ) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (Debian package redis-server)")
        self.exe = exe
        self.dir = directory
        self.port = free_port()
        self.password = password
        self.user = user
        self.strangers = strangers  # with a `user`: the default user stays on, no password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bare_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def url(self) -> str:
        if self.password is None:
            return self.bare_url
        return f"redis://{self.user or ''}:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def user_url(self) -> str:
        """The URL with the user name only: the password comes from `password_file`."""
        return f"redis://{self.user or ''}@127.0.0.1:{self.port}/0"

    def password_file(self, path: Path) -> Path:
        """`path`, written with the password, its owner's only (for
        ``CTXACTORS_REDIS_PASSWORD_FILE``, which keeps it off the command line)."""
        path.write_text(f"{self.password}\n")
        path.chmod(0o600)
        return path

    def _auth_arguments(self) -> list[str]:
        if self.password is None:
            return []
        if self.user is None:
            return ["--requirepass", self.password]
        rules = [self.user, "on", f">{self.password}", *STORE_ACL.split()]
        default = ["on", "nopass", "~*", "+@all"] if self.strangers else ["off"]
        return ["--user", "default", *default, "--user", *rules]

    @property
    def socket(self) -> Path:
        """Where it listens as well: a Unix socket (owner only)."""
        return self.dir / "redis.sock"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--unixsocket",
                str(self.socket),
                "--unixsocketperm",
                "700",
                "--dir",
                str(self.dir),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                *self._auth_arguments(),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._answers_ping, 20, 0.05)

    def _answers_ping(self) -> bool:
        # Asking for a password, it answers NOAUTH: up all the same.
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def stop(self, kill: bool = False) -> None:
        if self.proc is not None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(timeout=20)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@contextmanager
def redis_server(directory: Path, password: str | None = None) -> Iterator[RedisServer]:
    server = RedisServer(directory, password=password)
    server.start()
    try:
        yield server
    finally:
        server.stop(kill=True)
