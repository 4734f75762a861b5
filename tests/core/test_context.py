"""The context middleware: reading, stripping and injecting the reserved fields."""

from __future__ import annotations

import json
import string
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxactors import (
    InvalidArgumentsError,
    Runtime,
    Scope,
    ToolContext,
    clean_args,
    inject_context,
)
from ctxactors.context import check_id

ctx_a1 = ToolContext("s1", "a1", "t1")


def test_from_args_reads_camel_and_snake_case() -> None:
    assert ToolContext.from_args(
        {"__sessionId": "s", "__assistantId": "a", "__threadId": "t"}
    ) == ToolContext("s", "a", "t")
    assert ToolContext.from_args(
        {"__session_id": "s", "__assistant_id": "a", "__thread_id": "t"}
    ) == ToolContext("s", "a", "t")


def test_camel_case_wins_over_snake_case() -> None:
    ctx = ToolContext.from_args({"__session_id": "snake", "__sessionId": "camel"})
    assert ctx.session_id == "camel"


def test_missing_context_is_default_session() -> None:
    assert ToolContext.from_args({"x": 1}) == ToolContext("default", None, None)
    assert ToolContext.from_args(None) == ToolContext()


def test_meta_with_a_context_key_wins_and_arguments_are_never_used() -> None:
    meta = {"ctxactors/sessionId": "m", "ctxactors/assistantId": "ma"}
    assert ToolContext.from_args({}, meta) == ToolContext("m", "ma", None)
    assert ToolContext.from_args({"__sessionId": "arg"}, meta) == ToolContext("m", "ma", None)
    # Not even for a field _meta does not carry: the model wrote it, not the host.
    assert ToolContext.from_args({"__threadId": "t"}, meta) == ToolContext("m", "ma", None)


@pytest.mark.parametrize("bad", [3, None, ["s"], {"id": "s"}, True])
def test_non_string_reserved_field_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(InvalidArgumentsError, match="__assistantId"):
        ToolContext.from_args({"__sessionId": "s", "__assistantId": bad})


def test_clean_args_removes_every_dunder_field_only() -> None:
    args = {"goal": "x", "__sessionId": "s", "__anything": 1, "_single": 2, "nested": {"__k": 1}}
    assert clean_args(args) == {"goal": "x", "_single": 2, "nested": {"__k": 1}}


def test_inject_context_keeps_llm_arguments_and_appends_context() -> None:
    llm = {"goal": "Learn Rust", "n": 3}
    out = inject_context(llm, ctx_a1)
    assert out == {
        "goal": "Learn Rust",
        "n": 3,
        "__sessionId": "s1",
        "__assistantId": "a1",
        "__threadId": "t1",
    }
    assert llm == {"goal": "Learn Rust", "n": 3}  # the input is not mutated


def test_inject_context_accepts_the_llm_json_string() -> None:
    out = inject_context('{"goal": "x"}', ToolContext("s9"))
    assert out == {"goal": "x", "__sessionId": "s9"}


def test_inject_context_drops_spoofed_fields_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        out = inject_context(
            {"goal": "x", "__assistantId": "evil", "__session_id": "other"}, ctx_a1
        )
    assert out["__assistantId"] == "a1" and "__session_id" not in out
    assert ToolContext.from_args(out) == ctx_a1
    assert any(
        e["event"] == "spoofed_context_dropped" and e["log_level"] == "warning" for e in logs
    )


def test_a_host_that_only_injects_context_logs_through_its_logging_never_stdout() -> None:
    # A host process that never made a Runtime (its stdout may be a protocol channel) and
    # set up only the standard library's logging (to stderr, its default).
    code = (
        "import logging; logging.basicConfig();"
        "from ctxactors import ToolContext, inject_context;"
        "inject_context('{\"__sessionId\": \"forged\"}', ToolContext('s1'))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith(
        "WARNING:ctxactors.context:spoofed_context_dropped fields=['__sessionId'] "
        "session_id='s1' assistant_id=None thread_id=None"
    )


@pytest.mark.parametrize("bad", ["[1, 2]", "3", "null", "{not json", '"str"'])
def test_inject_context_refuses_non_objects(bad: str) -> None:
    with pytest.raises(InvalidArgumentsError):
        inject_context(bad, ctx_a1)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
llm_keys = st.text(min_size=1, max_size=12).filter(lambda k: not k.startswith("__"))
# Ids every surface can carry: no control characters or lone surrogates, no edge blanks.
ids = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=8).filter(
    lambda s: s == s.strip(" \t")
)
contexts = st.builds(ToolContext, ids, st.none() | ids, st.none() | ids)


@given(st.dictionaries(llm_keys, json_values, max_size=6), contexts)
def test_property_clean_of_injected_is_the_llm_arguments(args: dict, ctx: ToolContext) -> None:
    injected = inject_context(args, ctx)
    assert clean_args(injected) == args
    assert ToolContext.from_args(injected) == ctx
    assert clean_args(inject_context(json.dumps(args), ctx)) == json.loads(json.dumps(args))


@given(
    contexts, contexts, st.sampled_from(list(Scope)), st.text(string.ascii_lowercase, min_size=1)
)
def test_property_distinct_contexts_never_share_a_thread_key(
    a: ToolContext, b: ToolContext, scope: Scope, server: str
) -> None:
    if a != b:
        assert Scope.THREAD.key(server, a) != Scope.THREAD.key(server, b)
    # A coarser scope shares a key exactly when the parts it looks at are equal.
    same_session = a.session_id == b.session_id
    same_assistant = same_session and a.assistant_id == b.assistant_id
    expected = {Scope.SESSION: same_session, Scope.ASSISTANT: same_assistant, Scope.THREAD: a == b}[
        scope
    ]
    assert (scope.key(server, a) == scope.key(server, b)) is expected


def test_keys_do_not_collide_on_separator_tricks() -> None:
    a = ToolContext("a::b", "c")
    b = ToolContext("a", "b::c")
    assert Scope.ASSISTANT.key("p", a) != Scope.ASSISTANT.key("p", b)


@pytest.mark.parametrize(
    "bad",
    ["\ud800", "s\x00", "s\r\nX-Evil: 1", "\x85", "x" * 257, "", " s", "s\t"],
)
@pytest.mark.parametrize("via", ["arguments", "meta"])
def test_an_id_no_surface_can_carry_is_refused_before_anything_runs(bad: str, via: str) -> None:
    with Runtime() as rt:
        for field in ("session", "assistant", "thread"):
            if via == "arguments":
                args: dict[str, Any] = {"goal": "g", f"__{field}Id": bad}
                meta = None
            else:
                args, meta = {"goal": "g"}, {f"ctxactors/{field}Id": bad}
            with pytest.raises(InvalidArgumentsError):
                rt.call("create_goal", args, meta=meta)
        assert rt.stats()["spawned"] == 0


def test_ids_beyond_ascii_are_fine_and_are_one_session() -> None:
    with Runtime() as rt:
        rt.call("create_goal", {"goal": "g", "__sessionId": "café-세션"})
        state = rt.call("get_planning_state", {}, meta={"ctxactors/sessionId": "café-세션"})
        assert [g["goal"] for g in state.structured["goals"]] == ["g"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "must be 1 to 256 characters"),
        ("x" * 257, "must be 1 to 256 characters"),
        ("a\r\nb", "contains the character '\\r', which no header carries"),
        (" s1", "starts or ends with a space or tab"),
    ],
)
def test_a_bad_id_in_meta_is_refused_naming_the_meta_field(value: str, reason: str) -> None:
    with Runtime() as rt, pytest.raises(InvalidArgumentsError) as caught:
        rt.call("create_goal", {"goal": "g"}, meta={"ctxactors/sessionId": value})
    assert str(caught.value) == f"_meta field 'ctxactors/sessionId' {reason}"


def test_an_id_of_exactly_256_characters_is_taken_and_257_refused_naming_the_field() -> None:
    with Runtime() as rt:
        made = rt.call("create_goal", {"__sessionId": "x" * 256, "goal": "g"})
        assert made.structured == {"id": "g1", "goal": "g"}
        with pytest.raises(InvalidArgumentsError) as caught:
            rt.call("create_goal", {"__sessionId": "x" * 257, "goal": "g"})
    assert str(caught.value) == "reserved field '__sessionId' must be 1 to 256 characters"


def test_only_spaces_and_tabs_at_the_ends_of_an_id_are_refused() -> None:
    """What an HTTP header strips; another Unicode space is part of the id."""
    assert check_id("s1\u3000", "session_id") == "s1\u3000"
    assert check_id("XsX", "session_id") == "XsX"  # any other end character is kept
    with pytest.raises(InvalidArgumentsError, match="starts or ends with a space or tab"):
        check_id("s1 ", "session_id")


def test_arguments_as_text_with_a_lone_surrogate_are_refused_saying_where() -> None:
    surrogate = json.loads('"\\ud800"')
    with Runtime() as rt, pytest.raises(InvalidArgumentsError) as caught:
        rt.call("create_goal", '{"goal": "x' + surrogate + '"}')
    assert (
        str(caught.value) == "arguments are not valid text: surrogates not allowed at character 11"
    )
