"""``ctxactors loadtest --restart-every SECONDS``: the load test's own server, killed and
restarted under load, so anyone can check that nothing acknowledged is ever lost.

The load test starts ``ctxactors serve --transport http`` on a free loopback port with its
own data directory (the default SQLite store, or ``--serve-store``), sends the workload to
it over REST, and every SECONDS kills it with SIGKILL and starts it again on the same port
and data. A call whose connection dropped before its reply is *in doubt*: its effect may be
present or absent (the checker reads the key back before its next call and accepts either,
never half of it); an acknowledged call's effect must be present. The restarts stop before
the verification phase, which then reads every key back exactly.

The server gets the load test's ``--set`` settings too. With ``--hostile`` it authenticates:
the load test makes two bearer tokens, one for the checked tenants (an operator, so that
the report has the server's counters) and one for the hostile tenant, a principal of its
own (`ctxactors.cli.loadtest.hostile`).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from ctxactors.cli.token import Bearer

_START_TIMEOUT = 60.0
CHECKED, HOSTILE = "loadtest", "hostile"  # the principals of an authenticating server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RestartedServer:
    """A ``ctxactors serve --transport http`` this process owns, restarted every `every`
    seconds by SIGKILL until `stop_restarting`."""

    def __init__(
        self,
        every: float,
        *,
        store: str = "sqlite",
        servers: tuple[str, ...] = (),
        settings: tuple[str, ...] = (),
        authenticate: bool = False,
    ) -> None:
        self.every = every
        self.store = store
        self.servers = servers  # host servers (MODULE:CLASS) it serves too
        self.settings = settings  # NAME=VALUE, as --set
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.restarts = 0
        self.failure: str | None = None
        self._data = tempfile.TemporaryDirectory(prefix="ctxactors-loadtest-")
        self._log = Path(self._data.name) / "serve.log"
        # With `authenticate`: the checked tenants' token, and the hostile tenant's.
        self.tokens: tuple[Bearer, Bearer] | None = None
        if authenticate:
            checked, hostile = (secrets.token_urlsafe(32) for _ in range(2))
            (Path(self._data.name) / "tokens").write_text(
                f"{checked} {CHECKED}\n{hostile} {HOSTILE}\n"
            )
            self.tokens = (Bearer(checked, CHECKED), Bearer(hostile, HOSTILE))
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._restart_forever, name="loadtest-chaos", daemon=True
        )

    def start(self) -> None:
        """Start the server; raises RuntimeError if it doesn't come up."""
        self._spawn()

    def restart_from_now(self) -> None:
        """Start the restarts: once the load test's checks before its first call are done
        (a kill between the server coming up and those checks failed the run at once)."""
        self._thread.start()

    def _spawn(self) -> None:
        command = [
            *(sys.executable, "-m", "ctxactors.cli", "serve", "--transport", "http"),
            *("--port", str(self.port), "--store", self.store),
            *("--data-dir", os.path.join(self._data.name, "data")),
            *(arg for spec in self.servers for arg in ("--server", spec)),
            *(arg for item in self.settings for arg in ("--set", item)),
        ]
        if self.tokens is not None:
            tokens = os.path.join(self._data.name, "tokens")
            command += ["--auth-tokens", tokens, "--operator", CHECKED]
        with self._log.open("ab") as log:
            self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        tail = self._log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"ctxactors serve did not come up on {self.url}:\n{tail}")

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait()

    def _restart_forever(self) -> None:
        while not self._stop.wait(self.every):
            self._kill()
            try:
                self._spawn()
            except RuntimeError as exc:
                self.failure = str(exc)  # the calls fail from here; the report says why
                return
            self.restarts += 1

    def stop_restarting(self) -> None:
        """No more restarts; the server is up when this returns. A run shorter than the
        interval gets its one restart here, so the verification always reads a restarted
        server's state."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._thread.ident is not None and self.restarts == 0 and self.failure is None:
            self._kill()
            self._spawn()
            self.restarts += 1

    def close(self) -> None:
        self.stop_restarting()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._kill()
        self._data.cleanup()
