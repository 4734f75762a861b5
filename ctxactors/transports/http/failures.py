"""How every failure becomes the API's JSON error body (Starlette exception handlers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ctxactors.errors import (
    CallTimeoutError,
    CtxActorsError,
    InvalidArgumentsError,
    RuntimeClosedError,
    ShardUnavailableError,
    StoreUnavailableError,
    UnknownToolError,
)
from ctxactors.redis_url import redact
from ctxactors.transports.http.shapes import ApiError, error_response
from ctxactors.transports.http.state import api_state

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def from_runtime_error(exc: CtxActorsError) -> ApiError:
    if isinstance(exc, UnknownToolError):
        return ApiError(404, "unknown_tool", str(exc))
    if isinstance(exc, InvalidArgumentsError):
        return ApiError(400, "invalid_arguments", str(exc))
    if isinstance(exc, CallTimeoutError):
        return ApiError(504, "timeout", str(exc))
    if isinstance(exc, RuntimeClosedError):
        return ApiError(503, "runtime_closed", str(exc))
    if isinstance(exc, StoreUnavailableError):  # the store kept what it held: retry later
        return ApiError(503, "store_unavailable", exc.tenant_message)
    if isinstance(exc, ShardUnavailableError):  # retryable; the call is in doubt
        return ApiError(503, "shard_unavailable", str(exc))
    return ApiError(500, "runtime_error", str(exc))


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    if exc.status >= 500:
        api_state(request).log.error(
            "http_error", path=request.url.path, code=exc.code, error=exc.message
        )
    return error_response(exc.status, exc.code, exc.message)


async def runtime_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, CtxActorsError)
    if isinstance(exc, StoreUnavailableError):  # the detail the answer leaves out
        api_state(request).log.error(
            "store_unavailable", path=request.url.path, error=redact(str(exc))
        )
    return await api_error(request, from_runtime_error(exc))


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    message = (
        f"no route {request.method} {request.url.path}"
        if exc.status_code in (404, 405)
        else str(exc.detail)
    )
    return error_response(exc.status_code, code, message)


async def client_left(request: Request, exc: Exception) -> Response:
    """The client went (or the server's body deadline closed it) before the body was whole:
    nothing ran, and this answer reaches no one."""
    api_state(request).log.debug("http_client_left", path=request.url.path)
    return error_response(400, "client_disconnected", "the request's body did not arrive whole")


async def unexpected(request: Request, exc: Exception) -> Response:
    api_state(request).log.error("http_unexpected", path=request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal error (logged on the server)")


HANDLERS: dict[Any, Callable[..., Any]] = {
    ApiError: api_error,
    CtxActorsError: runtime_error,
    HTTPException: http_error,
    ClientDisconnect: client_left,
    Exception: unexpected,
}
