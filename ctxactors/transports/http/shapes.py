"""The shapes on the wire: the single source of truth for responses and ``/openapi.json``.

Every response body is one of these msgspec types; an error is `ErrorBody`, raised inside
the app as `ApiError` and rendered by `ctxactors.transports.http.failures`.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from starlette.responses import Response

from ctxactors._decoding import build_now
from ctxactors.context import MAX_ID
from ctxactors.servers.history import OperationRecord

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID)]


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
    operations: list[OperationRecord]
    count: int


class SessionEnded(msgspec.Struct, frozen=True):
    session_id: str
    actors_stopped: int


class QueryRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    query: Annotated[str, msgspec.Meta(min_length=1, max_length=100_000)]
    session_id: Id | None = None


build_now(QueryRequest)


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


encode = msgspec.json.Encoder().encode


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(encode(value), status, headers, media_type="application/json")


def error_response(status: int, code: str, message: str) -> Response:
    return json_response(ErrorBody(ErrorDetail(code, message)), status)
