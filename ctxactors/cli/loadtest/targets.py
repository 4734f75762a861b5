"""Where the load test sends its calls: the embedded runtime, a REST server or an MCP server.

Each target turns one planned call into an `Outcome` (MCP's structured content and error
flag), or raises; the driver counts what it raised by kind. The context always travels the
way a real host sends it: `inject_context` in process, ``X-Session-Id``-style headers over
REST, and ``_meta`` over MCP.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import httpx
from mcp.shared.exceptions import MCPError

from ctxactors._runtime import Runtime
from ctxactors.cli.loadtest.options import LoadOptions
from ctxactors.cli.loadtest.workload import Outcome
from ctxactors.cli.main import import_server
from ctxactors.cli.token import TOKEN_ENV, Bearer
from ctxactors.context import META_KEYS, ToolContext, inject_context
from ctxactors.errors import ShardUnavailableError
from ctxactors.results import ToolResult
from ctxactors.servers import BUILTIN
from ctxactors.settings import Settings
from ctxactors.tools import Server


class TransportError(Exception):
    """A reply that is not a tool result (an HTTP error status, say); `kind` groups it."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class InDoubtError(TransportError):
    """The server said the call may or may not have run and may be sent again: a Ray shard
    died during it (`ShardUnavailableError`: REST 503 ``shard_unavailable``, MCP -32013)."""

    KIND = "shard unavailable (in doubt)"

    def __init__(self, detail: str) -> None:
        super().__init__(self.KIND, detail)


class Target(Protocol):
    description: str

    def call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> Outcome: ...

    async def acall(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> Outcome: ...

    def stats(self) -> dict[str, int] | None: ...

    async def aopen(self) -> None: ...

    async def aclose(self) -> None: ...

    def close(self) -> None: ...


def _from_result(result: ToolResult) -> Outcome:
    return Outcome(result.structured, result.is_error, result.text)


class EmbeddedTarget:
    """A `Runtime` in this process, with the built-in servers and the `servers` given."""

    def __init__(
        self,
        *,
        ttl: float,
        max_actors: int,
        call_timeout: float,
        settings: Settings | None = None,
        servers: Iterable[type[Server]] = (),
    ) -> None:
        self.runtime = Runtime(
            [*BUILTIN, *servers],
            ttl=ttl,
            max_actors=max_actors,
            call_timeout=call_timeout,
            settings=settings,
        )
        self.description = f"embedded runtime (ttl {ttl:g} s, max_actors {max_actors})"

    def call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> Outcome:
        return _from_result(self.runtime.call(tool, inject_context(args, ctx)))

    async def acall(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> Outcome:
        return _from_result(await self.runtime.acall(tool, inject_context(args, ctx)))

    def stats(self) -> dict[str, int] | None:
        return self.runtime.stats()

    async def aopen(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def close(self) -> None:
        self.runtime.close()


def _headers(ctx: ToolContext) -> dict[str, str]:
    headers = {"X-Session-Id": ctx.session_id}
    if ctx.assistant_id is not None:
        headers["X-Assistant-Id"] = ctx.assistant_id
    if ctx.thread_id is not None:
        headers["X-Thread-Id"] = ctx.thread_id
    return headers


def _from_http(response: httpx.Response) -> Outcome:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and ("isError" in body or "structuredContent" in body):
        text = "\n".join(
            b.get("text", "") for b in body.get("content") or [] if isinstance(b, dict)
        )
        return Outcome(body.get("structuredContent"), bool(body.get("isError")), text)
    error = body.get("error") if isinstance(body, dict) else None
    if response.status_code == 503 and isinstance(error, dict):
        if error.get("code") == "shard_unavailable":
            raise InDoubtError(str(error.get("message"))[:200])
    raise TransportError(f"HTTP {response.status_code}", response.text[:200])


class RestTarget:
    """A running ``ctxactors serve``: ``POST {url}/api/v1/tools/{name}`` with context headers."""

    def __init__(
        self, url: str, *, timeout: float, connections: int, token: Bearer | None = None
    ) -> None:
        self.base = url.rstrip("/")
        self.description = f"REST API at {self.base}"
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self._timeout = timeout
        self._limits = limits
        self._auth = token.headers() if token else {}
        self._client = httpx.Client(timeout=timeout, limits=limits, headers=self._auth)
        self._aclient: httpx.AsyncClient | None = None

    def call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> Outcome:
        url = f"{self.base}/api/v1/tools/{tool}"
        return _from_http(self._client.post(url, json=args, headers=_headers(ctx)))

    async def acall(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> Outcome:
        if self._aclient is None:  # created on the loop that uses it
            self._aclient = httpx.AsyncClient(
                timeout=self._timeout, limits=self._limits, headers=self._auth
            )
        url = f"{self.base}/api/v1/tools/{tool}"
        return _from_http(await self._aclient.post(url, json=args, headers=_headers(ctx)))

    def stats(self) -> dict[str, int] | None:
        """The server's runtime stats, if it publishes them (else None)."""
        return published_stats(self._client.get, self.base)

    async def aopen(self) -> None:
        pass

    async def aclose(self) -> None:
        """Close the async client on the loop that made it."""
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient = None

    def close(self) -> None:
        self._client.close()


class McpTarget:
    """A streamable-HTTP MCP endpoint, through the official SDK client (async only).

    One client connection carries every session: the context rides in each call's ``_meta``
    under the ``ctxactors/`` keys, as a host that multiplexes conversations would send it.
    `url` may also be an in-process MCP server object (the SDK's ``Client`` accepts both).
    """

    def __init__(self, url: Any, *, timeout: float, token: Bearer | None = None) -> None:
        self.url = url
        self.description = f"MCP (streamable HTTP) at {url}" if isinstance(url, str) else "MCP"
        self._timeout = timeout
        self._auth = token.headers() if token else {}
        self._client: Any = None
        self._http: Any = None

    async def aopen(self) -> None:
        """Connect; call it from the task that will call `aclose` (anyio's cancel scopes)."""
        from mcp import Client

        server = self.url
        if self._auth and isinstance(server, str):
            # The SDK's way to send headers: an httpx2 client of ours (its default timeouts:
            # 30 s, 300 s to read a stream), which we close.
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            timeout = httpx2.Timeout(30.0, read=300.0)
            self._http = httpx2.AsyncClient(headers=self._auth, timeout=timeout)
            server = streamable_http_client(server, http_client=self._http)
        client = Client(server, read_timeout_seconds=self._timeout)
        await client.__aenter__()
        self._client = client

    def call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> Outcome:
        raise TransportError("unsupported", "the MCP target runs with --async only")

    async def acall(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> Outcome:
        client = self._client
        if client is None:
            raise TransportError("not connected", "McpTarget.aopen() was not awaited")
        meta = {META_KEYS["session_id"]: ctx.session_id}
        if ctx.assistant_id is not None:
            meta[META_KEYS["assistant_id"]] = ctx.assistant_id
        if ctx.thread_id is not None:
            meta[META_KEYS["thread_id"]] = ctx.thread_id
        try:
            result = await client.call_tool(tool, args, meta=meta)
        except MCPError as exc:
            if exc.code == ShardUnavailableError.code:
                raise InDoubtError(exc.message[:200]) from None
            raise
        text = "\n".join(getattr(b, "text", "") for b in result.content or [])
        return Outcome(result.structured_content, bool(result.is_error), text)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.__aexit__(None, None, None)
            self._client = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def stats(self) -> dict[str, int] | None:
        """The runtime stats of a ``ctxactors serve`` app (REST beside ``/mcp``), if any."""
        if not isinstance(self.url, str):
            return None
        base = self.url.rstrip("/").removesuffix("/mcp")
        get = functools.partial(httpx.get, timeout=self._timeout, headers=self._auth)
        return published_stats(get, base)

    def close(self) -> None:
        pass


def published_stats(get: Callable[[str], httpx.Response], base: str) -> dict[str, int] | None:
    """``GET base/api/v1/stats`` as a dict, or None when the server doesn't publish it."""
    try:
        response = get(f"{base}/api/v1/stats")
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def reachable(url: str, timeout: float = 5.0) -> None:
    """Raise ValueError, saying why, if nothing answers HTTP at `url` (any status will do).

    Checked once up front so that a wrong URL is one clear line, not thousands of failed
    calls or a client library's traceback.
    """
    try:
        httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot reach {url}: {exc or type(exc).__name__}") from None


def authorized(url: str, token: Bearer | None, timeout: float = 5.0) -> None:
    """Raise ValueError when the server at `url` refuses `token` (or the lack of one): one
    clear line, not a run of thousands of 401s. Asked of ``/api/v1/stats``: only a 401 is
    a refusal (a 403 says the token is good but no operator's, a 404 that none is served)."""
    refused_by(
        url, token, timeout, "the bearer token", f"put a valid one in {TOKEN_ENV} or --token-file"
    )


def refused_by(url: str, token: Bearer | None, timeout: float, whose: str, fix: str) -> None:
    """ValueError, in one line, when ``/api/v1/stats`` of the server at `url` answers 401 to
    `token` (`whose` names it in the message, `fix` says what to do)."""
    base = url.rstrip("/").removesuffix("/mcp")
    try:
        response = httpx.get(
            f"{base}/api/v1/stats", timeout=timeout, headers=token.headers() if token else {}
        )
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot reach {url}: {exc or type(exc).__name__}") from None
    if response.status_code == 401:
        what = f"refused {whose}" if token else "asks for a bearer token"
        raise ValueError(f"{base} {what} (HTTP 401): {fix}")


def make_target(options: LoadOptions) -> Target:
    """The target the options ask for."""
    if not options.url:
        return EmbeddedTarget(
            ttl=options.ttl,
            max_actors=options.max_actors,
            call_timeout=options.call_timeout,
            settings=options.settings,
            servers=[import_server(spec) for spec in options.servers],
        )
    reachable(options.url)
    authorized(options.url, options.token)
    if options.transport == "mcp":
        return McpTarget(options.url, timeout=options.call_timeout, token=options.token)
    connections = max(options.workers, 8)
    return RestTarget(
        options.url, timeout=options.call_timeout, connections=connections, token=options.token
    )
