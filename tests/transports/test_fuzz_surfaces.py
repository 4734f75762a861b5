"""Fuzz: hostile input on every surface gets a clear refusal, never a crash or a 5xx.

Hypothesis generates what a model, a buggy host or an attacker may send: JSON values of
every type where a field wants another, strings with lone surrogates and control characters
(NUL, CR/LF), deep nesting, huge values, non-object arguments, unknown tools, reserved
fields and ``_meta`` keys holding non-strings, batch operations with references and
placeholders, and raw bytes that are not UTF-8 at all. The same inputs go to

- the embedded runtime (`Runtime.call`): the only outcomes allowed are a `ToolResult` that
  encodes to JSON or a `CtxActorsError` other than a timeout; the caller's state stays
  readable afterwards (a stored lone surrogate used to break every later read);
- the REST API of a served ``ctxactors serve --transport http`` process (httpx): never a 5xx
  or a dropped connection, and ``/healthz`` answers after each input;
- MCP: raw JSON-RPC lines to a served ``ctxactors serve`` over stdio, and JSON-RPC bodies
  to ``/mcp`` of the HTTP process: every request with an id gets an answer that is not an
  internal error, and ``tools/list`` answers after each input.

The served processes' standard error must show no traceback at the end. Workspace tools
(they run shell commands) and the test gate tools are never called.
"""

from __future__ import annotations

import json
import queue
import reprlib
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st
from mcp_support import serve_env
from served_support import (
    INITIALIZE_PARAMS,
    SERVE,
    McpHttpSession,
    encode,
    no_traceback,
    rpc_messages,
    served_http,
)

from ctxactors import CallTimeoutError, CtxActorsError, InvalidArgumentsError, Runtime, ToolResult
from ctxactors.context import META_KEYS, check_id
from ctxactors.logs import _serialize
from ctxactors.servers import Content, Planning, Playbooks

pytestmark = [
    pytest.mark.timeout(300),
    # Reports of huge or deep inputs are bounded by `describe`; hypothesis warns anyway.
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning"),
]

# Never called: they run shell commands.
FORBIDDEN = ("execute_command", "poll_process", "kill_process", "list_processes")

_probe_rt = Runtime(servers=[Planning, Playbooks, Content])
TOOLS = {d["name"]: d["inputSchema"] for d in _probe_rt.list_tools()}
_probe_rt.close()
TOOL_NAMES = sorted(TOOLS)
READS = ("get_planning_state", "list_playbooks", "get_recent_context", "list_content")
READS += ("list_presets",)

# -- strategies ----------------------------------------------------------------------------

HOSTILE = ["\x00", "\r", "\n", "\r\n", "\ud800", "\udfff", "\udc80x\ud800", "\u2028", "\ufeff"]
HOSTILE += ["\x1b[2J", "\x7f", "é", "café", "🙂", "${a", "${x.y}", "{{p}}", "%00", "\\", '"']
HOSTILE += ["${" + "a" * 40, "${a" * 200]
hostile_text = st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=6)), max_size=6).map(
    "".join
)
huge_text = st.sampled_from([1 << 12, 1 << 16, 1 << 20, (4 << 20) + 1]).map(lambda n: "x" * n)
numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, hostile_text)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=10,
)


def nest(depth: int, leaf: Any = "x", as_dict: bool = False) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value} if as_dict else [value]
    return value


deep = st.builds(nest, st.sampled_from([64, 1_000, 20_000, 200_000]), st.just("x"), st.booleans())
values = st.one_of(json_values, json_values, json_values, hostile_text, huge_text, deep)
contexts = st.fixed_dictionaries(
    {},
    optional={
        "__sessionId": st.one_of(st.sampled_from(["f1", "f2", "f\ud800", "f\r\n"]), values),
        "__assistantId": st.one_of(st.sampled_from(["a1", "a\x00"]), values),
        "__threadId": st.one_of(st.just("t1"), values),
        "__session_id": values,
    },
)
metas = st.none() | st.dictionaries(
    st.sampled_from([*META_KEYS.values(), "progressToken", "x/y"]), values, max_size=3
)


def operation(tool_names: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, Any]]:
    """One batch operation, mostly well-formed, with hostile values inside."""
    return st.fixed_dictionaries(
        {"tool": tool_names},
        optional={
            "id": hostile_text,
            "arguments": st.dictionaries(hostile_text, values, max_size=3),
            "dependsOn": st.lists(hostile_text, max_size=2),
            "thread": values,
            "timeout": numbers,
            "condition": st.dictionaries(st.sampled_from(["ifSuccess", "ifFailed"]), values),
        },
    )


def tool_arguments(tool: str) -> st.SearchStrategy[Any]:
    """Arguments for `tool`: its own fields (and some others) with values of any type."""
    fields = sorted(TOOLS.get(tool, {}).get("properties", {}))
    names = st.sampled_from([*fields, "unknown", "__sessionId", "__x"]) if fields else hostile_text
    if tool in ("batch", "save_preset"):
        ops = st.lists(operation(st.sampled_from(TOOL_NAMES) | hostile_text), max_size=4)
        typed = st.fixed_dictionaries(
            {"operations": ops},
            optional={"name": hostile_text, "options": st.dictionaries(hostile_text, values)},
        )
    else:
        typed = st.fixed_dictionaries({f: st.one_of(hostile_text, values) for f in fields})
    return st.one_of(
        typed,
        st.dictionaries(names, values, max_size=4),
        values,  # not an object at all
        json_values.map(lambda v: json.dumps(v)),  # a JSON string (maybe not an object)
        st.sampled_from(['{"goal": "x"', "{", "[]", "null", '{"a": "\\ud800"}', "\x00"]),
    )


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, Any, Any]:
    """(tool, arguments, _meta) for one call."""
    tool = draw(st.sampled_from(TOOL_NAMES) | hostile_text)
    args = draw(tool_arguments(tool))
    if isinstance(args, dict) and draw(st.booleans()):
        args = {**args, **draw(contexts)}
    elif isinstance(args, dict):
        args = {**args, "__sessionId": "f1"}
    if isinstance(args, dict) and draw(st.integers(0, 9)) == 0:
        args = {**args, draw(st.integers() | st.none()): "non-string key"}
    meta = draw(metas)
    assume(not any(name in text for text in strings_in([tool, args, meta]) for name in FORBIDDEN))
    return tool, args, meta


def strings_in(value: Any) -> Iterator[str]:
    """Every string anywhere in a value, keys included (iterative: values nest deeply)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


_short = reprlib.Repr()
_short.maxlevel, _short.maxstring, _short.maxother = 8, 200, 200


def describe(*values: Any) -> None:
    """Show the failing input in the report (a bounded repr: values may be huge or deep)."""
    note(" ".join(_short.repr(v) for v in values))


FUZZ = settings(
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)


# -- embedded ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded() -> Iterator[Runtime]:
    with Runtime(servers=[Planning, Playbooks, Content]) as rt:
        yield rt


def read_back(rt: Runtime, arguments: Any, meta: Any) -> None:
    """The sessions the call may have written to still answer every read."""
    sessions = {"f1"}
    for source, key in ((arguments, "__sessionId"), (meta, META_KEYS["session_id"])):
        if isinstance(source, dict) and isinstance(source.get(key), str):
            try:  # an id no surface can carry was refused: it named no session
                sessions.add(check_id(source[key], key))
            except InvalidArgumentsError:
                pass
    for session in sessions:
        for tool in READS:
            result = rt.call(tool, {"__sessionId": session})
            msgspec.json.encode(result.to_mcp())
            assert not result.is_error, (session, tool, result.text)


@settings(FUZZ, max_examples=200)
@given(call=calls())
def test_embedded_calls_refuse_or_answer_and_state_stays_readable(
    embedded: Runtime, call: tuple[str, Any, Any]
) -> None:
    tool, arguments, meta = call
    describe(tool, arguments, meta)
    try:
        result = embedded.call(tool, arguments, meta=meta)
    except CallTimeoutError:
        raise AssertionError("a hostile call hung past the call timeout") from None
    except CtxActorsError:
        pass
    else:
        assert isinstance(result, ToolResult)
        msgspec.json.encode(result.to_mcp())
    read_back(embedded, arguments, meta)


def test_a_log_line_with_a_lone_surrogate_is_escaped_instead_of_failing_the_call(
    embedded: Runtime,
) -> None:
    event = {"event": "actor_spawned", "session_id": "s\ud800", "key": ["planning", "s\udfff"]}
    assert json.loads(_serialize(event)) == event
    try:  # the id may be refused; it must never raise out of the logger
        result = embedded.call("get_planning_state", {"__sessionId": "s\ud800"})
    except InvalidArgumentsError:
        return
    assert result.structured == {"goals": [], "todos": []}


@pytest.mark.parametrize("arguments", ["\ud800", '{"goal": "x\udfff"}'])
def test_arguments_text_with_a_lone_surrogate_is_invalid_arguments(
    embedded: Runtime, arguments: str
) -> None:
    with pytest.raises(InvalidArgumentsError, match="not valid text: surrogates not allowed"):
        embedded.call("create_goal", arguments)


# -- REST ----------------------------------------------------------------------------------

INVALID_UTF8 = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\x80abc", b"\xf4\x90\x80\x80"]
HEADER_VALUES = [b"f1", b"caf\xc3\xa9", b"caf\xe9", b"x" * 300, b"", b"a b", "🙂".encode()]


@st.composite
def raw_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return encode(draw(values))
    if kind == 1:  # valid JSON text around invalid UTF-8
        good = encode(draw(json_values))
        cut = draw(st.integers(0, len(good)))
        return good[:cut] + draw(st.sampled_from(INVALID_UTF8)) + good[cut:]
    if kind == 2:
        return draw(st.binary(max_size=64))
    if kind == 3:
        depth = draw(st.sampled_from([100, 10_000, 1_000_000]))
        return b"[" * depth + b"]" * depth
    if kind == 4:
        return b'{"a": "\\ud800", "goal": "\\udfff", "name": "\\u0000"}'
    _, args, _ = draw(calls())
    return encode(args)


@st.composite
def rest_requests(draw: st.DrawFn) -> tuple[str, str, dict[str, bytes], bytes, dict[str, Any]]:
    """(method, path, headers, body, query) for one request to the REST API."""
    headers = draw(
        st.dictionaries(
            st.sampled_from(["X-Session-Id", "X-Assistant-Id", "X-Thread-Id"]),
            st.sampled_from(HEADER_VALUES),
            max_size=3,
        )
    )
    ident = draw(st.sampled_from(["f1", "caf%C3%A9", "%FF", "%00", "x" * 300, "%0D%0A"]))
    kind = draw(st.integers(0, 4))
    query: dict[str, Any] = {}
    if kind == 0:
        return "GET", f"/api/v1/sessions/{ident}/context", headers, b"", query
    if kind == 1:
        return "DELETE", f"/api/v1/sessions/{ident}", headers, b"", query
    if kind == 2:
        body = {"query": draw(hostile_text), "session_id": draw(values)}
        return "POST", "/api/v1/query", headers, draw(st.just(encode(body)) | raw_bodies()), query
    tool = draw(st.sampled_from(TOOL_NAMES) | st.sampled_from(["nope", "%FF", "a%00b"]))
    return "POST", f"/api/v1/tools/{tool}", headers, draw(raw_bodies()), query


@pytest.fixture(scope="module")
def http_api() -> Iterator[tuple[httpx.Client, Path]]:
    with served_http() as (base, log), httpx.Client(base_url=base, timeout=60.0) as client:
        yield client, log
        no_traceback(log.read_text(errors="replace"))


def alive(client: httpx.Client) -> None:
    health = client.get("/healthz")
    assert health.status_code == 200, health.text


@settings(FUZZ, max_examples=100)
@given(request=rest_requests())
def test_rest_never_answers_5xx_and_keeps_serving(
    http_api: tuple[httpx.Client, Path], request: tuple[str, str, dict[str, bytes], bytes, Any]
) -> None:
    client, _ = http_api
    method, path, headers, body, query = request
    describe(method, path, headers, body)
    assume(not any(name.encode() in body for name in FORBIDDEN))
    try:
        response = client.request(method, path, headers=headers, content=body, params=query)
    except httpx.LocalProtocolError:
        assume(False)  # httpx itself refused to send it (a header it can't write)
        raise
    no_model = path == "/api/v1/query" and response.status_code == 503
    assert response.status_code < 500 or no_model, (response.status_code, response.text)
    if response.status_code >= 400:
        assert "error" in response.json(), response.text
    alive(client)


# -- MCP over streamable HTTP --------------------------------------------------------------


@st.composite
def rpc_payloads(draw: st.DrawFn) -> bytes:
    """One JSON-RPC message body (mostly tools/call), or something that isn't one."""
    kind = draw(st.integers(0, 6))
    if kind <= 3:
        tool, args, meta = draw(calls())
        params: Any = {"name": tool, "arguments": args}
        if meta is not None:
            params["_meta"] = meta
        message: Any = {"jsonrpc": "2.0", "id": draw(st.integers(1, 10**6)), "method": "tools/call"}
        message["params"] = params if kind else draw(values)
        return encode(message)
    if kind == 4:
        method = draw(st.sampled_from(["tools/list", "nope", "initialize", "ping"]) | hostile_text)
        return encode({"jsonrpc": draw(values), "id": draw(values), "method": method})
    return draw(raw_bodies())


@pytest.fixture(scope="module")
def mcp_http(http_api: tuple[httpx.Client, Path]) -> McpHttpSession:
    return McpHttpSession(http_api[0])


def check_rpc_answers(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        error = message.get("error")
        assert error is None or error.get("code") != -32603, message  # internal error


@settings(FUZZ, max_examples=100)
@given(payload=rpc_payloads())
def test_mcp_http_never_answers_5xx_or_internal_error(
    mcp_http: McpHttpSession, payload: bytes
) -> None:
    describe(payload)
    response = mcp_http.post(payload)
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code == 200:
        check_rpc_answers(rpc_messages(response))
    assert "result" in mcp_http.rpc("tools/list")


# -- MCP over stdio ------------------------------------------------------------------------


class StdioPeer:
    """A raw JSON-RPC peer of ``ctxactors serve`` on stdio: write lines, read answers."""

    def __init__(self, stderr: Any) -> None:
        self.proc = subprocess.Popen(
            SERVE,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=serve_env(),
        )
        self.answers: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()
        self._next = 1_000_000_000

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.answers.put(json.loads(line))
        self.answers.put(None)

    def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.replace(b"\n", b" ") + b"\n")
        self.proc.stdin.flush()

    def request(
        self, method: str, params: Any = None, *, also: set[Any] | None = None
    ) -> list[dict[str, Any]]:
        """Send a request; every answer until its own has come, and (requests run
        concurrently, so in any order) one whose id is in `also`; each one checked."""
        self._next += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next, "method": method}
        if params is not None:
            message["params"] = params
        self.send(encode(message))
        answers: list[dict[str, Any]] = []
        ids: list[Any] = []
        while self._next not in ids or (also is not None and not also.intersection(ids)):
            try:
                # Generous: a served answer takes milliseconds alone, but the suite's
                # other workers share the cores; this only stops a test that hangs.
                answer = self.answers.get(timeout=120)
            except queue.Empty:
                raise AssertionError(f"no answer to {method} (or to one of {also})") from None
            assert answer is not None, "the server closed its standard output"
            check_rpc_answers([answer])
            answers.append(answer)
            ids.append(answer.get("id"))
            if answer.get("id") == self._next:
                assert "result" in answer, answer
        return answers

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def stdio_peer() -> Iterator[StdioPeer]:
    with tempfile.TemporaryFile() as err:
        peer = StdioPeer(err)
        try:
            peer.request("initialize", INITIALIZE_PARAMS)
            peer.send(encode({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            yield peer
        finally:
            peer.close()
        err.seek(0)
        no_traceback(err.read().decode(errors="replace"))


@settings(FUZZ, max_examples=100)
@given(line=rpc_payloads())
def test_mcp_stdio_answers_and_keeps_running(stdio_peer: StdioPeer, line: bytes) -> None:
    describe(line)
    stdio_peer.send(line)
    # The line's own answer (when it is owed one) must come, before or after the list's.
    stdio_peer.request("tools/list", also=answers_owed(line))
    assert stdio_peer.proc.poll() is None


def answers_owed(line: bytes) -> set[Any] | None:
    """The ids one answer to `line` may carry: a request's own id or None (an error that
    could not tell the id: JSON-RPC's rule), only None for a line that is not JSON at all;
    None when nothing is owed (a blank line, a notification, an id that is itself invalid).
    """
    if not line.replace(b"\n", b" ").strip():
        return None
    try:
        message = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return {None}
    if isinstance(message, dict) and "method" in message:
        ident = message.get("id")
        if isinstance(ident, str | int) and not isinstance(ident, bool):
            return {ident, None}
    return None
