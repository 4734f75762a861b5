"""What an operator reads over HTTP: ``/metrics`` (Prometheus) and ``/api/v1/stats/top``
(the figures of ``ctxactors top``), the trace context of REST requests, and the ``serve``
options for them.

Who sees what, when authentication is on: an operator (a principal named by
``--operator``) sees everything; any other principal gets 403 at ``/metrics`` (and at
``/api/v1/stats``) and, at ``/api/v1/stats/top``, only its own sessions and errors: the
server-wide figures (calls, latency, live actors: every tenant's activity) are withheld,
zero, and no other principal's session id is shown. Without authentication (a loopback
server) everyone is the operator.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import msgspec
from opentelemetry import context as otel_context
from opentelemetry.propagate import extract
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ctxactors.metrics import BUCKETS, CallMetrics
from ctxactors.transports.auth import is_operator, principal_of

TOP_SESSIONS = 10


class SessionCalls(msgspec.Struct, frozen=True):
    principal: str | None
    session_id: str
    calls: int


class ErrorLine(msgspec.Struct, frozen=True):
    time: float
    tool: str
    principal: str | None
    session_id: str
    message: str


class TopStats(msgspec.Struct, frozen=True):
    """One sample for ``ctxactors top``: totals since start; the client takes differences."""

    time: float  # the server's clock (Unix seconds) when sampled
    scope: str  # "all", or "principal": only the caller's own sessions and errors
    # Server-wide, for scope "all"; withheld (empty, zero) for scope "principal":
    runtime: dict[str, int]  # `Runtime.stats()`
    calls: int  # tool calls that reached a server, every principal's
    errors: int  # of which error results
    latency_bounds: list[float]  # bucket upper bounds in seconds (+Inf implied last)
    latency_counts: list[int]  # calls per bucket, not cumulative, +Inf last
    top_sessions: list[SessionCalls]
    recent_errors: list[ErrorLine]  # oldest first


_encode = msgspec.json.Encoder().encode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("observability", "docs/operations.md")
    group.add_argument(
        "--tracing",
        action="store_true",
        help="export a span per tool call with the OpenTelemetry SDK, configured by the "
        "OTEL_* variables (needs the [otel] extra)",
    )
    group.add_argument(
        "--operator",
        action="append",
        default=[],
        metavar="PRINCIPAL",
        help="with authentication, a principal that may read /metrics and every session "
        "in /api/v1/stats/top (repeatable)",
    )
    group.add_argument(
        "--metrics-principal-label",
        action="store_true",
        help="label the call metrics with the principal (one per caller, for the first "
        "metrics.max_principals callers; later ones as 'other')",
    )


def routes(
    metrics: CallMetrics, registry: CollectorRegistry, operators: frozenset[str]
) -> list[Route]:
    """``GET /metrics`` and ``GET /api/v1/stats/top`` for one server."""

    async def prometheus(request: Request) -> Response:
        if not is_operator(request.scope, operators):
            principal = principal_of(request.scope)
            body = {"error": {"code": "forbidden", "message": f"{principal!r} is no operator"}}
            return Response(_encode(body), 403, media_type="application/json")
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), headers={"Content-Type": content_type})

    async def top(request: Request) -> Response:
        allowed = is_operator(request.scope, operators)
        who: Any = ... if allowed else principal_of(request.scope)
        counts, _ = metrics.latency() if allowed else ([0] * (len(BUCKETS) + 1), 0.0)
        sample = TopStats(
            time=time.time(),
            scope="all" if allowed else "principal",
            runtime=metrics.runtime.stats() if allowed else {},
            calls=sum(counts),
            errors=metrics.error_count() if allowed else 0,
            latency_bounds=list(BUCKETS),
            latency_counts=counts,
            top_sessions=[SessionCalls(*s) for s in metrics.top_sessions(TOP_SESSIONS, who)],
            recent_errors=[
                ErrorLine(e.time, e.tool, e.principal, e.session_id, e.message)
                for e in metrics.recent_errors(who)
            ],
        )
        return Response(_encode(sample), media_type="application/json")

    return [
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/api/v1/stats/top", top, methods=["GET"]),
    ]


class TraceContextMiddleware:
    """ASGI middleware: a request's W3C ``traceparent`` (and ``tracestate``) header becomes
    the current trace context while it is served, so a REST call's span continues the
    caller's trace. A request without one costs a header scan."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name in (b"traceparent", b"tracestate")
        }
        if "traceparent" not in carrier:
            await self.app(scope, receive, send)
            return
        token = otel_context.attach(extract(carrier))
        try:
            await self.app(scope, receive, send)
        finally:
            otel_context.detach(token)
