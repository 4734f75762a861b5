"""The MCP server: the official SDK's low-level `Server` in front of a `Runtime`.

`tools/list` publishes exactly `Runtime.list_tools()` (clean schemas, no reserved field);
`tools/call` hands the raw arguments (``__*`` fields included) and the request's ``_meta``
to `Runtime.acall`, which reads the context (`ctxactors.context.read_context`):

1. ``_meta`` (``ctxactors/sessionId``, ``ctxactors/assistantId``, ``ctxactors/threadId``),
   which the model can't write: when it carries any of them, it alone is the context and
   every ``__*`` argument is dropped as spoofing;
2. otherwise the ``__sessionId`` / ``__assistantId`` / ``__threadId`` arguments a host
   injected;
3. for the session only: on a stateful streamable-HTTP session its ``Mcp-Session-Id``; on
   stdio (one client) the session ``default``; over HTTP without an MCP session (stateless,
   protocol 2026-07-28) none, and the call is refused with an error result saying how to
   pass one, so context-less clients never share a session.

Errors follow MCP: an unknown tool (or a closed runtime) is a JSON-RPC error; arguments that
don't fit the schema, a timeout and a tool's own failure are a result with ``isError: true``
whose text tells the model what to fix.

The SDK runs each request of a connection in its own task, and `Runtime.acall` only awaits a
future, so calls on one connection run concurrently (calls to one key still queue in that
key's actor, by design).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.routing import Route

from ctxactors.context import DEFAULT_SESSION
from ctxactors.logs import get_logger
from ctxactors.results import (
    CallTimeoutError,
    CtxActorsError,
    InvalidArgumentsError,
    RuntimeClosedError,
    ToolResult,
)
from ctxactors.runtime import Runtime

MCP_PATH = "/mcp"
# One JSON-RPC line on stdin may be as large as the HTTP body cap allows, and then some.
_STDIN_LINE_LIMIT = 64 * 1024 * 1024
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class McpFrontend:
    """One `Runtime` served over MCP: the SDK server plus the count of calls in flight.

    The count is what lets a shutdown wait for calls already taken before it stops the
    runtime (`drain`). Build one per runtime; it serves any number of connections.
    """

    def __init__(self, runtime: Runtime, *, name: str = "ctxactors") -> None:
        self.runtime = runtime
        self._log = get_logger("ctxactors.mcp")
        # Parsed once: the definitions never change for the runtime's lifetime.
        definitions = runtime.list_tools()
        self._tools = [types.Tool.model_validate(d) for d in definitions]
        self._schemas = {d["name"]: d["inputSchema"] for d in definitions}
        self._in_flight = 0
        self._draining = False
        self.server: Server[Any] = Server(
            name,
            version=_version(),
            instructions=(
                "Tools whose state is kept per conversation. The host passes the "
                "conversation in _meta (ctxactors/sessionId) or as __sessionId arguments."
            ),
            # Without it the SDK runs (and serializes) the whole tools/list for every
            # tools/call with arguments, to check Mcp-Param headers: ~2 ms a call.
            get_tool_input_schema=self._schemas.get,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self._tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if self._draining:
            raise MCPError(RuntimeClosedError.code, "the server is shutting down; no new calls")
        fallback = session_fallback(ctx)
        self._in_flight += 1
        try:
            result = await self.runtime.acall(
                params.name, params.arguments, meta=params.meta, session_fallback=fallback
            )
        except (InvalidArgumentsError, CallTimeoutError) as exc:  # the message says what to fix
            result = ToolResult.error(str(exc))
        except CtxActorsError as exc:  # unknown tool, runtime closed: protocol errors
            raise MCPError(exc.code, str(exc)) from None
        finally:
            self._in_flight -= 1
        return types.CallToolResult.model_validate(result.to_mcp())

    async def drain(self, timeout: float) -> bool:
        """Refuse new calls and wait (up to `timeout` s) for those in flight to answer."""
        self._draining = True
        deadline = time.monotonic() + timeout
        while self._in_flight and time.monotonic() < deadline:
            await anyio.sleep(0.02)
        if self._in_flight:
            self._log.warning("drain_timeout", in_flight=self._in_flight, waited_s=timeout)
        return self._in_flight == 0


def _version() -> str:
    try:
        return importlib.metadata.version("ctxactors")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def session_fallback(ctx: ServerRequestContext[Any]) -> str | None:
    """The session of a call whose ``_meta`` and arguments name none.

    It is only a fallback: it never goes into ``_meta`` (a ``_meta`` context key would make
    the runtime drop the host's injected ``__*`` arguments). Without an HTTP request (stdio,
    one client) it is ``default``; over HTTP it is the ``Mcp-Session-Id``, which the
    session manager only routes to the session that issued it, so it can't name a session
    the client doesn't hold; a stateless HTTP request has none, and such a call is refused.
    """
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return DEFAULT_SESSION
    value = headers.get("mcp-session-id")
    return value if isinstance(value, str) and value else None


# -- stdio -------------------------------------------------------------------------------


async def serve_stdio(frontend: McpFrontend, *, drain_timeout: float) -> None:
    """Serve one client on stdin/stdout until end of stdin, SIGTERM or SIGINT.

    On a signal, calls in flight get their answers before the server stops. The caller
    closes the runtime afterwards (which stops every actor and kills their processes).
    """
    async with contextlib.AsyncExitStack() as stack:
        stdin = await stack.enter_async_context(_cancellable_stdin())
        async with anyio.create_task_group() as tg:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        frontend._log.info("shutdown", signal=signal.Signals(signum).name)
                        await frontend.drain(drain_timeout)
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(stop_on_signal)
            async with stdio_server(stdin=stdin) as (read, write):  # type: ignore[arg-type]
                await frontend.server.run(
                    read, write, frontend.server.create_initialization_options()
                )
            frontend._log.info("shutdown", reason="end of stdin")
            tg.cancel_scope.cancel()


class _Lines:
    """An async iterator of text lines over an asyncio stream reader."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


@contextlib.asynccontextmanager
async def _cancellable_stdin() -> AsyncIterator[_Lines | None]:
    """Stdin read by the event loop, so a SIGTERM can stop the server while the client
    keeps stdin open (the SDK's default reads in a worker thread, which no cancel
    interrupts). Fd 0 then points at the null device so nothing else reads the protocol.
    Yields None (the SDK's own reader) when stdin is a regular file, which asyncio can't
    watch.
    """
    loop = asyncio.get_running_loop()
    private = os.dup(0)
    reader = asyncio.StreamReader(limit=_STDIN_LINE_LIMIT)
    pipe = os.fdopen(private, "rb", buffering=0)
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
    except ValueError:  # a regular file
        pipe.close()
        yield None
        return
    devnull = os.open(os.devnull, os.O_RDONLY)
    saved = os.dup(0)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        yield _Lines(reader)
    finally:
        transport.close()
        os.dup2(saved, 0)
        os.close(saved)


# -- streamable HTTP ---------------------------------------------------------------------


Lifespan = Callable[[Starlette], AbstractAsyncContextManager[None]]


def session_manager(
    frontend: McpFrontend, *, host: str = "127.0.0.1", max_body: int = 4 * 1024 * 1024
) -> StreamableHTTPSessionManager:
    """The SDK's streamable-HTTP session manager for `frontend` (stateful sessions).

    Bound to a loopback address, it checks Host and Origin (DNS-rebinding protection), as
    the SDK's own app does; bound elsewhere, the operator chose to expose it.
    """
    security = None
    if host in _LOOPBACK:
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    return StreamableHTTPSessionManager(
        app=frontend.server, security_settings=security, max_request_body_size=max_body
    )


def mcp_parts(
    frontend: McpFrontend, *, host: str = "127.0.0.1", max_body: int = 4 * 1024 * 1024
) -> tuple[Route, Lifespan]:
    """What an app needs to serve MCP: the ``/mcp`` route and the lifespan that runs its
    session manager. The route is a `Route` (a `Mount` would redirect ``/mcp`` to
    ``/mcp/``). On shutdown, calls in flight answer before the sessions close.
    """
    manager = session_manager(frontend, host=host, max_body=max_body)
    drain = frontend.runtime.call_timeout

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            try:
                yield
            finally:
                await frontend.drain(drain)

    return Route(MCP_PATH, endpoint=StreamableHTTPASGIApp(manager)), lifespan
