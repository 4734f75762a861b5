"""The MCP server: the official SDK's low-level `Server` in front of a `Runtime`.

`tools/list` publishes exactly `Runtime.list_tools()` (clean schemas, no reserved field);
`tools/call` hands the raw arguments (``__*`` fields included) and the request's ``_meta``
to `Runtime.acall`, which reads the context (`ctxactors.context.read_context`):

1. ``_meta`` (``ctxactors/sessionId``, ``ctxactors/assistantId``, ``ctxactors/threadId``,
   and the keys hosts send their own conversation ids in: `Settings.context_meta`), which
   the model can't write: when it carries any of them, it alone is the context and every
   ``__*`` argument is dropped as spoofing;
2. otherwise the ``__sessionId`` / ``__assistantId`` / ``__threadId`` arguments a host
   injected;
3. for the session only: on a stateful streamable-HTTP session its ``Mcp-Session-Id``; on
   stdio (one client) the session ``default`` (``refuse`` in `Settings.session_fallback`
   refuses such a call instead); over HTTP without an MCP session (stateless,
   protocol 2026-07-28) none, and the call is refused with an error result saying how to
   pass one, so context-less clients never share a session.

Errors follow MCP: an unknown tool (-32602, as in the specification) or a closed runtime is
a JSON-RPC error, and so is a ``tools/list`` cursor (this server never issues one);
arguments that don't fit the schema, a timeout and a tool's own failure are a result with
``isError: true`` whose text tells the model what to fix.

The SDK runs each request of a connection in its own task, and `Runtime.acall` only awaits a
future, so calls on one connection run concurrently (calls to one key still queue in that
key's actor, by design).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ctxactors._runtime import Runtime
from ctxactors.context import DEFAULT_SESSION
from ctxactors.errors import (
    CallTimeoutError,
    CtxActorsError,
    InvalidArgumentsError,
    RuntimeClosedError,
    StoreUnavailableError,
)
from ctxactors.logs import get_logger
from ctxactors.redis_url import redact
from ctxactors.results import ToolResult
from ctxactors.tracing import META_TOOL_CALL_ID, provider_installed, tool_call
from ctxactors.transports.access import HttpSecurity
from ctxactors.transports.auth import PrincipalSessionManager, SessionLimit, principal_of
from ctxactors.transports.http.shapes import ApiError, error_response
from ctxactors.transports.inflight import InFlight
from ctxactors.transports.late_stream import LateStreams, may_stream
from ctxactors.transports.stdio import MAX_LINE, stdio_transport

MCP_PATH = "/mcp"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class McpFrontend:
    """One `Runtime` served over MCP: the SDK server plus the requests in flight.

    `in_flight` counts what every transport of this server has taken and not yet answered
    (REST included when the app is built with it); it is what lets a shutdown wait for
    those answers before it stops the runtime (`drain`). Build one per runtime; it serves
    any number of connections.
    """

    def __init__(self, runtime: Runtime, *, name: str = "ctxactors") -> None:
        self.runtime = runtime
        self._log = get_logger("ctxactors.mcp")
        # The session of a stdio call that names none: `default`, or none (refused).
        refuse = runtime.settings.session_fallback == "refuse"
        self._stdio_fallback = None if refuse else DEFAULT_SESSION
        # Parsed once: the definitions never change for the runtime's lifetime.
        definitions = runtime.list_tools()
        tools = [types.Tool.model_validate(d) for d in definitions]
        self._listing = types.ListToolsResult(tools=tools).model_dump(
            by_alias=True, mode="json", exclude_none=True
        )
        self._schemas = {d["name"]: d["inputSchema"] for d in definitions}
        self.in_flight = InFlight()
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
        )
        # Plain handlers, which may return the wire form itself: the typed `on_list_tools`
        # and `on_call_tool` want models, which the SDK would only dump again.
        add = self.server.add_request_handler
        add("tools/list", types.PaginatedRequestParams, self._list_tools)
        add("tools/call", types.CallToolRequestParams, self._call_tool)
        if not provider_installed():
            # The SDK's span per request costs ~25 µs a call even when nothing records it.
            # As for the runtime's own spans, tracing is decided when the server is built.
            self.server.middleware = [
                m for m in self.server.middleware if not isinstance(m, OpenTelemetryMiddleware)
            ]

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        if params is not None and params.cursor is not None:
            raise MCPError(
                types.INVALID_PARAMS,
                f"invalid cursor {params.cursor[:100]!r}: this server lists every tool in one "
                "page and issues no cursors",
            )
        return self._listing  # the SDK copies it before adding to it

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> dict[str, Any]:
        """The ``tools/call`` result in its wire form (the SDK validates it on the way out)."""
        if self.in_flight.draining:
            raise MCPError(RuntimeClosedError.code, "the server is shutting down; no new calls")
        call_id = (params.meta or {}).get(META_TOOL_CALL_ID)
        try:
            with tool_call(call_id if isinstance(call_id, str) else None):
                result = await self.runtime.acall(
                    params.name,
                    params.arguments,
                    meta=params.meta,
                    session_fallback=session_fallback(ctx, self._stdio_fallback),
                    principal=_principal(ctx),
                )
        except (InvalidArgumentsError, CallTimeoutError) as exc:  # the message says what to fix
            result = ToolResult.error(str(exc))
        except StoreUnavailableError as exc:  # where the store is: the log's, not the tenant's
            self._log.error("store_unavailable", tool=params.name, error=redact(str(exc)))
            raise MCPError(exc.code, exc.tenant_message) from None
        except CtxActorsError as exc:  # unknown tool, runtime closed: protocol errors
            raise MCPError(exc.code, str(exc)) from None
        wire = result.to_mcp()
        wire["resultType"] = "complete"  # `CallToolResult`'s default; older versions drop it
        return wire

    async def drain(self, timeout: float) -> bool:
        """Refuse new calls and wait (up to `timeout` s) until those in flight have been
        answered (their responses written)."""
        self._log.info("draining", in_flight=self.in_flight.count)
        if await self.in_flight.drain(timeout):
            return True
        self._log.warning("drain_timeout", in_flight=self.in_flight.count, waited_s=timeout)
        return False


def _version() -> str:
    try:
        return importlib.metadata.version("ctxactors")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def session_fallback(
    ctx: ServerRequestContext[Any], stdio: str | None = DEFAULT_SESSION
) -> str | None:
    """The session of a call whose ``_meta`` and arguments name none.

    It is only a fallback: it never goes into ``_meta`` (a ``_meta`` context key would make
    the runtime drop the host's injected ``__*`` arguments). Without an HTTP request (stdio,
    one client) it is `stdio` (``default``, or None: refused); over HTTP it is the
    ``Mcp-Session-Id``, which the session manager only routes to the session that issued it,
    so it can't name a session the client doesn't hold; a stateless HTTP request has none,
    and such a call is refused.
    """
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return stdio
    value = headers.get("mcp-session-id")
    return value if isinstance(value, str) and value else None


def _principal(ctx: ServerRequestContext[Any]) -> str | None:
    """The authenticated principal of the HTTP request that carried this call, if any."""
    return principal_of(getattr(ctx.request, "scope", None))


# -- stdio -------------------------------------------------------------------------------


async def serve_stdio(
    frontend: McpFrontend, *, drain_timeout: float, max_line: int = MAX_LINE
) -> None:
    """Serve one client on stdin/stdout until end of stdin, SIGTERM or SIGINT.

    Either way, calls in flight get their answers before the server stops. The caller
    closes the runtime afterwards (which stops every actor and kills their processes).
    A line over `max_line` bytes, or one that is not a JSON-RPC message, gets a JSON-RPC
    error and the server reads on.
    """
    async with anyio.create_task_group() as tg:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    frontend._log.info("shutdown", signal=signal.Signals(signum).name)
                    await frontend.drain(drain_timeout)
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(stop_on_signal)
        async with stdio_transport(
            frontend.in_flight, on_eof=lambda: frontend.drain(drain_timeout), max_line=max_line
        ) as (read, write):
            await frontend.server.run(read, write, frontend.server.create_initialization_options())
        frontend._log.info("shutdown", reason="end of stdin")
        tg.cancel_scope.cancel()


# -- streamable HTTP ---------------------------------------------------------------------


Lifespan = Callable[[Starlette], AbstractAsyncContextManager[None]]


def session_manager(
    frontend: McpFrontend,
    *,
    host: str = "127.0.0.1",
    max_body: int = 4 * 1024 * 1024,
    security: HttpSecurity | None = None,
) -> StreamableHTTPSessionManager:
    """The SDK's streamable-HTTP session manager for `frontend` (stateful sessions).

    With `security`, it checks Host and Origin by the same rules as the app's `RequestGuard`
    and, with authentication, caps each principal's open sessions (`session_cap`). Without,
    bound to a loopback address, it checks Host and Origin (DNS-rebinding protection), as
    the SDK's own app does.
    """
    settings = security.transport_security() if security is not None else None
    if security is None and host in _LOOPBACK:
        settings = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    # JSON answers: the SDK's SSE mode costs a third of its CPU per call for a stream that
    # only a long call needs, and `LateStreams` makes that one (ctxactors sends nothing else
    # during a call).
    options: dict[str, Any] = {
        "security_settings": settings,
        "max_request_body_size": max_body,
        "json_response": True,
    }
    cap = session_cap(frontend, security)
    if cap is not None:
        return PrincipalSessionManager(frontend.server, max_sessions_per_principal=cap, **options)
    return StreamableHTTPSessionManager(frontend.server, **options)


def session_cap(frontend: McpFrontend, security: HttpSecurity | None) -> int | None:
    """How many open MCP sessions one principal may hold: the operator's
    (``--max-sessions-per-principal``), else the runtime's ``http.max_sessions_per_principal``;
    None without authentication, where callers are one tenant under the SDK's server-wide
    cap."""
    if security is None or security.verifier is None:
        return None
    explicit = security.max_sessions_per_principal
    return explicit or frontend.runtime.settings.http.max_sessions_per_principal


def mcp_parts(
    frontend: McpFrontend,
    *,
    host: str = "127.0.0.1",
    max_body: int = 4 * 1024 * 1024,
    security: HttpSecurity | None = None,
) -> tuple[Route, Lifespan]:
    """What an app needs to serve MCP: the ``/mcp`` route and the lifespan that runs its
    session manager. The route is a `Route` (a `Mount` would redirect ``/mcp`` to
    ``/mcp/``). On shutdown, calls in flight answer before the sessions close.
    """
    manager = session_manager(frontend, host=host, max_body=max_body, security=security)
    drain = frontend.runtime.call_timeout
    sdk_app: ASGIApp = StreamableHTTPASGIApp(manager)
    if isinstance(manager, PrincipalSessionManager):
        sdk_app = SessionLimit(sdk_app, manager)
    endpoint = _McpEndpoint(sdk_app, frontend, max_body)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            try:
                yield
            finally:
                await frontend.drain(drain)

    return Route(MCP_PATH, endpoint=endpoint), lifespan


class _McpEndpoint:
    """``/mcp`` around the SDK's app: hands it a POST only once the body is whole, counts
    each POST until its response is sent (so a drain waits for it), makes the answer of a
    call that runs long an SSE stream (`LateStreams`), and when the SDK accepts a client's
    DELETE of its session, ends the ctxactors session of that ``Mcp-Session-Id`` before the
    client hears back.

    The SDK opens a session for a POST without ``Mcp-Session-Id`` before it reads the body;
    read first, a body that comes slowly or never (its client left, or the server's body
    deadline closed the connection) holds no session place and reaches no SDK code."""

    def __init__(self, app: ASGIApp, frontend: McpFrontend, max_body: int) -> None:
        self.app = app
        self.frontend = frontend
        self.max_body = max_body
        self.late = LateStreams(frontend.runtime.settings.http.ping_interval)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method")
        if method == "DELETE":
            await self.app(scope, receive, self._ending(scope, send))
        elif method == "POST":  # a GET is a standing event stream, not a request to answer
            try:
                body = await _read_ahead(receive, self.max_body)
            except ApiError as exc:  # the app's body cap (as the app's exception layer would)
                await error_response(exc.status, exc.code, exc.message)(scope, receive, send)
                return
            if body is None:  # the client is gone: nobody to answer
                return
            gone = _UntilGone(send)
            streams, session = may_stream(scope["headers"])
            answer = self.late.start(gone.send, session) if streams else None
            self.frontend.in_flight.enter()
            watch = None if body[-1].get("more_body") else gone.watch(receive)
            try:
                with gone.scope:
                    await self.app(
                        scope, _replay(body, receive), gone.send if answer is None else answer.send
                    )
            finally:
                if watch is not None:
                    watch.cancel()
                self.frontend.in_flight.exit()
                if answer is not None:
                    answer.close()
        else:
            await self.app(scope, receive, send)

    def _ending(self, scope: Scope, send: Send) -> Send:
        session = Headers(scope=scope).get("mcp-session-id")
        end = functools.partial(self.frontend.runtime.end_session, principal=principal_of(scope))

        async def send_after_ending(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 200 and session:
                stopped = await anyio.to_thread.run_sync(end, session)
                self.frontend._log.info("mcp_session_deleted", session_id=session, actors=stopped)
            await send(message)

        return send_after_ending


async def _read_ahead(receive: Receive, limit: int) -> list[Message] | None:
    """A request's body messages up to its end or past `limit` bytes (the rest, if any,
    is the SDK's to read and refuse); None when the client disconnects first."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        messages.append(message)
        size += len(message.get("body", b""))
        if not message.get("more_body", False) or size > limit:
            return messages


class _UntilGone:
    """Lets a POST's handling go when its client leaves before the answer is sent.

    The call itself was handed to its key's actor and runs to its end either way; what
    goes is the request (its body, the SDK's parse of it, a late stream's pings). Kept
    until the call answered, a tenant posting big calls to a busy key and hanging up
    holds ~4x each body for up to the call timeout, however few connections it keeps:
    the SDK's SSE mode watched for the client to leave, and its JSON mode doesn't.

    One task per POST waiting on `receive` (the body is read whole, so only the client's
    leaving, or uvicorn's note that the answer is sent, can come)."""

    __slots__ = ("_send", "answered", "scope")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.answered = False  # the answer's last byte is sent: what comes after is ours
        self.scope = anyio.CancelScope()

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.answered = True  # before the send: uvicorn wakes `receive` inside it
        await self._send(message)

    def watch(self, receive: Receive) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        message = await receive()
        # A notification's handling goes on after its 202 is sent: never cut that short.
        if message["type"] == "http.disconnect" and not self.answered:
            self.scope.cancel()


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """`receive` with `messages` given first."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
