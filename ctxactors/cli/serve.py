"""``ctxactors serve``: the tools over MCP on stdio (default) or streamable HTTP.

With ``--transport http`` one Starlette app serves MCP at ``/mcp`` beside the REST API;
``--model-url`` and ``--model`` give ``/api/v1/query`` an OpenAI-compatible chat model (its
key, if it needs one, comes from ``CTXACTORS_MODEL_API_KEY``, never the command line, where
other users could read it). Who may connect is `access.HttpSecurity`, built from the
``--auth-*``/``--jwt-*``/``--allow-*`` options; without authentication only a loopback
address is served (unless ``--insecure-no-auth``). What slow or many clients may hold
(deadlines for a request's headers and body, connection caps) is `connections`, from the
``http.*`` settings. On either transport, a shutdown (end of stdin, SIGTERM, Ctrl-C) lets
calls in flight answer, then closes the runtime, which stops every actor and kills the
processes they started. Logs go to stderr (or ``CTXACTORS_LOG_FILE``), never to
stdout, which is the stdio protocol channel.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette

from ctxactors import metrics, redis_access, redis_url, tracing
from ctxactors._runtime import Runtime
from ctxactors.cli import add_settings_argument, import_server, settings_from_args
from ctxactors.conversation import OpenAICompatibleModel
from ctxactors.errors import ServerDefinitionError, StoreUnavailableError
from ctxactors.logs import get_logger
from ctxactors.sandbox import SandboxUnavailableError
from ctxactors.settings import ContextRole, Settings, check_context_meta, context_meta_pair
from ctxactors.state import open_store
from ctxactors.tools import Server
from ctxactors.transports import access, connections, observe
from ctxactors.transports.guard import is_loopback
from ctxactors.transports.http import create_app
from ctxactors.transports.mcp import (
    MCP_PATH,
    McpFrontend,
    mcp_parts,
    serve_stdio,
)
from ctxactors.transports.stdio import MAX_LINE

# How long uvicorn keeps connections (say, idle SSE streams) open once calls have drained.
_HTTP_GRACE_S = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    parser.add_argument("--port", type=int, default=8765, help="HTTP port (0: any free one)")
    parser.add_argument(
        "--ttl",
        type=float,
        help="idle seconds before a key's actor leaves memory (its stored state stays; "
        "default 3600)",
    )
    parser.add_argument(
        "--store",
        default="sqlite",
        metavar="sqlite|memory|redis://...",
        help="where key state is kept: a SQLite file under --data-dir (default), Redis, "
        "or memory (ephemeral: gone with the actor or the process)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="directory of the SQLite store (default $XDG_STATE_HOME/ctxactors or "
        "~/.local/state/ctxactors)",
    )
    parser.add_argument(
        "--retention",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how long the store keeps a session after its last use",
    )
    parser.add_argument("--max-actors", type=int, help="cap on live actors (default 10,000)")
    add_settings_argument(parser)
    parser.add_argument(
        "--context-meta",
        action="append",
        type=_context_meta,
        default=[],
        metavar="KEY=ROLE",
        help="also read the MCP _meta key KEY as the call's session, assistant or thread "
        "(ROLE), after ctxactors/* and the hosts' keys read by default (repeatable; a key "
        "read already takes this ROLE)",
    )
    parser.add_argument(
        "--session-fallback",
        choices=("default", "refuse"),
        help="a stdio call that names no session: share the session 'default' (the default; "
        "the first such call logs a warning) or refuse it, as a stateless HTTP server does",
    )
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
    parser.add_argument(
        "--builtins",
        type=_builtins,
        metavar="LIST|none",
        help="the built-in servers to serve, e.g. planning,content (default: all of them); "
        "none serves only the --server ones. A server left out is neither listed nor "
        "callable; history, batch and presets are always served",
    )
    parser.add_argument(
        "--model-url",
        metavar="URL",
        help="OpenAI-compatible API root for /api/v1/query (e.g. http://localhost:11434/v1)",
    )
    parser.add_argument("--model", help="the model name to ask at --model-url")
    parser.add_argument(
        "--max-body",
        type=_positive,
        default=MAX_LINE,
        metavar="BYTES",
        help="cap on one message: an HTTP request body (413 above it) or a stdio line "
        "(a JSON-RPC error above it); default 4 MiB",
    )
    access.add_arguments(parser)
    observe.add_arguments(parser)
    ray = parser.add_argument_group("Ray backend (key actors in Ray shard actors; see docs/ray.md)")
    ray.add_argument("--backend", choices=("embedded", "ray"), default="embedded")
    ray.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to join, with its token (CTXACTORS_RAY_TOKEN_FILE); default: "
        "RAY_ADDRESS's, or one `ray start` left on this machine (only when Ray's discovery "
        "file is this user's alone), else start one with a generated token; local: always "
        "start one",
    )
    ray.add_argument("--shards", type=int, default=2, help="shard actors (first front end)")
    ray.add_argument("--ray-namespace", default="ctxactors", metavar="NAME")
    ray.add_argument(
        "--shard-resource",
        metavar="NAME",
        help="place shards only on nodes started with this custom Ray resource "
        "(ray start --resources '{\"NAME\": 100}'), e.g. to keep them off the head node",
    )


def _builtins(text: str) -> list[type[Server]]:
    from ctxactors.servers import builtins_named

    try:
        return builtins_named(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _context_meta(text: str) -> tuple[str, ContextRole]:
    try:
        return context_meta_pair(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--context-meta: ")) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive number of bytes, got {value}")
    return value


def load_server(spec: str) -> type[Server]:
    """Import ``module:Class`` and check it is a `Server` subclass."""
    try:
        return import_server(spec)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def build_runtime(args: argparse.Namespace) -> Runtime:
    from ctxactors.servers import BUILTIN

    builtin = BUILTIN if args.builtins is None else args.builtins
    extra = [load_server(s) for s in args.server]
    try:
        settings = settings_from_args(
            args,
            ttl=args.ttl,
            max_actors=args.max_actors,
            max_actors_per_principal=args.max_actors_per_principal,
            session_fallback=args.session_fallback,
        )
        if args.context_meta:  # added to the keys the settings read (a key read already
            # takes the role given here)
            check_context_meta(args.context_meta, "--context-meta")
            given = {key for key, _ in args.context_meta}
            kept = [pair for pair in settings.context_meta if pair[0] not in given]
            settings = settings.replace(
                context_meta=tuple(dict.fromkeys((*kept, *args.context_meta)))
            )
    except ValueError as exc:  # a bad CTXACTORS_* variable or --set: one line, no traceback
        raise SystemExit(f"ctxactors serve: {exc}") from None
    try:  # a Redis must turn strangers away (`ctxactors.redis_access`)
        store_spec = redis_access.prepare(args.store, settings)
    except ValueError as exc:
        raise SystemExit(f"ctxactors serve: --store: {exc}") from None
    if args.backend == "ray":
        servers = [*builtin, *(s for s in extra if s not in builtin)]
        return _ray_runtime(servers, args, settings, store_spec)
    try:
        store = open_store(store_spec, data_dir=args.data_dir, retention=args.retention)
    except ValueError as exc:
        raise SystemExit(f"--store: {redis_url.redact(str(exc))}") from None
    except StoreUnavailableError as exc:  # a damaged or unreadable file: the operator's fix
        raise SystemExit(f"ctxactors serve: {exc}") from None
    try:
        runtime = Runtime(
            [*builtin, *(s for s in extra if s not in builtin)],
            tools=args.tools,
            store=store,
            settings=settings,
        )
    # An operator's fix (no sandbox; a host server whose state can't be kept), not a traceback.
    except (SandboxUnavailableError, ServerDefinitionError) as exc:
        if store is not None:
            store.close()
        raise SystemExit(f"ctxactors serve: {exc}") from None
    return runtime


def _ray_runtime(
    servers: list[type[Server]], args: argparse.Namespace, settings: Settings, store: str
) -> Runtime:
    """A stateless front end: the shards keep the state, in the Redis of ``--store``. Ray is
    joined or started with its token authentication (`ctxactors.ray._auth`)."""
    from ctxactors.ray import RayAuthError, RayBackend
    from ctxactors.ray._command import shard_options

    try:
        backend = RayBackend(
            args.ray_address,
            shards=args.shards,
            store=store,
            namespace=args.ray_namespace,
            ttl=args.ttl,
            retention=args.retention,
            max_actors=args.max_actors,
            max_actors_per_principal=args.max_actors_per_principal,
            shard_options=shard_options(args.shard_resource),
            settings=settings,
        )
        return Runtime(servers, tools=args.tools, backend=backend, settings=settings)
    except (ValueError, ConnectionError, StoreUnavailableError, RayAuthError) as exc:
        raise SystemExit(f"--backend ray: {redis_url.redact(str(exc))}") from None


def run(args: argparse.Namespace) -> int:
    log = get_logger("ctxactors.serve", transport=args.transport)
    model = build_model(args)  # a usage error must come before anything starts
    try:
        security = access.security_from_args(args)
    except access.AuthConfigError as exc:
        print(f"ctxactors serve: {exc}", file=sys.stderr)
        return 2
    if args.tracing:  # before the runtime: it traces its calls when a provider is installed
        _start_tracing(args.transport)
    runtime = build_runtime(args)
    try:
        if args.transport == "stdio":
            frontend = McpFrontend(runtime)
            log.info("serving", tools=len(runtime.list_tools()))
            drain = runtime.call_timeout
            settle_heap()
            anyio.run(lambda: serve_stdio(frontend, drain_timeout=drain, max_line=args.max_body))
        else:
            _serve_http(runtime, args, model, security, log)
    finally:
        runtime.close()
        if runtime.store is not None:
            runtime.store.close()
        log.info("stopped")
    return 0


def settle_heap() -> None:
    """Keep what start-up made out of every later pass of CPython's cyclic garbage
    collector: ``gc.collect()``, then ``gc.freeze()``, once, before serving.

    A full pass stops every thread for as long as the heap is big, and start-up is most of
    it (the imported modules alone are about 30,000 objects, 4-15 ms a pass here): at 200
    sessions of `Runtime.acall` that pause was the whole p99 (20-36 ms against 5 ms,
    ``scripts/bench_acall.py --gc-freeze``). What start-up made lives as long as the
    process anyway; the collection first means no garbage is frozen with it. Only the
    command does this: a library never changes how its host's process collects.
    """
    gc.collect()
    gc.freeze()


def _start_tracing(transport: str) -> None:

    exporters = os.environ.get("OTEL_TRACES_EXPORTER", "")
    if transport == "stdio" and "console" in exporters:
        # The console exporter writes to standard output, the stdio protocol's channel.
        raise SystemExit(
            "ctxactors serve --tracing: OTEL_TRACES_EXPORTER=console needs --transport http"
        )
    try:
        tracing.configure_from_env()
    except RuntimeError as exc:
        raise SystemExit(f"ctxactors serve --tracing: {exc}") from None


def build_model(args: argparse.Namespace) -> OpenAICompatibleModel | None:
    """The chat model of ``/api/v1/query``, or None (the endpoint then answers 503)."""
    if bool(args.model_url) != bool(args.model):
        raise SystemExit("--model-url and --model go together: give both or neither")
    if not args.model_url:
        return None
    if args.transport != "http":
        raise SystemExit("--model-url is for /api/v1/query, which only --transport http serves")
    return OpenAICompatibleModel(
        args.model_url, args.model, os.environ.get("CTXACTORS_MODEL_API_KEY") or None
    )


def http_app(
    runtime: Runtime,
    *,
    security: access.HttpSecurity,
    model: Any = None,
    max_body: int = MAX_LINE,
    operators: frozenset[str] = frozenset(),
    principal_label: bool = False,
) -> tuple[Starlette, McpFrontend]:
    """The Starlette app (REST, MCP at ``/mcp``, ``/metrics``) and its MCP front end, whose
    drain waits for REST and MCP calls alike. `operators` and `principal_label`: see
    `ctxactors.transports.observe`."""
    security = dataclasses.replace(security, operators=operators)  # /api/v1/stats asks it
    frontend = McpFrontend(runtime)
    route, lifespan = mcp_parts(frontend, max_body=max_body, security=security)
    registry = metrics.server_registry()
    call_metrics = metrics.register(runtime, registry, principal_label=principal_label)
    app = create_app(
        runtime,
        max_body=max_body,
        routes=[route, *observe.routes(call_metrics, registry, operators)],
        lifespan=lifespan,
        model=model,
        in_flight=frontend.in_flight,
        security=security,
        direct_posts={MCP_PATH: route.endpoint},
    )
    if tracing.provider_installed():  # as the runtime: without a provider nothing is traced
        app.add_middleware(observe.TraceContextMiddleware)  # REST calls continue the trace
    return app, frontend


def _serve_http(
    runtime: Runtime, args: argparse.Namespace, model: Any, security: access.HttpSecurity, log: Any
) -> None:
    app, frontend = http_app(
        runtime,
        security=security,
        model=model,
        max_body=args.max_body,
        operators=frozenset(args.operator),
        principal_label=args.metrics_principal_label,
    )
    if security.verifier is None and not is_loopback(args.host):
        log.warning("no_authentication", host=args.host, risk="anyone who connects runs every tool")
    limits = connections.fit_to_open_files(runtime.settings.http)
    admission = connections.Admission(limits)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        lifespan="on",
        log_level="warning",
        timeout_graceful_shutdown=_HTTP_GRACE_S,
        http=connections.guarded_protocol(admission),
        ws="none",  # no route speaks WebSocket; an upgrade would leave the guarded protocol
        loop="asyncio",  # its selector loop accepts through the listener's accept (uvloop would not)
    )
    # The socket is bound here so that its accept is the guard's (`connections`).
    listener = connections.GuardedListener(tcp_socket(config.bind_socket()), admission)
    listener.set_inheritable(False)  # not into the sandboxes' processes
    server = _DrainingServer(config, frontend, runtime.call_timeout)
    log.info(
        "serving",
        host=args.host,
        port=listener.getsockname()[1],
        path="/mcp",
        auth=type(security.verifier).__name__ if security.verifier else "none",
        max_connections=limits.max_connections,
        max_connections_per_client=limits.max_connections_per_client,
        header_timeout_s=limits.header_timeout,
        body_timeout_s=limits.body_timeout,
    )
    settle_heap()
    server.run(sockets=[listener])


def tcp_socket(bound: socket.socket) -> socket.socket:
    """`bound` as a socket whose protocol says TCP, so that the connections it accepts get
    ``TCP_NODELAY``. asyncio sets it only on a socket of ``proto == IPPROTO_TCP``; uvicorn
    binds ``socket.socket(family)`` (proto 0) and the guard's accepted sockets inherit
    that, so each response's second write waited for the client's delayed ACK: 44 ms for
    any request, ``/healthz`` included, against 1 ms from uvicorn's own listener."""
    if bound.family not in (socket.AF_INET, socket.AF_INET6) or bound.proto:
        return bound
    return socket.socket(bound.family, bound.type, socket.IPPROTO_TCP, fileno=bound.detach())


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, but the first SIGTERM/SIGINT first lets REST and MCP calls in flight
    answer (their HTTP requests are still open), then starts uvicorn's own graceful shutdown; a
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
