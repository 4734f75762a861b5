"""``ctxactors serve --transport http`` inside the test process, wired as `serve` wires it.

The subprocess tests (`mcp_support.http_server`) check the real command, but mutation
testing (scripts/mutation.py) sees only code that runs in the test process, so none of
the access checks and the connection guard they drive is reached there. `serve_in_process`
builds the same thing from the same options: `access.security_from_args`,
`serve.build_runtime`, `serve.http_app`, `connections.fit_to_open_files`, an `Admission`,
uvicorn with `connections.guarded_protocol` and a `GuardedListener` (as
`serve._serve_http` does), and runs it in a thread.

Its loop is a `SkippingLoop`: a test stops the loop's clock (`SkippingLoop.frozen`) and
moves it ahead, so the guard's deadlines (``loop.call_later``) fire after exactly the
configured time, without waiting for it, and never sooner however loaded the machine is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import uvicorn

from ctxactors._runtime import Runtime
from ctxactors.cli import serve
from ctxactors.settings import HttpSettings
from ctxactors.testing import wait_until
from ctxactors.transports import access, connections

WAIT = 30.0  # generous: the machine is shared and loaded; a condition, never a deadline


class SkippingLoop(asyncio.SelectorEventLoop):
    """A selector loop (uvicorn's ``loop="asyncio"``) whose clock a test can move ahead, and
    stop: while `frozen`, real time does not move it, only `skip` does."""

    def __init__(self) -> None:
        super().__init__()
        self._skipped = 0.0
        self._frozen_at: float | None = None  # the real clock when frozen; None: it flows

    def _real(self) -> float:
        return super().time()

    def time(self) -> float:
        real = self._real() if self._frozen_at is None else self._frozen_at
        return real + self._skipped

    def _on_loop(self, change: Callable[[], None]) -> None:
        """Run `change` on the loop's thread (the only one that reads the clock), then let
        the loop handle every timer that fell due and what it scheduled at once (a
        transport's close)."""

        async def run() -> None:
            change()
            for _ in range(3):  # due timers run on the next turn, their call_soon on the one after
                await asyncio.sleep(0)

        asyncio.run_coroutine_threadsafe(run(), self).result(WAIT)

    def skip(self, seconds: float) -> None:
        """Move the clock `seconds` ahead, from the test's thread; returns once every timer
        that fell due has run, and what it scheduled at once too."""

        def ahead() -> None:
            self._skipped += seconds

        self._on_loop(ahead)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Within the block the clock moves only by `skip`: however long the machine takes
        between two steps of a test, no deadline comes closer. Timers that need real time
        to pass (uvicorn's 0.1 s tick that notices `should_exit`, its graceful shutdown,
        the late-stream pings) wait, so the server is stopped only after the block, where the clock flows again
        on from where it stood (no jump: no deadline fires for the time it was frozen)."""

        def freeze() -> None:
            assert self._frozen_at is None, "frozen already"
            self._frozen_at = self._real()

        def thaw() -> None:
            assert self._frozen_at is not None
            self._skipped += self._frozen_at - self._real()
            self._frozen_at = None

        self._on_loop(freeze)
        try:
            yield
        finally:
            self._on_loop(thaw)

    def timers(self) -> list[asyncio.TimerHandle]:
        """The timers the loop holds now, not cancelled (read on the loop's thread)."""

        async def read() -> list[asyncio.TimerHandle]:
            scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
            return [t for t in scheduled if not t.cancelled()]

        return asyncio.run_coroutine_threadsafe(read(), self).result(WAIT)

    def settle(self) -> None:
        """Return once the loop has handled what is pending now (no time passes)."""
        self.skip(0.0)


@dataclass(frozen=True)
class Served:
    url: str  # http://127.0.0.1:PORT
    port: int
    runtime: Runtime
    limits: HttpSettings  # as fitted to the open-file limit
    admission: connections.Admission
    loop: SkippingLoop

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        """A raw connection from `source` (any 127.0.0.0/8 address is this machine)."""
        sock = socket.socket()
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", self.port))
        return sock


def parse_serve_args(*argv: str) -> argparse.Namespace:
    """``ctxactors serve --transport http`` options: a free port, memory store, the planning
    server and `mcp_support.Gate` (no sandbox needed), then `argv` (which may override them)."""
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    defaults = ["--transport", "http", "--port", "0", "--store", "memory"]
    defaults += ["--builtins", "planning", "--server", "mcp_support:Gate"]
    return parser.parse_args([*defaults, *argv])


@contextlib.contextmanager
def serve_in_process(*argv: str, keep_alive: float = 5.0) -> Iterator[Served]:
    """The server `argv` asks for (see `parse_serve_args`), serving until the block ends.
    `keep_alive` is uvicorn's idle keep-alive timeout (serve keeps uvicorn's 5 s); a test
    that moves the clock past it raises it, so that only the guard's deadlines fire."""
    args = parse_serve_args(*argv)
    security = access.security_from_args(args)
    runtime = serve.build_runtime(args)
    try:
        app, _frontend = serve.http_app(
            runtime,
            security=security,
            max_body=args.max_body,
            operators=frozenset(args.operator),
            principal_label=args.metrics_principal_label,
        )
        limits = connections.fit_to_open_files(runtime.settings.http)
        admission = connections.Admission(limits)
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            lifespan="on",
            log_level="warning",
            timeout_keep_alive=int(keep_alive),
            timeout_graceful_shutdown=3,
            http=connections.guarded_protocol(admission),
            ws="none",
            loop="asyncio",
        )
        listener = connections.GuardedListener(config.bind_socket(), admission)
        listener.set_inheritable(False)
        server = uvicorn.Server(config)
        loop = SkippingLoop()

        def run() -> None:
            with asyncio.Runner(loop_factory=lambda: loop) as runner:
                runner.run(server.serve(sockets=[listener]))

        thread = threading.Thread(target=run, name="serve-in-process", daemon=True)
        thread.start()
        try:
            wait_until(lambda: server.started or not thread.is_alive(), WAIT)
            if not server.started:
                raise RuntimeError("uvicorn stopped before it started serving (see its log)")
            port = listener.getsockname()[1]
            yield Served(f"http://127.0.0.1:{port}", port, runtime, limits, admission, loop)
        finally:
            server.should_exit = True
            thread.join(WAIT)
            listener.close()
    finally:
        runtime.close()


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends on `sock` until it closes the connection (a reset ends
    it too), waiting up to `WAIT` for each part."""
    sock.settimeout(WAIT)
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


def pending(sock: socket.socket) -> bytes | None:
    """What the server has sent on `sock` so far without closing it, or None once closed."""
    sock.setblocking(False)
    received = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            received += chunk
    except BlockingIOError:
        return received
    except ConnectionResetError:
        return None
    finally:
        sock.setblocking(True)
