"""OpenTelemetry spans: one per tool call, under the caller's span, in the actor's thread.

In-process with the SDK's in-memory exporter; over real HTTP (REST and MCP) with a served
process exporting OTLP to a receiver in this test, configured only by ``OTEL_*`` variables.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp_support import host_meta, http_server, wait_until
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import StatusCode

from ctxactors import Runtime, Server, ToolContext, tool, tracing
from ctxactors.conversation import ChatSession, Message, ScriptedModel, ToolCall
from ctxactors.conversation.messages import FunctionCall

pytestmark = pytest.mark.timeout(60)

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01"


@pytest.fixture
def traced() -> Iterator[tuple[Runtime, InMemorySpanExporter, TracerProvider]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rt = Runtime(ttl=600)
    tracing.instrument(rt, tracer_provider=provider)
    try:
        yield rt, exporter, provider
    finally:
        rt.close()


def tool_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool ")]


class Where(Server):
    """Reports the span current while its tool runs, and the thread it runs in."""

    name = "where"

    @tool(read_only=True)
    def where(self, ctx: ToolContext) -> dict[str, Any]:
        """Where am I?"""
        current = trace.get_current_span().get_span_context()
        return {"span_id": current.span_id, "thread": threading.get_ident()}


def test_a_call_is_one_span_with_the_genai_attributes(traced: Any) -> None:
    rt, exporter, _ = traced
    rt.call(
        "create_goal",
        {"goal": "Learn Rust", "__sessionId": "s1", "__assistantId": "a1", "__threadId": "t1"},
    )
    (span,) = tool_spans(exporter)
    assert span.name == "execute_tool create_goal"
    assert span.kind == trace.SpanKind.INTERNAL
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "create_goal",
        "gen_ai.tool.type": "function",
        "gen_ai.conversation.id": "s1",
        "ctxactors.session_id": "s1",
        "ctxactors.assistant_id": "a1",
        "ctxactors.thread_id": "t1",
        "ctxactors.server": "planning",
    }
    assert span.status.status_code == StatusCode.UNSET
    assert span.parent is None  # no caller span: a root


def test_the_span_is_current_in_the_actor_while_the_tool_runs_on_either_thread() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with Runtime([Where], ttl=600) as rt:
        tracing.instrument(rt, tracer_provider=provider)
        # Run by the caller's thread (an idle key, a blocking call), then by a worker
        # (from an event loop, a call always hops).
        here = rt.call("where", {"__sessionId": "s1"})

        async def from_a_loop() -> Any:
            return await rt.acall("where", {"__sessionId": "s1"})

        hopped = asyncio.run(from_a_loop())
    assert here.structured is not None and hopped.structured is not None
    first, second = tool_spans(exporter)
    assert here.structured["span_id"] == first.context.span_id
    assert hopped.structured["span_id"] == second.context.span_id
    assert here.structured["thread"] == threading.get_ident()
    assert hopped.structured["thread"] != threading.get_ident()


def test_the_span_continues_the_callers_span_across_the_actor_hop(traced: Any) -> None:
    rt, exporter, provider = traced
    tracer = provider.get_tracer("host")
    with tracer.start_as_current_span("host turn") as host:
        rt.call("create_goal", {"goal": "g", "__sessionId": "s1"})
    (span,) = tool_spans(exporter)
    assert span.context.trace_id == host.get_span_context().trace_id
    assert span.parent is not None and span.parent.span_id == host.get_span_context().span_id


def test_acall_continues_the_callers_span_too(traced: Any) -> None:
    rt, exporter, provider = traced

    async def host_turn() -> Any:
        with provider.get_tracer("host").start_as_current_span("host turn") as host:
            await rt.acall("create_goal", {"goal": "g", "__sessionId": "s1"})
        return host

    host = asyncio.run(host_turn())
    (span,) = tool_spans(exporter)
    assert span.parent is not None and span.parent.span_id == host.get_span_context().span_id


def test_batch_operations_are_child_spans_of_their_batch(traced: Any) -> None:
    rt, exporter, _ = traced
    result = rt.call(
        "batch",
        {
            "__sessionId": "s1",
            "operations": [
                {"id": "g", "tool": "create_goal", "arguments": {"goal": "Learn Rust"}},
                {
                    "id": "a",
                    "tool": "add_todo",
                    "arguments": {"name": "book", "goal_id": "${g.id}"},
                },
            ],
        },
    )
    assert not result.is_error, result.text
    spans = {s.name: s for s in tool_spans(exporter)}
    assert set(spans) == {"execute_tool batch", "execute_tool create_goal", "execute_tool add_todo"}
    parent = spans["execute_tool batch"]
    for name in ("execute_tool create_goal", "execute_tool add_todo"):
        child = spans[name]
        assert child.parent is not None and child.parent.span_id == parent.context.span_id
        assert child.context.trace_id == parent.context.trace_id
        assert child.attributes is not None and child.attributes["gen_ai.conversation.id"] == "s1"


def test_an_error_result_marks_the_span_as_an_error(traced: Any) -> None:
    rt, exporter, _ = traced
    result = rt.call("read_content", {"id": "nope", "__sessionId": "s1"})
    assert result.is_error
    (span,) = tool_spans(exporter)
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == "content 'nope' not found"
    assert span.attributes is not None and span.attributes["error.type"] == "tool_error"


def test_the_model_tool_call_id_is_recorded_where_the_host_names_it(traced: Any) -> None:
    rt, exporter, _ = traced
    with tracing.tool_call("call_abc123"):
        rt.call("create_goal", {"goal": "g", "__sessionId": "s1"})
    rt.call("create_goal", {"goal": "h", "__sessionId": "s1"})
    with tracing.tool_call("x" * (tracing.MAX_TOOL_CALL_ID + 1)):  # too long: not kept
        rt.call("create_goal", {"goal": "i", "__sessionId": "s1"})
    first, second, third = tool_spans(exporter)
    assert first.attributes is not None and first.attributes["gen_ai.tool.call.id"] == "call_abc123"
    for span in (second, third):
        assert span.attributes is not None and "gen_ai.tool.call.id" not in span.attributes


def test_the_agent_loop_names_each_model_tool_call_under_the_hosts_span(traced: Any) -> None:
    """Two calls in one model reply run on pool threads: each keeps the host's span as its
    parent and carries the model's own id for it."""
    rt, exporter, provider = traced
    first = ToolCall(id="call_1", function=FunctionCall("create_goal", '{"goal": "a"}'))
    second = ToolCall(id="call_2", function=FunctionCall("create_goal", '{"goal": "b"}'))
    model = ScriptedModel([Message.assistant(None, [first, second]), Message.assistant("done")])
    chat = ChatSession(rt, model, session_id="s1", assistant_id="a1")
    with provider.get_tracer("host").start_as_current_span("host turn") as host:
        assert chat.send("go") == "done"
    spans = tool_spans(exporter)
    ids = sorted(str((s.attributes or {}).get("gen_ai.tool.call.id")) for s in spans)
    assert ids == ["call_1", "call_2"]
    for span in spans:
        assert span.parent is not None and span.parent.span_id == host.get_span_context().span_id


def test_an_unsampled_trace_records_nothing_and_the_call_still_runs() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with Runtime(ttl=600) as rt:
        tracing.instrument(rt, tracer_provider=provider)
        result = rt.call("create_goal", {"goal": "g", "__sessionId": "s1"})
        assert result.structured == {"id": "g1", "goal": "g"}
    assert exporter.get_finished_spans() == ()


def test_without_a_tracer_provider_a_runtime_adds_no_wrapper() -> None:
    """No SDK installed globally (this test process installs none): no per-call cost."""
    assert not tracing.provider_installed()
    with Runtime(ttl=600) as rt:
        assert rt._host.wrappers == ()  # noqa: SLF001 - the absence of cost is the point


def test_serve_refuses_the_console_exporter_on_stdio(monkeypatch: pytest.MonkeyPatch) -> None:
    """It would write spans into the protocol's channel (standard output)."""
    from ctxactors.cli import main as cli_main

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    with pytest.raises(SystemExit) as refused:
        cli_main(["serve", "--tracing"])
    assert str(refused.value) == (
        "ctxactors serve --tracing: OTEL_TRACES_EXPORTER=console needs --transport http"
    )


# -- over HTTP, from a served process exporting OTLP --------------------------------------


class _Receiver(BaseHTTPRequestHandler):
    spans: list[Any] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self.spans.extend(scope.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def otlp_receiver() -> Iterator[str]:
    _Receiver.spans = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _received(name: str) -> list[Any]:
    with _Receiver.lock:
        return [s for s in _Receiver.spans if s.name == name]


@pytest.fixture(scope="module")
def traced_server() -> Iterator[str]:
    with otlp_receiver() as endpoint:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": "ctxactors-test",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }
        with http_server("--tracing", env=env) as (url, _proc):
            yield url.removesuffix("/mcp")


def test_rest_call_continues_the_traceparent_header(traced_server: str) -> None:
    response = httpx.post(
        traced_server + "/api/v1/tools/create_goal",
        json={"goal": "over REST"},
        headers={"X-Session-Id": "rest-trace", "traceparent": TRACEPARENT},
    )
    assert response.status_code == 200, response.text
    assert wait_until(lambda: _received("execute_tool create_goal"), 20)
    (span,) = [
        s for s in _received("execute_tool create_goal") if s.trace_id == TRACE_ID.to_bytes(16)
    ]
    assert span.parent_span_id == PARENT_ID.to_bytes(8)
    attributes = {a.key: a.value.string_value for a in span.attributes}
    assert attributes["gen_ai.tool.name"] == "create_goal"
    assert attributes["gen_ai.conversation.id"] == "rest-trace"


def test_mcp_call_continues_the_traceparent_in_meta(traced_server: str) -> None:
    trace_id = TRACE_ID + 1

    async def main() -> None:
        async with Client(traced_server + "/mcp") as client:
            meta: Any = {
                **host_meta(session="mcp-trace", assistant="a1"),
                "traceparent": f"00-{trace_id:032x}-{PARENT_ID:016x}-01",
                tracing.META_TOOL_CALL_ID: "call_mcp_7",
            }
            result = await client.call_tool("create_goal", {"goal": "over MCP"}, meta=meta)
            assert not result.is_error

    anyio.run(main)
    ours = lambda: [  # noqa: E731
        s for s in _received("execute_tool create_goal") if s.trace_id == trace_id.to_bytes(16)
    ]
    sdks = lambda: [  # noqa: E731
        s for s in _received("tools/call create_goal") if s.trace_id == trace_id.to_bytes(16)
    ]
    # The SDK's span ends after ours, so it may come in a later export: wait for both.
    assert wait_until(lambda: ours() and sdks(), 20)
    (span,) = ours()
    # The MCP SDK's server span for tools/call is the child of the client's traceparent,
    # and ours is the child of that one.
    (sdk_span,) = sdks()
    assert sdk_span.parent_span_id == PARENT_ID.to_bytes(8)
    assert span.parent_span_id == sdk_span.span_id
    attributes = {a.key: a.value.string_value for a in span.attributes}
    assert attributes["ctxactors.session_id"] == "mcp-trace"
    assert attributes["ctxactors.assistant_id"] == "a1"
    assert attributes["gen_ai.tool.call.id"] == "call_mcp_7"
