"""OpenTelemetry spans for tool calls: one per call, in the key's actor, under the caller's.

`instrument(runtime)` adds a call wrapper (`Runtime.add_call_wrapper`) that reads the
caller's trace context in the caller's thread and, in the key's actor thread, runs the call
inside a span ``execute_tool {tool}`` whose parent is that context. The span is current
while the tool runs, so what the tool calls in turn (the operations of a batch) become its
children. Attributes follow the OpenTelemetry GenAI conventions for tool execution
(``gen_ai.operation.name="execute_tool"``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``
when the caller named one), plus the conversation's ids.

Where the caller's context comes from:

- in-process, the current OpenTelemetry context of the caller (an embedded host's own span);
- over MCP, the SDK's server span for ``tools/call``, itself the child of the
  ``traceparent`` the client put in ``_meta``;
- over REST, the W3C ``traceparent``/``tracestate`` headers
  (`ctxactors.transports.observe.TraceContextMiddleware`).

Spans go to the global tracer provider (`opentelemetry-api`): without an SDK they cost
nothing but the wrapper, and a runtime is only instrumented when a provider is installed
when it is created, or when asked. `configure_from_env` installs the SDK from the standard
``OTEL_*`` variables (``serve --tracing``; needs the ``[otel]`` extra).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import ProxyTracerProvider, SpanKind, StatusCode

from ctxactors.context import ToolContext
from ctxactors.results import ToolResult
from ctxactors.tools import Server, ToolSpec

if TYPE_CHECKING:  # starlette is the [serve] extra's; only the middleware's types need it
    pass

TRACER_NAME = "ctxactors"
# The model's id of the tool call being run (`tool_call_id`): ``gen_ai.tool.call.id``.
_TOOL_CALL_ID = otel_context.create_key("ctxactors.tool_call_id")
# Over MCP the host may name the tool call in ``_meta`` (a vendor-prefixed key, as MCP asks).
META_TOOL_CALL_ID = "ctxactors/toolCallId"
MAX_TOOL_CALL_ID = 256  # a longer id is not recorded: spans are not a place to store data

Body = Callable[[Server], ToolResult]


def provider_installed() -> bool:
    """Whether a real tracer provider (an SDK's) is installed globally."""
    return not isinstance(
        trace.get_tracer_provider(), ProxyTracerProvider | trace.NoOpTracerProvider
    )


def instrument(runtime: Any, tracer_provider: trace.TracerProvider | None = None) -> None:
    """Trace every later call of `runtime`: one span per tool call (see the module doc)."""
    tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
    runtime.add_call_wrapper(_SpanWrapper(tracer))


def instrument_if_enabled(runtime: Any) -> bool:
    """`instrument` when a tracer provider is installed; else nothing (so no cost)."""
    if provider_installed():
        instrument(runtime)
        return True
    return False


@contextmanager
def tool_call(call_id: str | None) -> Iterator[None]:
    """Name the model's tool call that the calls made inside this block run, for their
    spans' ``gen_ai.tool.call.id`` (a host's agent loop knows it; the runtime does not).
    An empty id, or one over `MAX_TOOL_CALL_ID` characters, is not recorded."""
    if not call_id or len(call_id) > MAX_TOOL_CALL_ID:
        yield
        return
    token = otel_context.attach(otel_context.set_value(_TOOL_CALL_ID, call_id))
    try:
        yield
    finally:
        otel_context.detach(token)


class _SpanWrapper:
    """The call wrapper: reads the caller's context now, opens the span in the actor."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def __call__(self, body: Body, spec: ToolSpec, ctx: ToolContext) -> Body:
        parent = otel_context.get_current()  # the caller's thread: its trace context
        tracer = self._tracer
        name = f"execute_tool {spec.name}"

        def traced(server: Server) -> ToolResult:
            # A call run in another process (the Ray backend) spans its round trip.
            start = getattr(server, "started_ns", None)
            span = tracer.start_span(name, context=parent, kind=SpanKind.INTERNAL, start_time=start)
            if span.is_recording():  # unsampled: don't build what nobody keeps
                span.set_attributes(_attributes(spec, ctx, parent))
            token = otel_context.attach(trace.set_span_in_context(span, parent))
            try:
                result = body(server)
                if result.is_error:
                    span.set_attribute("error.type", "tool_error")
                    span.set_status(StatusCode.ERROR, result.text[:200])
                return result
            finally:
                otel_context.detach(token)
                span.end()

        return traced


def _attributes(spec: ToolSpec, ctx: ToolContext, parent: otel_context.Context) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": spec.name,
        "gen_ai.tool.type": "function",
        "gen_ai.conversation.id": ctx.session_id,
        "ctxactors.session_id": ctx.session_id,
        "ctxactors.server": spec.server.name,
    }
    call_id = otel_context.get_value(_TOOL_CALL_ID, parent)
    if call_id is not None:
        attributes["gen_ai.tool.call.id"] = call_id
    if ctx.assistant_id is not None:
        attributes["ctxactors.assistant_id"] = ctx.assistant_id
    if ctx.thread_id is not None:
        attributes["ctxactors.thread_id"] = ctx.thread_id
    if ctx.principal is not None:
        attributes["ctxactors.principal"] = ctx.principal
    return attributes


def configure_from_env() -> None:
    """Install the OpenTelemetry SDK as the ``OTEL_*`` environment variables say
    (exporter, endpoint, headers, sampler, service name, batch sizes).

    This is the SDK's own environment-driven setup, the one ``opentelemetry-instrument``
    runs; when ``OTEL_TRACES_EXPORTER`` is unset it exports OTLP over HTTP (the exporter the
    ``[otel]`` extra installs). Raises `RuntimeError` naming the extra if the SDK is missing.
    """
    try:
        from opentelemetry.sdk._configuration import _OTelSDKConfigurator
    except ImportError:
        raise RuntimeError(
            "tracing needs the OpenTelemetry SDK: pip install 'ctxactors[otel]'"
        ) from None
    names = [] if "OTEL_TRACES_EXPORTER" in os.environ else ["otlp_proto_http"]
    _OTelSDKConfigurator().configure(trace_exporter_names=names)
