"""The REST API's endpoints: module functions that find the runtime on the app.

Each reads what it shares with the others from ``request.app.state.api`` (an `ApiState`),
so any one of them can be mounted on a bare Starlette app and tested alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ctxactors.context import ToolContext, inject_context
from ctxactors.history_store import KEY as HISTORY_KEY
from ctxactors.results import ToolResult
from ctxactors.servers.history import OperationRecord
from ctxactors.transports.auth import is_operator, principal_of
from ctxactors.transports.http.reading import (
    as_header,
    header_id,
    header_safe,
    json_body,
    path_id,
)
from ctxactors.transports.http.shapes import (
    ApiError,
    Health,
    QueryRequest,
    QueryResponse,
    SessionContext,
    SessionEnded,
    ToolCallResponse,
    encode,
    json_response,
)
from ctxactors.transports.http.state import api_state

MAX_LIMIT = 1_000  # above what any history keeps: a bigger limit means "everything"


async def list_tools(request: Request) -> Response:
    tools = api_state(request).runtime.list_tools()
    return Response(encode({"tools": tools}), media_type="application/json")


async def call_tool(request: Request) -> Response:
    runtime = api_state(request).runtime
    name: str = request.path_params["name"]
    if name not in runtime.tools:
        raise ApiError(404, "unknown_tool", f"unknown tool {name!r}")
    ctx = ToolContext(
        header_id(request, "X-Session-Id") or uuid.uuid4().hex,
        header_id(request, "X-Assistant-Id"),
        header_id(request, "X-Thread-Id"),
    )
    body = await json_body(request)
    principal = principal_of(request.scope)
    result: ToolResult = await runtime.acall(name, inject_context(body, ctx), principal=principal)
    response = ToolCallResponse(ctx.session_id, result.content, result.structured, result.is_error)
    return json_response(response, headers={"X-Session-Id": as_header(ctx.session_id)})


async def session_context(request: Request) -> Response:
    runtime = api_state(request).runtime
    session_id = path_id(request, "session_id")
    arguments: dict[str, Any] = {"__sessionId": session_id}
    # Only what this assistant and thread could see (none given: calls made without one).
    for header, field in (("X-Assistant-Id", "__assistantId"), ("X-Thread-Id", "__threadId")):
        if (value := header_id(request, header)) is not None:
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
    if not await run_in_threadpool(_known, runtime, session_id, principal):
        raise ApiError(404, "unknown_session", f"session {session_id!r} has no state")
    result: ToolResult = await runtime.acall("get_recent_context", arguments, principal=principal)
    if result.is_error or result.structured is None:
        raise ApiError(500, "history_failed", result.text)
    return json_response(SessionContext(session_id, **_operations(result.structured)))


def _known(runtime: Any, session_id: str, principal: str | None) -> bool:
    """A live actor, or a history in the store: a reaped session's history is still there
    (peeked at in the store, so asking about an unknown session spawns nothing)."""
    if runtime.has_session(session_id, principal=principal):
        return True
    store = runtime.store
    return store is not None and store.load((principal, session_id), HISTORY_KEY) is not None


async def end_session(request: Request) -> Response:
    """Idempotent: 200 whether or not the caller's session had live actors, so a retry (or
    a session whose actors were reaped, its state kept in the store) is not a 404. Only
    the caller's principal's session is ended: the principal is part of its key."""
    api = api_state(request)
    session_id = path_id(request, "session_id")
    principal = principal_of(request.scope)
    stopped = await run_in_threadpool(api.runtime.end_session, session_id, principal=principal)
    api.log.info("session_ended_over_http", session_id=session_id, actors=stopped)
    return json_response(SessionEnded(session_id, stopped))


async def query(request: Request) -> Response:
    api = api_state(request)
    if api.model is None:
        raise ApiError(
            503,
            "no_model",
            "no chat model is configured on this server, so /api/v1/query can't run; "
            "call tools directly with POST /api/v1/tools/{name}",
        )
    try:
        req = msgspec.convert(await json_body(request), QueryRequest, strict=True)
    except msgspec.ValidationError as exc:
        raise ApiError(400, "invalid_request", f"invalid query request: {exc}") from None
    if req.session_id is not None:  # it goes back in a header once the model has run
        header_safe(req.session_id, "session_id", "invalid_request")
    header = header_id(request, "X-Session-Id")  # checked even when the body names one
    session_id = req.session_id or header or uuid.uuid4().hex
    answer = await _ask(api.runtime, api.model, req.query, session_id, request)
    return json_response(
        QueryResponse(session_id, answer), headers={"X-Session-Id": as_header(session_id)}
    )


async def stats(request: Request) -> Response:
    """The server-wide counters: every tenant's calls and sessions, so with authentication
    only an operator's (`is_operator`)."""
    api = api_state(request)
    if not is_operator(request.scope, api.operators):
        raise ApiError(403, "forbidden", f"{principal_of(request.scope)!r} is no operator")
    return json_response(api.runtime.stats())


async def healthz(request: Request) -> Response:
    runtime = api_state(request).runtime
    closed = runtime.closed
    return json_response(
        Health("closed" if closed else "ok", len(runtime.tools)), 503 if closed else 200
    )


async def openapi_json(request: Request) -> Response:
    return Response(api_state(request).openapi, media_type="application/json")


def _operations(structured: dict[str, Any]) -> dict[str, Any]:
    ops = msgspec.convert(structured["operations"], list[OperationRecord])
    return {"operations": ops, "count": len(ops)}


async def _ask(runtime: Any, model: Any, text: str, session_id: str, request: Request) -> str:
    """One turn of the agent loop for this session (tools run in the caller's context)."""
    from ctxactors.conversation import ChatSession, ModelError

    chat = ChatSession(
        _AsPrincipal(runtime, principal_of(request.scope)),
        model,
        session_id=session_id,
        assistant_id=header_id(request, "X-Assistant-Id"),
        thread_id=header_id(request, "X-Thread-Id"),
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
