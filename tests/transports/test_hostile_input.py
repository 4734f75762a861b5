"""Hostile input never poisons state: what the JSON encoder can't write is refused up front.

A Python host that parses a model's arguments with ``json.loads`` hands over whatever the
JSON held, lone surrogates included (msgspec and pydantic refuse those at parse time, so the
REST and MCP transports never see one; the embedded runtime does). Once stored, such a value
breaks every later answer that includes it, for the whole session.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.encodable import argument_problem, may_hold_untyped
from ctxactors.errors import InvalidArgumentsError, ToolError
from ctxactors.results import ToolResult
from ctxactors.servers import BUILTIN, Content, Planning
from ctxactors.testing import context_args as ctx_args

SURROGATE = json.loads('"\\ud800"')  # what a host's json.loads gives for "\ud800"
SURROGATE_ERROR = (
    "'utf-8' codec can't encode character '\\ud800' in position {}: surrogates not allowed"
)


def nested(leaf: Any, depth: int) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


class Echo(Server):
    """Tools that take untyped values, and handlers that return what can't be encoded."""

    name = "echo"
    scope = Scope.SESSION

    @tool
    def keep(self, ctx: ToolContext, data: dict[str, Any]) -> dict[str, Any]:
        """Echo an untyped object."""
        return {"data": data}

    @tool
    def counts(self, ctx: ToolContext, data: dict[str, int]) -> dict[str, Any]:
        """Echo a typed object."""
        return {"data": data}

    @tool
    def bad_dict(self, ctx: ToolContext) -> dict[str, Any]:
        """Return a surrogate inside a dict."""
        return {"text": SURROGATE}

    @tool
    def bad_text(self, ctx: ToolContext) -> str:
        """Return a surrogate as plain text."""
        return f"x{SURROGATE}"

    @tool
    def bad_result(self, ctx: ToolContext) -> ToolResult:
        """Build a ToolResult by hand with a surrogate in its structured part."""
        return ToolResult(content=[], structured={"id": SURROGATE})

    @tool
    def bad_object(self, ctx: ToolContext) -> ToolResult:
        """Build a ToolResult by hand with an object the encoder doesn't know."""
        return ToolResult(content=[], structured={"id": object()})

    @tool
    def deep_result(self, ctx: ToolContext) -> ToolResult:
        """Build a ToolResult by hand nested deeper than the encoder goes."""
        return ToolResult(content=[], structured={"x": nested("leaf", 100_000)})

    @tool
    def bad_error(self, ctx: ToolContext) -> None:
        """Fail with a message holding a surrogate."""
        raise ToolError(f"no such thing: {SURROGATE}")


@pytest.fixture
def rt() -> Iterator[Runtime]:
    with Runtime(servers=[*BUILTIN, Echo]) as runtime:
        yield runtime


def refused(rt: Runtime, tool: str, args: dict[Any, Any]) -> str:
    with pytest.raises(InvalidArgumentsError) as info:
        rt.call(tool, args)
    return str(info.value)


def session_still_answers(rt: Runtime, assistant: str | None = None) -> dict[str, Any]:
    """Every read of the session works and its answer encodes; returns them by tool."""
    answers = {}
    reads: dict[str, dict[str, Any]] = {
        "get_recent_context": {"limit": 50},
        "get_planning_state": {},
        "list_playbooks": {},
        "list_content": {},
    }
    for name, args in reads.items():
        result = rt.call(name, ctx_args("s1", assistant, **args))
        assert not result.is_error, result.text
        msgspec.json.encode(result.to_mcp())  # the transports can send it
        answers[name] = result.structured
    return answers


def test_a_lone_surrogate_is_refused_and_the_session_keeps_working(rt: Runtime) -> None:
    rt.call("create_goal", ctx_args("s1", "A", goal="before"))
    message = refused(rt, "create_goal", ctx_args("s1", "A", goal=f"Learn {SURROGATE}"))
    assert message == (
        "invalid arguments for 'create_goal': a string holds a lone surrogate "
        "(not valid Unicode) - at `$.goal`"
    )
    assert "lone surrogate" in refused(
        rt, "create_playbook", ctx_args("s1", "A", name="p", steps=["ok", SURROGATE])
    )
    answers = session_still_answers(rt, "A")
    assert answers["get_planning_state"] == {"goals": [{"id": "g1", "goal": "before"}], "todos": []}
    assert answers["list_playbooks"] == {"playbooks": []}
    assert [op["tool"] for op in answers["get_recent_context"]["operations"]] == ["create_goal"]


def test_acall_refuses_it_too(rt: Runtime) -> None:
    with pytest.raises(InvalidArgumentsError, match="lone surrogate"):
        asyncio.run(rt.acall("create_goal", ctx_args("s1", goal=SURROGATE)))


@pytest.mark.parametrize(
    ("tool", "args", "where"),
    [
        (
            "batch",
            {"operations": [{"tool": "create_goal", "arguments": {"goal": SURROGATE}}]},
            "$.operations[0].arguments.goal",
        ),
        (
            "save_preset",
            {"name": "p", "operations": [{"tool": "add_todo", "arguments": {"name": SURROGATE}}]},
            "$.operations[0].arguments.name",
        ),
        (
            "run_preset",
            {"name": "p", "params": {"goal": [1, {"x": SURROGATE}]}},
            "$.params.goal[1].x",
        ),
        ("keep", {"data": {SURROGATE: 1}}, "$.data"),
    ],
)
def test_batches_presets_and_untyped_values_are_checked_at_any_depth(
    rt: Runtime, tool: str, args: dict[str, Any], where: str
) -> None:
    assert (
        rt.call(
            "save_preset",
            ctx_args(
                "s1",
                name="p",
                operations=[{"tool": "create_goal", "arguments": {"goal": "{{goal}}"}}],
                params=["goal"],
            ),
        ).is_error
        is False
    )
    message = refused(rt, tool, ctx_args("s1", **args))
    assert message.endswith(f"- at `{where}`") and "surrogate" in message
    answers = session_still_answers(rt)
    assert answers["get_planning_state"] == {"goals": [], "todos": []}
    assert [op["tool"] for op in answers["get_recent_context"]["operations"]] == ["save_preset"]


def test_non_string_keys_are_refused_at_any_depth(rt: Runtime) -> None:
    assert refused(rt, "keep", ctx_args("s1", data={"a": [{"b": {1: "one"}}]})) == (
        "invalid arguments for 'keep': object keys must be strings, got int - at `$.data.a[0].b`"
    )
    assert "got tuple" in refused(rt, "keep", ctx_args("s1", data={(1, 2): "pair"}))
    ops = [{"tool": "keep", "arguments": {"data": {"x": {None: 1}}}}]
    assert "got NoneType - at `$.operations[0].arguments.data.x`" in refused(
        rt, "batch", ctx_args("s1", operations=ops)
    )
    assert "Expected `str` - at `key` in `$`" in refused(rt, "create_goal", {1: "x", "goal": "g"})
    with pytest.raises(InvalidArgumentsError, match="at `key` in `\\$`"):  # with _meta too
        rt.call("create_goal", {1: "x", "goal": "g"}, meta={"ctxactors/sessionId": "s1"})
    # Under a typed field msgspec refuses the key itself, in its own words.
    assert refused(rt, "counts", ctx_args("s1", data={1: 2})) == (
        "invalid arguments for 'counts': Expected `str`, got `int` - at `key` in `$.data`"
    )
    kept = rt.call("keep", ctx_args("s1", data={"a": [{"b": {"c": 1}}], "é": "ü"}))
    assert kept.structured == {"data": {"a": [{"b": {"c": 1}}], "é": "ü"}}


def test_a_top_level_key_with_a_lone_surrogate_is_refused_saying_where(rt: Runtime) -> None:
    """Found by the fuzz test: msgspec's message about an unknown key failed to encode it."""
    message = refused(rt, "create_goal", ctx_args("s1", goal="g", **{"\ud800": None}))
    assert message.startswith("invalid arguments for 'create_goal': ") and "surrogate" in message
    mixed = refused(rt, "add_content", {"\ud800": None, "__sessionId": "f1", 0: "non-string key"})
    assert mixed.startswith("invalid arguments for 'add_content': ")
    assert session_still_answers(rt)["get_planning_state"] == {"goals": [], "todos": []}


def test_values_the_encoder_does_not_know_are_refused(rt: Runtime) -> None:
    assert refused(rt, "keep", ctx_args("s1", data={"x": [object()]})) == (
        "invalid arguments for 'keep': a value of type object cannot be encoded as JSON"
        " - at `$.data.x[0]`"
    )
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = [deep]
    assert "nested too deeply" in refused(rt, "keep", ctx_args("s1", data={"x": deep}))
    assert session_still_answers(rt)["get_recent_context"]["operations"] == []


@pytest.mark.parametrize(
    ("tool", "message"),
    [
        ("bad_dict", f"UnicodeEncodeError: {SURROGATE_ERROR.format(0)}"),
        (
            "bad_text",
            "tool 'bad_text' returned a bad result: the result cannot be encoded as JSON "
            f"({SURROGATE_ERROR.format(1)})",
        ),
        (
            "bad_result",
            "tool 'bad_result' returned a bad result: the result cannot be encoded as JSON "
            f"({SURROGATE_ERROR.format(0)})",
        ),
        (
            "bad_object",
            "tool 'bad_object' returned a bad result: the result cannot be encoded as JSON "
            "(Encoding objects of type object is unsupported)",
        ),
        (
            "deep_result",
            "tool 'deep_result' returned a bad result: the result is nested too deeply",
        ),
        ("bad_error", "no such thing: \\ud800"),
    ],
)
def test_a_result_the_encoder_cant_write_is_an_error_result(
    rt: Runtime, tool: str, message: str
) -> None:
    result = rt.call(tool, ctx_args("s1"))
    assert result.is_error and result.text == message, result.text
    msgspec.json.encode(result.to_mcp())
    ops = session_still_answers(rt)["get_recent_context"]["operations"]
    assert [(op["tool"], op["is_error"]) for op in ops] == [(tool, True)]


def test_plain_arguments_are_proved_safe_without_encoding(rt: Runtime) -> None:
    """The fast path: numbers and ASCII strings need no encoder (a 4 MiB upload included)."""
    plain = {"n": 1, "x": 1.5, "b": True, "z": None, "s": "a" * (4 << 20)}
    assert argument_problem(plain, untyped=True) is None
    assert argument_problem({"s": "한국어 é"}, untyped=False) is None
    assert argument_problem({"s": SURROGATE}, untyped=False) is not None
    # Only where msgspec leaves values unchecked are nested keys walked.
    untyped = {name: may_hold_untyped(rt.tool_spec(name).args_type) for name in rt.tools}
    assert sorted(name for name, flag in untyped.items() if flag) == [
        "batch",
        "keep",
        "run_preset",
        "save_preset",
    ]


def test_the_walk_names_the_value_at_fault_not_a_valid_non_ascii_string_before_it() -> None:
    """Valid non-ASCII keys and values are walked past (the walk pops the last one first)."""
    assert argument_problem({"a": object(), "b": "é"}, untyped=False) == (
        "a value of type object cannot be encoded as JSON - at `$.a`"
    )
    assert argument_problem({"ü": [1, object()]}, untyped=False) == (
        "a value of type object cannot be encoded as JSON - at `$.ü[1]`"
    )


@pytest.mark.parametrize(("length", "shown"), [(80, "k" * 80), (81, "k" * 80 + "…")])
def test_a_long_key_in_a_path_is_cut_at_80_characters(length: int, shown: str) -> None:
    assert argument_problem({"k" * length: SURROGATE}, untyped=False) == (
        f"a string holds a lone surrogate (not valid Unicode) - at `$.{shown}`"
    )
    assert argument_problem({"data": {"k" * length: {1: 2}}}, untyped=True) == (
        f"object keys must be strings, got int - at `$.data.{shown}`"
    )


def test_a_non_string_key_is_refused_at_every_depth_up_to_the_encoders_limit() -> None:
    """Nested one level short of the limit, the arguments encode but decoding them again
    (one call deeper) hits the limit: the key must still be found, not waved through."""
    limit = sys.getrecursionlimit()
    for depth in range(limit - 150, limit + 5):
        problem = argument_problem({"x": nested({1: "v"}, depth)}, untyped=True)
        assert problem is not None, depth
        assert problem == "arguments are nested too deeply" or problem.startswith(
            "object keys must be strings, got int - at `$.x[0]"
        ), (depth, problem[:80])


class Point:
    """A host's own type: msgspec leaves what it holds unchecked."""


class Node(msgspec.Struct):
    data: Any
    children: list[Node]


class Tree(msgspec.Struct):
    label: str
    children: list[Tree]


@pytest.mark.parametrize(
    ("args_type", "untyped"),
    [
        (Node, True),  # Any after a class already seen
        (Tree, False),  # recursive, no Any: the walk ends
        (dict[int, str], True),  # int keys are written as strings
        (dict[str, int], False),
        (tuple[int, str], False),
        (tuple[int, Any], True),
        (tuple[int, ...], False),
        (list[Point], True),
        (Point | None, True),
    ],
)
def test_may_hold_untyped_finds_what_msgspec_does_not_check(args_type: Any, untyped: bool) -> None:
    assert may_hold_untyped(args_type) is untyped


def test_an_int_the_encoder_cant_write_is_refused_and_the_history_keeps_answering() -> None:
    """An embedded host's int of 5,000 digits once ran, was recorded, and broke every later
    history answer of its session."""
    with Runtime(servers=[Content]) as runtime:
        with pytest.raises(InvalidArgumentsError) as caught:
            runtime.call("search_content", ctx_args("s1", query="a", limit=10**5000))
        assert str(caught.value).endswith("- at `$.limit`")
        history = runtime.call("get_recent_context", ctx_args("s1"))
        assert not history.is_error and history.structured == {"operations": [], "count": 0}


def test_spoofed_field_names_are_logged_cut_short() -> None:
    """A model chooses the names: a megabyte name must not become a megabyte log line."""
    names = {f"__{i:02d}" + "x" * 100_000: 1 for i in range(40)}
    with capture_logs() as logs, Runtime(servers=[Planning]) as runtime:
        runtime.call("get_planning_state", names, meta={"ctxactors/sessionId": "s1"})
    [line] = [e for e in logs if e["event"] == "spoofed_context_dropped"]
    assert line["fields"] == [f"__{i:02d}" + "x" * 60 for i in range(16)]
