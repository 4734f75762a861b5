"""The REST API: every tool over plain HTTP and JSON (Starlette, served by uvicorn).

For hosts that don't speak MCP. The context travels in headers, never in the body:
``X-Session-Id`` (a new one is made when absent and returned in the ``X-Session-Id`` response
header and the body), ``X-Assistant-Id``, ``X-Thread-Id``. Any ``__*`` field in a body is
dropped (`inject_context`), so a body can't pick another session.

Routes: ``GET /api/v1/tools``; ``POST /api/v1/tools/{name}`` (body: the arguments);
``GET /api/v1/sessions/{id}/context?limit=&tool_filter=``; ``DELETE /api/v1/sessions/{id}``;
``POST /api/v1/query``; ``GET /api/v1/stats``; ``GET /healthz``; ``GET /openapi.json``.

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

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

import msgspec
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ctxactors.context import MAX_ID, ToolContext, check_id, inject_context
from ctxactors.logs import get_logger
from ctxactors.results import (
    CallTimeoutError,
    CtxActorsError,
    InvalidArgumentsError,
    RuntimeClosedError,
    ToolResult,
    UnknownToolError,
)
from ctxactors.servers.history import Operation
from ctxactors.transports.access import LOOPBACK_ONLY, HttpSecurity
from ctxactors.transports.auth import principal_of
from ctxactors.transports.inflight import InFlight

MAX_LIMIT = 1_000  # above what any history keeps: a bigger limit means "everything"
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID)]
# Control characters (C0, DEL, C1) and lone surrogates: no header value can carry them.


# -- the shapes on the wire (single source of truth for responses and /openapi.json) --------


class ErrorDetail(msgspec.Struct, frozen=True):
    code: str
    message: str


class ErrorBody(msgspec.Struct, frozen=True):
    error: ErrorDetail


class ToolDefinition(msgspec.Struct, frozen=True):
    name: str
    description: str
    inputSchema: dict[str, Any]  # noqa: N815 - MCP's field name
    annotations: dict[str, Any]


class ToolList(msgspec.Struct, frozen=True):
    tools: list[ToolDefinition]


class ToolCallResponse(msgspec.Struct, frozen=True):
    """A tool's result in MCP form, plus the session it ran in."""

    session_id: str
    content: list[dict[str, Any]]
    structuredContent: dict[str, Any] | None  # noqa: N815 - MCP's field name
    isError: bool  # noqa: N815 - MCP's field name


class SessionContext(msgspec.Struct, frozen=True):
    session_id: str
    operations: list[Operation]
    count: int


class SessionEnded(msgspec.Struct, frozen=True):
    session_id: str
    actors_stopped: int


class QueryRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    query: Annotated[str, msgspec.Meta(min_length=1, max_length=100_000)]
    session_id: Id | None = None


class QueryResponse(msgspec.Struct, frozen=True):
    session_id: str
    answer: str


class Health(msgspec.Struct, frozen=True):
    status: str
    tools: int


class ApiError(Exception):
    """An HTTP error with the API's JSON body."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def _json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_encode(value), status, headers, media_type="application/json")


def _error(status: int, code: str, message: str) -> Response:
    return _json(ErrorBody(ErrorDetail(code, message)), status)


def _from_runtime_error(exc: CtxActorsError) -> ApiError:
    if isinstance(exc, UnknownToolError):
        return ApiError(404, "unknown_tool", str(exc))
    if isinstance(exc, InvalidArgumentsError):
        return ApiError(400, "invalid_arguments", str(exc))
    if isinstance(exc, CallTimeoutError):
        return ApiError(504, "timeout", str(exc))
    if isinstance(exc, RuntimeClosedError):
        return ApiError(503, "runtime_closed", str(exc))
    return ApiError(500, "runtime_error", str(exc))


def _header_id(request: Request, header: str) -> str | None:
    raw = request.headers.get(header)
    if raw is None:
        return None
    try:  # Starlette decodes header bytes as latin-1; clients send UTF-8
        value = raw.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_header", f"{header} is not valid UTF-8") from None
    return _header_safe(value, header, "invalid_header")  # length too: one id rule


def _header_safe(value: str, what: str, code: str) -> str:
    """`value` if it is an id every surface (and a response header) can carry."""
    try:
        return check_id(value, what)
    except InvalidArgumentsError as exc:
        raise ApiError(400, code, str(exc)) from None


def _as_header(value: str) -> str:
    """A header value sent as UTF-8 (Starlette encodes header strings as latin-1)."""
    return value.encode("utf-8").decode("latin-1")


def _path_id(request: Request, name: str) -> str:
    value: str = request.path_params[name]
    if len(value) > MAX_ID:
        raise ApiError(400, "invalid_path", f"{name} must be at most {MAX_ID} characters")
    return value


async def _body(request: Request) -> Any:
    """The body as a JSON object (an empty body is ``None``); `BodyLimit` enforces the cap."""
    raw = await request.body()
    if not raw.strip():
        return None
    try:
        body = _decode(raw)
    except msgspec.DecodeError as exc:
        raise ApiError(
            400, "malformed_json", f"the request body is not valid JSON: {exc}"
        ) from None
    except UnicodeDecodeError:  # msgspec's offset is within the string: find the body's
        raise ApiError(
            400, "malformed_json", f"the request body is not valid UTF-8 ({_utf8_error(raw)})"
        ) from None
    except RecursionError:
        raise ApiError(400, "malformed_json", "the request body is nested too deeply") from None
    if not isinstance(body, dict):
        kind = "null" if body is None else type(body).__name__
        raise ApiError(400, "invalid_body", f"the request body must be a JSON object, got {kind}")
    return body


def _utf8_error(raw: bytes) -> str:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"{exc.reason} at byte {exc.start}"
    return "a string is not UTF-8"


def create_app(
    runtime: Any,
    *,
    max_body: int = 4 * 1024 * 1024,
    routes: Sequence[BaseRoute] = (),
    lifespan: Any = None,
    model: Any = None,
    in_flight: InFlight | None = None,
    security: HttpSecurity = LOOPBACK_ONLY,
) -> Starlette:
    """The REST API of `runtime` as a Starlette app.

    `routes` join the same app (the MCP endpoint at ``/mcp``), `lifespan` runs around it
    (the MCP session manager), `max_body` caps every request body (413 above it). `model`
    (a `ctxactors.conversation.ChatModel`) enables ``/api/v1/query``; without one it
    answers 503. With `in_flight`, every API request counts there until its response is
    sent, and once it drains new ones get 503. `security` guards every route, ``/mcp``
    included: by default loopback Host names only, no cross-origin request, JSON POSTs
    only, and no authentication; with authentication, the caller's principal namespaces
    every session.
    """
    log = get_logger("ctxactors.http")
    openapi = _encode(build_openapi(runtime))

    async def list_tools(request: Request) -> Response:
        return Response(_encode({"tools": runtime.list_tools()}), media_type="application/json")

    async def call_tool(request: Request) -> Response:
        name: str = request.path_params["name"]
        if name not in runtime.tools:
            raise ApiError(404, "unknown_tool", f"unknown tool {name!r}")
        ctx = ToolContext(
            _header_id(request, "X-Session-Id") or uuid.uuid4().hex,
            _header_id(request, "X-Assistant-Id"),
            _header_id(request, "X-Thread-Id"),
        )
        body = await _body(request)
        principal = principal_of(request.scope)
        result: ToolResult = await runtime.acall(
            name, inject_context(body, ctx), principal=principal
        )
        response = ToolCallResponse(
            ctx.session_id, result.content, result.structured, result.is_error
        )
        return _json(response, headers={"X-Session-Id": _as_header(ctx.session_id)})

    async def session_context(request: Request) -> Response:
        session_id = _path_id(request, "session_id")
        arguments: dict[str, Any] = {"__sessionId": session_id}
        # Only what this assistant and thread could see (none given: calls made without one).
        for header, field in (("X-Assistant-Id", "__assistantId"), ("X-Thread-Id", "__threadId")):
            if (value := _header_id(request, header)) is not None:
                arguments[field] = value
        raw_limit = request.query_params.get("limit")
        if raw_limit is not None:
            try:
                arguments["limit"] = min(int(raw_limit), MAX_LIMIT)  # clamped, never refused
            except ValueError:
                raise ApiError(
                    400, "invalid_query", f"limit must be an integer, got {raw_limit!r}"
                ) from None
        filters = request.query_params.getlist("tool_filter")
        if filters:
            arguments["tool_filter"] = filters
        if "get_recent_context" not in runtime.tools:
            raise ApiError(404, "not_found", "this runtime keeps no operation history")
        principal = principal_of(request.scope)
        if not runtime.has_session(session_id, principal=principal):
            raise ApiError(404, "unknown_session", f"session {session_id!r} has no live state")
        result: ToolResult = await runtime.acall(
            "get_recent_context", arguments, principal=principal
        )
        if result.is_error or result.structured is None:
            raise ApiError(500, "history_failed", result.text)
        return _json(SessionContext(session_id, **_operations(result.structured)))

    async def end_session(request: Request) -> Response:
        session_id = _path_id(request, "session_id")
        principal = principal_of(request.scope)
        stopped = await run_in_threadpool(runtime.end_session, session_id, principal=principal)
        if stopped == 0:
            raise ApiError(404, "unknown_session", f"session {session_id!r} has no live state")
        log.info("session_ended_over_http", session_id=session_id, actors=stopped)
        return _json(SessionEnded(session_id, stopped))

    async def query(request: Request) -> Response:
        if model is None:
            raise ApiError(
                503,
                "no_model",
                "no chat model is configured on this server, so /api/v1/query can't run; "
                "call tools directly with POST /api/v1/tools/{name}",
            )
        try:
            req = msgspec.convert(await _body(request), QueryRequest, strict=True)
        except msgspec.ValidationError as exc:
            raise ApiError(400, "invalid_request", f"invalid query request: {exc}") from None
        if req.session_id is not None:  # it goes back in a header once the model has run
            _header_safe(req.session_id, "session_id", "invalid_request")
        header = _header_id(request, "X-Session-Id")  # checked even when the body names one
        session_id = req.session_id or header or uuid.uuid4().hex
        answer = await _ask(runtime, model, req.query, session_id, request)
        return _json(
            QueryResponse(session_id, answer), headers={"X-Session-Id": _as_header(session_id)}
        )

    async def stats(request: Request) -> Response:
        return _json(runtime.stats())

    async def healthz(request: Request) -> Response:
        closed = runtime.registry.closed
        return _json(
            Health("closed" if closed else "ok", len(runtime.tools)), 503 if closed else 200
        )

    async def openapi_json(request: Request) -> Response:
        return Response(openapi, media_type="application/json")

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        if exc.status >= 500:
            log.error("http_error", path=request.url.path, code=exc.code, error=exc.message)
        return _error(exc.status, exc.code, exc.message)

    async def runtime_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, CtxActorsError)
        return await api_error(request, _from_runtime_error(exc))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        message = (
            f"no route {request.method} {request.url.path}"
            if exc.status_code in (404, 405)
            else str(exc.detail)
        )
        return _error(exc.status_code, code, message)

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.error("http_unexpected", path=request.url.path, error=f"{type(exc).__name__}: {exc}")
        return _error(500, "internal", "internal error (logged on the server)")

    api: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        Route("/api/v1/tools", list_tools, methods=["GET"]),
        Route("/api/v1/tools/{name}", call_tool, methods=["POST"]),
        Route("/api/v1/sessions/{session_id}/context", session_context, methods=["GET"]),
        Route("/api/v1/sessions/{session_id}", end_session, methods=["DELETE"]),
        Route("/api/v1/query", query, methods=["POST"]),
        Route("/api/v1/stats", stats, methods=["GET"]),
    ]
    handlers: dict[Any, Callable[..., Any]] = {
        ApiError: api_error,
        CtxActorsError: runtime_error,
        HTTPException: http_error,
        Exception: unexpected,
    }
    # Refusals (a foreign page, no token) come first: they never count as calls.
    middleware = [*security.middleware(), Middleware(BodyLimit, max_body=max_body)]
    if in_flight is not None:
        middleware.insert(-1, Middleware(CountCalls, in_flight=in_flight))
    return Starlette(
        routes=[*api, *routes, *security.routes()],
        middleware=middleware,
        exception_handlers=handlers,
        lifespan=lifespan,
    )


class CountCalls:
    """Counts each ``/api/`` request in `in_flight` until its response has been sent, so a
    shutdown lets REST calls in flight answer as it does MCP calls; once draining, new ones
    get a 503 in the API's JSON shape."""

    def __init__(self, app: ASGIApp, in_flight: InFlight) -> None:
        self.app = app
        self.in_flight = in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        if self.in_flight.draining:
            refusal = _error(503, "shutting_down", "the server is shutting down; no new calls")
            await refusal(scope, receive, send)
            return
        self.in_flight.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight.exit()


class BodyLimit:
    """Caps request bodies at `max_body` bytes: a 413 in the API's JSON shape, whether the
    client declared a Content-Length (refused before reading) or streams the body (refused
    once the count passes the cap, so an endless body never fills memory)."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    def _too_large(self) -> ApiError:
        return ApiError(
            413, "body_too_large", f"the request body is over the {self.max_body}-byte limit"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            exc = self._too_large()
            await _error(exc.status, exc.code, exc.message)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise self._too_large()
            return message

        await self.app(scope, counted, send)


def _operations(structured: dict[str, Any]) -> dict[str, Any]:
    ops = msgspec.convert(structured["operations"], list[Operation])
    return {"operations": ops, "count": len(ops)}


async def _ask(runtime: Any, model: Any, text: str, session_id: str, request: Request) -> str:
    """One turn of the agent loop for this session (tools run in the caller's context)."""
    from ctxactors.conversation import ChatSession, ModelError

    chat = ChatSession(
        _AsPrincipal(runtime, principal_of(request.scope)),
        model,
        session_id=session_id,
        assistant_id=_header_id(request, "X-Assistant-Id"),
        thread_id=_header_id(request, "X-Thread-Id"),
    )
    try:
        return await chat.asend(text)
    except ModelError as exc:
        raise ApiError(502, "model_error", f"the chat model failed: {exc}") from None


class _AsPrincipal:
    """`runtime` as one principal's chat session sees it: every call carries the principal."""

    def __init__(self, runtime: Any, principal: str | None) -> None:
        self._runtime = runtime
        self._principal = principal

    def list_tools(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = self._runtime.list_tools()
        return tools

    def call(self, tool: str, arguments: Mapping[str, Any] | str | None = None) -> ToolResult:
        result: ToolResult = self._runtime.call(tool, arguments, principal=self._principal)
        return result

    async def acall(
        self, tool: str, arguments: Mapping[str, Any] | str | None = None
    ) -> ToolResult:
        result: ToolResult = await self._runtime.acall(tool, arguments, principal=self._principal)
        return result


# -- /openapi.json ---------------------------------------------------------------------------

_REF = "#/components/schemas/{name}"
_ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_ID}
_CONTEXT_HEADERS = [
    {"name": header, "in": "header", "required": False, "schema": _ID_SCHEMA, "description": what}
    for header, what in (
        ("X-Session-Id", "the conversation; a new one is made when absent"),
        ("X-Assistant-Id", "the assistant calling"),
        ("X-Thread-Id", "the thread within the conversation"),
    )
]
_SESSION_PATH = {"name": "session_id", "in": "path", "required": True, "schema": _ID_SCHEMA}


def build_openapi(runtime: Any) -> dict[str, Any]:
    """The OpenAPI 3.1 document: response shapes from the msgspec types above, and one path
    per tool whose request body is that tool's own ``inputSchema``."""
    types: tuple[type[msgspec.Struct], ...] = (ErrorBody, ToolList, ToolCallResponse, Health)
    types += (SessionContext, SessionEnded, QueryRequest, QueryResponse)
    refs, components = msgspec.json.schema_components((*types, dict[str, int]), ref_template=_REF)
    ref = dict(zip((t.__name__ for t in types), refs, strict=False))
    stats_schema = refs[-1]

    def body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
        return {"required": required, "content": {"application/json": {"schema": schema}}}

    def answers(ok: dict[str, Any], *errors: int, headers: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"200": {"description": "OK", **body(ok)}}
        out["200"].pop("required")
        if headers:
            out["200"]["headers"] = {"X-Session-Id": {"schema": {"type": "string"}}}
        for status in errors:
            out[str(status)] = {"description": _STATUS_TEXT[status], **body(ref["ErrorBody"])}
            out[str(status)].pop("required")
        return out

    paths: dict[str, Any] = {
        "/healthz": {"get": {"operationId": "healthz", "responses": answers(ref["Health"], 503)}},
        "/api/v1/tools": {
            "get": {"operationId": "list_tools", "responses": answers(ref["ToolList"])}
        },
        "/api/v1/sessions/{session_id}/context": {
            "get": {
                "operationId": "session_context",
                "summary": "A session's recent operations, newest first",
                "parameters": [
                    _SESSION_PATH,
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1},
                    },
                    {
                        "name": "tool_filter",
                        "in": "query",
                        "required": False,
                        "explode": True,
                        "schema": {
                            "type": "array",
                            "items": {"type": "string", "minLength": 1, "maxLength": 200},
                        },
                    },
                ],
                "responses": answers(ref["SessionContext"], 400, 404),
            }
        },
        "/api/v1/sessions/{session_id}": {
            "delete": {
                "operationId": "end_session",
                "summary": "End a session: stop its actors and drop its state",
                "parameters": [_SESSION_PATH],
                "responses": answers(ref["SessionEnded"], 400, 404),
            }
        },
        "/api/v1/query": {
            "post": {
                "operationId": "query",
                "summary": "Run the agent loop once (needs a configured model)",
                "parameters": _CONTEXT_HEADERS,
                "requestBody": body(ref["QueryRequest"]),
                "responses": answers(ref["QueryResponse"], 400, 413, 415, 502, 503, headers=True),
            }
        },
        "/api/v1/stats": {"get": {"operationId": "stats", "responses": answers(stats_schema)}},
    }
    for spec in runtime.tools.values():
        schema = _hoist_defs(spec.input_schema, spec.name, components)
        paths[f"/api/v1/tools/{spec.name}"] = {
            "post": {
                "operationId": f"call_{spec.name}",
                "summary": spec.description.split("\n", 1)[0],
                "description": spec.description,
                "parameters": _CONTEXT_HEADERS,
                "requestBody": body(schema, required=False),
                "responses": answers(
                    ref["ToolCallResponse"], 400, 413, 415, 503, 504, headers=True
                ),
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "ctxactors REST API", "version": "1"},
        "paths": paths,
        "components": {"schemas": components},
    }


_STATUS_TEXT = {
    400: "Malformed JSON or invalid arguments (the message names the field)",
    404: "Unknown tool or session",
    413: "Request body over the size limit",
    415: "A POST without Content-Type: application/json",
    502: "The chat model failed",
    503: "The runtime is closed, the server is shutting down or no model is configured",
    504: "The tool did not answer in time",
}


def _hoist_defs(schema: dict[str, Any], prefix: str, components: dict[str, Any]) -> Any:
    """A tool schema with its ``$defs`` moved into the components (``#/$defs/X`` only
    resolves against the document root in OpenAPI), names prefixed by the tool's."""
    local = schema.get("$defs", {})

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: rewrite(v) for k, v in node.items() if k != "$defs"}
            target = out.get("$ref")
            if isinstance(target, str) and target.startswith("#/$defs/"):
                out["$ref"] = _REF.format(name=f"{prefix}.{target[len('#/$defs/') :]}")
            return out
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    for name, definition in local.items():
        components[f"{prefix}.{name}"] = rewrite(definition)
    return rewrite(schema)
