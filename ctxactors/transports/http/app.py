"""The REST API: every tool over plain HTTP and JSON (Starlette, served by uvicorn).

For hosts that don't speak MCP. The context travels in headers, never in the body:
``X-Session-Id`` (a new one is made when absent and returned in the ``X-Session-Id`` response
header and the body), ``X-Assistant-Id``, ``X-Thread-Id``. Any ``__*`` field in a body is
dropped (`inject_context`), so a body can't pick another session.

Routes: ``GET /api/v1/tools``; ``POST /api/v1/tools/{name}`` (body: the arguments);
``GET /api/v1/sessions/{id}/context?limit=&tool_filter=``; ``DELETE /api/v1/sessions/{id}``;
``POST /api/v1/query``; ``GET /api/v1/stats`` (with authentication, for the principals of
``security.operators``: 403 for others); ``GET /healthz``; ``GET /openapi.json``.

Errors are ``{"error": {"code", "message"}}``: 400 for malformed JSON (a body that is not
UTF-8 included), invalid arguments (the message names the field) or an id that can't be a
header, 404 for an unknown tool, session or route, 413 for a body over `max_body`, 503 when
the runtime is closed, the server is shutting down or no model is configured, 504 on a call
timeout. A tool's own failure is not an HTTP error: it is a 200 with ``isError: true``, as
in MCP. Every shape is a msgspec type below, and `/openapi.json` is generated from them.

Ids travel as UTF-8 in headers (``X-Session-Id: café`` is the session ``café`` that MCP's
``_meta`` names too); an id with a control character, or with a space or tab at either end,
can't be carried by a header and is refused with 400 before anything runs, wherever it
comes from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ctxactors.logs import get_logger
from ctxactors.transports.access import LOOPBACK_ONLY, HttpSecurity
from ctxactors.transports.http import endpoints
from ctxactors.transports.http.failures import HANDLERS
from ctxactors.transports.http.middleware import BodyLimit, CountCalls
from ctxactors.transports.http.openapi import build_openapi
from ctxactors.transports.http.shapes import encode, error_response
from ctxactors.transports.http.state import ApiState
from ctxactors.transports.inflight import InFlight

# The route table: (path, endpoint, methods). A new endpoint is one line here.
API_ROUTES: tuple[tuple[str, Any, tuple[str, ...]], ...] = (
    ("/healthz", endpoints.healthz, ("GET",)),
    ("/openapi.json", endpoints.openapi_json, ("GET",)),
    ("/api/v1/tools", endpoints.list_tools, ("GET",)),
    ("/api/v1/tools/{name}", endpoints.call_tool, ("POST",)),
    ("/api/v1/sessions/{session_id}/context", endpoints.session_context, ("GET",)),
    ("/api/v1/sessions/{session_id}", endpoints.end_session, ("DELETE",)),
    ("/api/v1/query", endpoints.query, ("POST",)),
    ("/api/v1/stats", endpoints.stats, ("GET",)),
)


def create_app(
    runtime: Any,
    *,
    max_body: int = 4 * 1024 * 1024,
    routes: Sequence[BaseRoute] = (),
    lifespan: Any = None,
    model: Any = None,
    in_flight: InFlight | None = None,
    security: HttpSecurity = LOOPBACK_ONLY,
    direct_posts: Mapping[str, ASGIApp] | None = None,
) -> Starlette:
    """The REST API of `runtime` as a Starlette app.

    `routes` join the same app (the MCP endpoint at ``/mcp``), `lifespan` runs around it
    (the MCP session manager), `max_body` caps every request body (413 above it). `model`
    (a `ctxactors.conversation.ChatModel`) enables ``/api/v1/query``; without one it
    answers 503. With `in_flight`, every API request counts there until its
    response is sent, and once it drains new ones get 503. `security` guards every route,
    ``/mcp`` included: by default loopback Host names only, no cross-origin request, JSON
    POSTs only, and no authentication; with authentication, the caller's principal
    namespaces every session. A POST to a path of `direct_posts` (``/mcp``) goes through
    the same middleware straight to its app, which reads its own body (see `_Api`).
    """
    api = [Route(path, endpoint, methods=list(methods)) for path, endpoint, methods in API_ROUTES]
    # Refusals (a foreign page, no token) come first: they never count as calls.
    middleware = [*security.middleware(), Middleware(BodyLimit, max_body=max_body)]
    if in_flight is not None:
        middleware.insert(-1, Middleware(CountCalls, in_flight=in_flight))
    app = _Api(
        direct_posts or {},
        # The given routes first: ``/mcp``, the busiest, then matches without trying the API's.
        routes=[*routes, *api, *security.routes()],
        middleware=middleware,
        exception_handlers=HANDLERS,
        lifespan=lifespan,
    )
    openapi = encode(build_openapi(runtime))
    app.state.api = ApiState(
        runtime, model, openapi, get_logger("ctxactors.http"), security.operators
    )
    return app


class _Api(Starlette):
    """The app; a POST to one of the `direct` paths (``/mcp``: nearly every request of an
    MCP host) runs the app's middleware (the guard, authentication, the body cap, any added
    later) and then its endpoint, without Starlette's router and exception layers, which
    cost it as much CPU as the middleware itself. Such an endpoint reads its body before
    anything else and answers the body cap's refusal itself (`ApiError`); anything else it
    raises is answered as the exception layer would (a logged 500), then re-raised."""

    def __init__(self, direct: Mapping[str, ASGIApp], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._direct = dict(direct)
        self._direct_stacks: dict[str, ASGIApp] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            if self._direct_stacks is None:  # built once, as Starlette builds its own
                self._direct_stacks = {
                    path: self._stack(endpoint) for path, endpoint in self._direct.items()
                }
            stack = self._direct_stacks.get(scope["path"])
            if stack is not None:
                scope["app"] = self
                await stack(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _stack(self, endpoint: ASGIApp) -> ASGIApp:
        app = endpoint
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        return _Unexpected(app, self)


class _Unexpected:
    """What Starlette's outer error layer does for the direct paths: an exception is logged
    and answered with a 500 in the API's shape when no response has started, then
    re-raised for the server to log."""

    def __init__(self, app: ASGIApp, api: Starlette) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except Exception as exc:
            self.api.state.api.log.error("http_unexpected", path=scope["path"], exc_info=exc)
            refusal = error_response(500, "internal", "internal error (logged on the server)")
            try:
                await refusal(scope, receive, send)
            except RuntimeError:  # a response had started: the server closes the connection
                pass
            raise
