"""Where a call's context comes from, every combination, on every surface.

The rule (issue 13): the model can write arguments but never ``_meta``. So when ``_meta``
carries any context key, it alone is the context and every ``__*`` argument is dropped and
logged as spoofing; the ``__*`` arguments (either spelling, camelCase first) count only when
``_meta`` carries none. The session falls back to the MCP session id over stateful HTTP,
``default`` on stdio and in the embedded runtime, and nothing over stateless HTTP (the call
is refused). The principal comes only from the transport and nothing overrides it.

`expected` states the rule once, independently of the implementation; a few hand-written
rows pin the cases named in the issue. Each surface runs the whole table through the
`Whoami` tool, which answers with the context the runtime resolved.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp_support import Whoami, http_server, stdio_params
from structlog.testing import capture_logs

from ctxactors import InvalidArgumentsError, Runtime
from ctxactors.context import read_context

pytestmark = pytest.mark.timeout(120)

SESSION, ASSISTANT, THREAD = "ctxactors/sessionId", "ctxactors/assistantId", "ctxactors/threadId"
SPELLINGS = {
    "session": ("__sessionId", "__session_id"),
    "assistant": ("__assistantId", "__assistant_id"),
    "thread": ("__threadId", "__thread_id"),
}
META_KEYS = {"session": SESSION, "assistant": ASSISTANT, "thread": THREAD}
REFUSED = "refused"
INVALID = "invalid"  # a context value that is not a string

ARGUMENTS: dict[str, dict[str, Any]] = {
    "none": {},
    "camel-session": {"__sessionId": "as"},
    "snake-session": {"__session_id": "as"},
    "camel-all": {"__sessionId": "as", "__assistantId": "aa", "__threadId": "at"},
    "snake-all": {"__session_id": "as", "__assistant_id": "aa", "__thread_id": "at"},
    "both-spellings": {"__session_id": "snake", "__sessionId": "as", "__assistant_id": "aa"},
    "no-session": {"__assistantId": "aa", "__thread_id": "at"},
    "principal-smuggled": {"__principal": "mallory", "__sessionId": "as"},
}
METAS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "empty": {},
    "unrelated": {"progressToken": 7, "ctxactors/principal": "mallory", "sessionId": "x"},
    "session": {SESSION: "ms"},
    "assistant": {ASSISTANT: "ma"},
    "thread": {THREAD: "mt"},
    "all": {SESSION: "ms", ASSISTANT: "ma", THREAD: "mt"},
    "null-session": {SESSION: None, ASSISTANT: "ma"},
}
COMBINATIONS = list(itertools.product(ARGUMENTS, METAS))


def expected(
    arguments: dict[str, Any],
    meta: dict[str, Any] | None,
    fallback: str | None,
    principal: str | None = None,
) -> dict[str, Any] | str:
    """The context the rule gives, or REFUSED (no session), or INVALID (a value it reads
    is not a string; a ``null`` in ``_meta`` is no value)."""
    from_meta = {attr: (meta or {}).get(key) for attr, key in META_KEYS.items()}
    if any(value is not None for value in from_meta.values()):
        fields = from_meta
        if any(not isinstance(v, str) for v in fields.values() if v is not None):
            return INVALID
    else:
        present = {
            attr: [arguments[name] for name in names if name in arguments]
            for attr, names in SPELLINGS.items()
        }
        if any(not isinstance(found[0], str) for found in present.values() if found):
            return INVALID
        fields = {attr: found[0] if found else None for attr, found in present.items()}
    session = fields["session"] if fields["session"] is not None else fallback
    if session is None:
        return REFUSED
    return {
        "session": session,
        "assistant": fields["assistant"],
        "thread": fields["thread"],
        "principal": principal,
    }


def spoofed(arguments: dict[str, Any], meta: dict[str, Any] | None) -> list[str]:
    """The ``__*`` arguments dropped (and logged) as spoofing."""
    if not any((meta or {}).get(key) is not None for key in META_KEYS.values()):
        return []
    return sorted(name for name in arguments if name.startswith("__"))


def context(session: str, assistant: str | None = None, thread: str | None = None) -> dict:
    return {"session": session, "assistant": assistant, "thread": thread, "principal": None}


# The cases the issue names, written out by hand (so the table above isn't its own oracle).
EXAMPLES = [
    # args only: honoured, camelCase first
    ({"__sessionId": "s", "__assistantId": "a"}, None, context("s", "a")),
    ({"__session_id": "snake", "__sessionId": "camel"}, None, context("camel")),
    # meta only
    ({}, {SESSION: "m", ASSISTANT: "ma"}, context("m", "ma")),
    # both: meta wins for everything
    (
        {"__sessionId": "s", "__assistantId": "a"},
        {SESSION: "m", ASSISTANT: "ma"},
        context("m", "ma"),
    ),
    # meta with only the session: the model's assistant is dropped, not merged
    ({"__assistantId": "evil"}, {SESSION: "m"}, context("m")),
    # meta with only the assistant: the model's session is dropped too (fallback session)
    ({"__session_id": "victim"}, {ASSISTANT: "ma"}, context("default", "ma")),
    # unrelated meta keys are no context: the arguments count
    ({"__sessionId": "s"}, {"progressToken": 1}, context("s")),
    ({}, None, context("default")),
]


@pytest.mark.parametrize(("arguments", "meta", "want"), EXAMPLES)
def test_the_cases_the_issue_names(
    arguments: dict[str, Any], meta: dict[str, Any] | None, want: dict[str, Any]
) -> None:
    assert expected(arguments, meta, "default") == want
    with Runtime(servers=[Whoami]) as rt:
        assert rt.call("whoami", arguments, meta=meta).structured == want


# -- embedded runtime ----------------------------------------------------------------------

# Valid ids only: the id rule itself (check_id) is tested in test_context.py.
_values = st.none() | st.text("ab", min_size=1, max_size=2) | st.integers(0, 2) | st.booleans()
_argument_names = st.sampled_from(
    [*(name for names in SPELLINGS.values() for name in names), "__principal", "__x", "goal"]
)
_meta_names = st.sampled_from([*META_KEYS.values(), "ctxactors/principal", "progressToken"])


@settings(max_examples=500, deadline=None)
@given(
    st.dictionaries(_argument_names, _values, max_size=6),
    st.none() | st.dictionaries(_meta_names, _values, max_size=5),
    st.sampled_from(["default", "mcp-1", None]),
    st.none() | st.text(max_size=2),
)
def test_property_read_context_follows_the_rule(
    arguments: dict[str, Any],
    meta: dict[str, Any] | None,
    fallback: str | None,
    principal: str | None,
) -> None:
    want = expected(arguments, meta, fallback, principal)
    if want in (REFUSED, INVALID):
        with pytest.raises(InvalidArgumentsError) as refused:
            read_context(arguments, meta, principal=principal, fallback=fallback)
        assert str(refused.value).startswith("no session given") is (want == REFUSED)
        return
    ctx, dropped, defaulted = read_context(arguments, meta, principal=principal, fallback=fallback)
    assert msgspec.structs.asdict(ctx) == {
        "session_id": want["session"],
        "assistant_id": want["assistant"],
        "thread_id": want["thread"],
        "principal": principal,
    }
    assert sorted(dropped or []) == spoofed(arguments, meta)
    # The session is the fallback exactly when no source named one.
    assert defaulted is (expected(arguments, meta, None, principal) == REFUSED)


@pytest.mark.parametrize(("args_name", "meta_name"), COMBINATIONS)
def test_embedded_runtime_every_combination(args_name: str, meta_name: str) -> None:
    arguments, meta = ARGUMENTS[args_name], METAS[meta_name]
    with capture_logs() as logs, Runtime(servers=[Whoami]) as rt:
        for fallback, principal in itertools.product(("default", "mcp-1", None), (None, "alice")):
            want = expected(arguments, meta, fallback, principal)
            logs.clear()
            if want == REFUSED:
                with pytest.raises(InvalidArgumentsError, match="ctxactors/sessionId"):
                    rt.call(
                        "whoami",
                        arguments,
                        meta=meta,
                        principal=principal,
                        session_fallback=fallback,
                    )
                continue
            result = rt.call(
                "whoami", dict(arguments), meta=meta, principal=principal, session_fallback=fallback
            )
            assert result.structured == want, (fallback, principal)
            dropped = [e for e in logs if e["event"] == "spoofed_context_dropped"]
            if spoofed(arguments, meta):
                assert [(e["log_level"], e["fields"]) for e in dropped] == [
                    ("warning", spoofed(arguments, meta))
                ]
                assert dropped[0]["session_id"] == want["session"]
                assert dropped[0]["principal"] == principal
            else:
                assert dropped == []


@pytest.mark.parametrize("bad", [3, ["s"], {"id": "s"}, True])
def test_a_non_string_context_value_is_refused_naming_it(bad: object) -> None:
    with Runtime(servers=[Whoami]) as rt:
        with pytest.raises(InvalidArgumentsError, match="ctxactors/assistantId"):
            rt.call("whoami", {}, meta={SESSION: "s", ASSISTANT: bad})
        with pytest.raises(InvalidArgumentsError, match="__threadId"):
            rt.call("whoami", {"__sessionId": "s", "__threadId": bad})
        # Beside a _meta context, a bad __* argument is dropped unread, not an error.
        result = rt.call("whoami", {"__threadId": bad}, meta={SESSION: "s"})
        assert result.structured == context("s")


# -- MCP over stdio and streamable HTTP, with the official SDK client -----------------------


async def _whoami_all(client: Client) -> dict[tuple[str, str], Any]:
    seen: dict[tuple[str, str], Any] = {}
    for args_name, meta_name in COMBINATIONS:
        result = await client.call_tool(
            "whoami",
            dict(ARGUMENTS[args_name]),
            meta=METAS[meta_name],  # type: ignore[arg-type]
        )
        seen[args_name, meta_name] = (
            (REFUSED, result.content[0].text) if result.is_error else result.structured_content
        )
    return seen


def _assert_table(seen: dict[tuple[str, str], Any], fallback: str | None) -> None:
    for (args_name, meta_name), got in seen.items():
        want = expected(ARGUMENTS[args_name], METAS[meta_name], fallback)
        if want == REFUSED:
            assert got[0] == REFUSED, (args_name, meta_name, got)
            assert "_meta" in got[1] and "ctxactors/sessionId" in got[1], got[1]
            assert "__sessionId" in got[1], got[1]
        else:
            assert got == want, (args_name, meta_name)


def test_mcp_stdio_every_combination_falls_back_to_default() -> None:
    async def main() -> dict[tuple[str, str], Any]:
        async with Client(stdio_params("--server", "mcp_support:Whoami")) as client:
            return await _whoami_all(client)

    _assert_table(anyio.run(main), "default")


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    with http_server("--server", "mcp_support:Whoami") as (url, _proc):
        yield url


def test_mcp_stateful_http_every_combination_falls_back_to_the_mcp_session(served: str) -> None:
    async def main() -> tuple[Any, Any, dict[tuple[str, str], Any]]:
        async with Client(served, mode="legacy") as client:
            own = (await client.call_tool("whoami", {})).structured_content
            async with Client(served, mode="legacy") as other:
                theirs = (await other.call_tool("whoami", {})).structured_content
            return own, theirs, await _whoami_all(client)

    own, theirs, seen = anyio.run(main)
    mcp_session = own["session"]
    assert own == context(mcp_session) and mcp_session not in ("", "default")
    assert theirs["session"] not in (mcp_session, "default")
    _assert_table(seen, mcp_session)


def test_mcp_stateless_http_refuses_a_call_with_no_session_from_any_source(served: str) -> None:
    async def main() -> tuple[str, dict[tuple[str, str], Any]]:
        async with Client(served) as client:  # auto mode: protocol 2026-07-28, no MCP session
            return client.protocol_version, await _whoami_all(client)

    version, seen = anyio.run(main)
    assert version == "2026-07-28"
    _assert_table(seen, None)
    refused = {combination for combination, got in seen.items() if isinstance(got, tuple)}
    assert refused == {
        (a, m) for a, m in COMBINATIONS if expected(ARGUMENTS[a], METAS[m], None) == REFUSED
    }
    assert ("none", "none") in refused and ("none", "session") not in refused


# -- REST: the context is the X-*-Id headers; the body's __* fields never count --------------

HEADERS: dict[str, dict[str, str]] = {
    "none": {},
    "session": {"X-Session-Id": "hs"},
    "all": {"X-Session-Id": "hs", "X-Assistant-Id": "ha", "X-Thread-Id": "ht"},
    "assistant": {"X-Assistant-Id": "ha"},
}


@pytest.mark.parametrize("headers_name", HEADERS)
def test_rest_every_combination_reads_only_the_headers(served: str, headers_name: str) -> None:
    base = served.removesuffix("/mcp")
    headers = HEADERS[headers_name]
    with httpx.Client(base_url=base, timeout=30) as http:
        for args_name, arguments in ARGUMENTS.items():
            response = http.post("/api/v1/tools/whoami", json=arguments, headers=headers)
            assert response.status_code == 200, response.text
            body = response.json()
            session = headers.get("X-Session-Id") or response.headers["X-Session-Id"]
            if "X-Session-Id" not in headers:
                assert len(session) >= 16 and session not in ("as", "snake", "default")
            assert body["session_id"] == session == response.headers["X-Session-Id"]
            assert body["structuredContent"] == {
                "session": session,
                "assistant": headers.get("X-Assistant-Id"),
                "thread": headers.get("X-Thread-Id"),
                "principal": None,
            }, args_name
