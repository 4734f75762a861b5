"""ASGI middleware of the REST API: the body cap and the in-flight count for draining."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ctxactors.transports.http.shapes import ApiError, error_response
from ctxactors.transports.inflight import InFlight


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
            refusal = error_response(
                503, "shutting_down", "the server is shutting down; no new calls"
            )
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
            await error_response(exc.status, exc.code, exc.message)(scope, receive, send)
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
