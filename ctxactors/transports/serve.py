"""``ctxactors serve``: the tools over MCP on stdio (default) or streamable HTTP.

With ``--transport http`` one Starlette app serves MCP at ``/mcp`` beside the REST API (when
`ctxactors.transports.http` is installed). Either way, a shutdown (end of stdin, SIGTERM,
Ctrl-C) lets calls in flight answer, then closes the runtime, which stops every actor and
kills the processes they started. Logs go to stderr (or ``CTXACTORS_LOG_FILE``), never to
stdout, which is the stdio protocol channel.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
from types import FrameType
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette

from ctxactors.logs import get_logger
from ctxactors.runtime import Runtime
from ctxactors.tools import Server
from ctxactors.transports.mcp import (
    McpFrontend,
    mcp_app,
    mcp_parts,
    serve_stdio,
)

# How long uvicorn keeps connections (say, idle SSE streams) open once calls have drained.
_HTTP_GRACE_S = 3
_MAX_BODY = 4 * 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    parser.add_argument("--port", type=int, default=8765, help="HTTP port (0: any free one)")
    parser.add_argument(
        "--ttl", type=float, default=3600.0, help="idle seconds before a key's state is dropped"
    )
    parser.add_argument("--max-actors", type=int, default=10_000, help="cap on live actors")
    parser.add_argument(
        "--tools",
        choices=("all", "unified"),
        default="all",
        help="list every tool, or only the batch and preset tools (all stay callable)",
    )
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="MODULE:CLASS",
        help="add a tool server class to the built-in ones (repeatable)",
    )


def load_server(spec: str) -> type[Server]:
    """Import ``module:Class`` and check it is a `Server` subclass."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"--server {spec!r}: expected MODULE:CLASS")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"--server {spec!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Server)):
        raise SystemExit(f"--server {spec!r}: not a ctxactors.Server subclass")
    return cls


def build_runtime(args: argparse.Namespace) -> Runtime:
    from ctxactors.servers import BUILTIN

    extra = [load_server(s) for s in args.server]
    return Runtime(
        [*BUILTIN, *(s for s in extra if s not in BUILTIN)],
        ttl=args.ttl,
        max_actors=args.max_actors,
        tools=args.tools,
    )


def run(args: argparse.Namespace) -> int:
    log = get_logger("ctxactors.serve", transport=args.transport)
    runtime = build_runtime(args)
    try:
        if args.transport == "stdio":
            frontend = McpFrontend(runtime)
            log.info("serving", tools=len(runtime.list_tools()))
            anyio.run(lambda: serve_stdio(frontend, drain_timeout=runtime.call_timeout))
        else:
            _serve_http(runtime, args, log)
    finally:
        runtime.close()
        log.info("stopped")
    return 0


def http_app(runtime: Runtime, *, host: str) -> tuple[Starlette, McpFrontend]:
    """The Starlette app (REST + ``/mcp``, or ``/mcp`` alone) and its MCP front end."""
    frontend = McpFrontend(runtime)
    try:
        from ctxactors.transports.http import create_app
    except ModuleNotFoundError as exc:
        if exc.name != "ctxactors.transports.http":
            raise
        return mcp_app(frontend, host=host, max_body=_MAX_BODY), frontend
    route, lifespan = mcp_parts(frontend, host=host, max_body=_MAX_BODY)
    return create_app(runtime, max_body=_MAX_BODY, routes=[route], lifespan=lifespan), frontend


def _serve_http(runtime: Runtime, args: argparse.Namespace, log: Any) -> None:
    app, frontend = http_app(runtime, host=args.host)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        lifespan="on",
        log_level="warning",
        timeout_graceful_shutdown=_HTTP_GRACE_S,
    )
    server = _DrainingServer(config, frontend, runtime.call_timeout)
    log.info("serving", host=args.host, port=args.port, path="/mcp")
    server.run()


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, but the first SIGTERM/SIGINT first lets MCP calls in flight answer
    (their HTTP requests are still open), then starts uvicorn's own graceful shutdown; a
    second signal forces the exit.

    The signal is not recorded as uvicorn's own handler would, because uvicorn re-raises
    recorded signals once it has stopped, which would kill the process before `run` closes
    the runtime (and with it the actors' child processes).
    """

    def __init__(self, config: uvicorn.Config, frontend: McpFrontend, drain: float) -> None:
        super().__init__(config)
        self._frontend = frontend
        self._drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._task: asyncio.Task[None] | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self._loop is None:
            self.should_exit = self.force_exit = True
            return
        self._draining = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        async def drain_then_exit() -> None:
            await self._frontend.drain(self._drain)
            self.should_exit = True

        assert self._loop is not None
        self._task = self._loop.create_task(drain_then_exit())
