"""Declaring a server: the published definitions, validation and the refusals, exactly.

The servers here are declared inside the tests (not at import), so the declaration code
runs while each test runs; that is what lets mutation testing reach it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest

from ctxactors import (
    CallTimeoutError,
    DuplicateToolError,
    InvalidArgumentsError,
    Runtime,
    Scope,
    Server,
    ServerDefinitionError,
    Settings,
    ToolContext,
    ToolError,
    tool,
)
from ctxactors.errors import UnknownToolError
from ctxactors.logs import configure_logging, flush_logs
from ctxactors.results import ToolResult
from ctxactors.settings import ActorSettings
from ctxactors.testing import context_args as ctx_args
from ctxactors.tools import collect_tools, input_schema, pick, refuse_context_fields


class Child(msgspec.Struct):
    label: str
    weight: float = 1.0


def declare() -> type[Server]:
    class Kit(Server):
        """A server with one tool of each shape."""

        scope = Scope.ASSISTANT

        @tool
        def plain(
            self,
            ctx: ToolContext,
            text: str,
            count: int = 2,
            tags: list[str] = [],  # noqa: B006 - msgspec copies defaults
            note: str | None = None,
        ) -> dict[str, Any]:
            """Say it.

            Twice."""
            return {
                "text": text,
                "count": count,
                "tags": tags,
                "note": note,
                "who": ctx.assistant_id,
            }

        @tool(name="renamed", title="Nice", read_only=True, open_world=True)
        def ro(self, ctx: ToolContext) -> dict[str, Any]:
            return {}

        @tool(destructive=True, idempotent=True)
        def wipe(
            self,
            ctx: ToolContext,
            *,
            depth: Annotated[int, msgspec.Meta(ge=1, le=5)],
            child: Child | None = None,
        ) -> dict[str, Any]:
            """Wipe."""
            return {"depth": depth, "child": None if child is None else child.label}

    return Kit


WRITE_HINTS = {"destructiveHint": False, "idempotentHint": False, "openWorldHint": False}


def test_definitions_are_exact() -> None:
    kit = declare()
    assert kit.name == "kit"  # the class name, lower-cased, when none is given
    assert list(kit.tools) == ["plain", "renamed", "wipe"]
    assert [s.definition() for s in kit.tools.values()] == [
        {
            "name": "plain",
            "description": "Say it.\n\nTwice.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "count": {"type": "integer", "default": 2},
                    "tags": {"type": "array", "items": {"type": "string"}, "default": []},
                    "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                },
                "required": ["text"],
                "additionalProperties": False,
            },
            "annotations": {"readOnlyHint": False, **WRITE_HINTS},
        },
        {
            "name": "renamed",
            "description": "renamed",  # no docstring: the name
            "inputSchema": {
                "type": "object",
                "properties": {},
                "required": [],
                "additionalProperties": False,
            },
            "annotations": {"readOnlyHint": True, "openWorldHint": True, "title": "Nice"},
        },
        {
            "name": "wipe",
            "description": "Wipe.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "depth": {"type": "integer", "minimum": 1, "maximum": 5},
                    "child": {
                        "anyOf": [{"$ref": "#/$defs/Child"}, {"type": "null"}],
                        "default": None,
                    },
                },
                "required": ["depth"],
                "additionalProperties": False,
                "$defs": {
                    "Child": {
                        "title": "Child",
                        "type": "object",
                        "properties": {
                            "label": {"type": "string"},
                            "weight": {"type": "number", "default": 1.0},
                        },
                        "required": ["label"],
                    }
                },
            },
            "annotations": {
                "readOnlyHint": False,
                "destructiveHint": True,
                "idempotentHint": True,
                "openWorldHint": False,
            },
        },
    ]
    specs = kit.tools
    assert [s.read_only for s in specs.values()] == [False, True, False]
    assert specs["plain"].field_names == ("text", "count", "tags", "note")
    assert specs["plain"].server is kit and repr(specs["wipe"]) == "<ToolSpec kit.wipe>"
    assert specs["plain"].args_type.__name__ == "Kit_plain_args"
    # Each definition is a copy: changing one changes nothing published.
    specs["renamed"].definition()["annotations"]["title"] = "changed"
    assert specs["renamed"].definition()["annotations"]["title"] == "Nice"


def test_calls_validate_strictly_and_run_with_the_defaults() -> None:
    kit = declare()
    with Runtime([kit]) as rt:
        done = rt.call("plain", ctx_args("s", "a1", text="hi"))
        assert done.structured == {"text": "hi", "count": 2, "tags": [], "note": None, "who": "a1"}
        assert rt.call("wipe", ctx_args("s", "a1", depth=5, child={"label": "x"})).structured == {
            "depth": 5,
            "child": "x",
        }
        assert rt.call("renamed", ctx_args("s")).structured == {}
        with pytest.raises(UnknownToolError, match="unknown tool 'ro'"):
            rt.call("ro", ctx_args("s"))
        assert rt.tool_spec("wipe") is kit.tools["wipe"]
        with pytest.raises(UnknownToolError, match="unknown tool 'nope'"):
            rt.tool_spec("nope")
    spec = kit.tools["plain"]
    refusals = {
        "invalid arguments for 'plain': Expected `int`, got `str` - at `$.count`": {
            "text": "x",
            "count": "2",  # strict: no coercion
        },
        "invalid arguments for 'plain': Object missing required field `text`": {},
        "invalid arguments for 'plain': Object contains unknown field `extra`": {
            "text": "x",
            "extra": 1,
        },
    }
    for message, arguments in refusals.items():
        with pytest.raises(InvalidArgumentsError) as caught:
            spec.validate(arguments)
        assert str(caught.value) == message
    with pytest.raises(InvalidArgumentsError, match=r"Expected `int` >= 1 - at `\$.depth`"):
        kit.tools["wipe"].validate({"depth": 0})


def test_a_handler_that_raises_gives_an_error_result_and_the_state_stays() -> None:
    class Fragile(Server):
        name = "fragile"

        def __init__(self) -> None:
            self.n = 0

        @tool
        def bump(self, ctx: ToolContext, fail: bool = False) -> dict[str, Any]:
            """Count, then maybe fail."""
            self.n += 1
            if fail:
                raise KeyboardInterrupt  # a BaseException too
            return {"n": self.n}

    spec = Fragile.tools["bump"]
    server = Fragile()
    result = spec.invoke(server, ToolContext("s"), spec.validate({"fail": True}))
    assert isinstance(result, ToolResult) and result.is_error
    assert spec.invoke(server, ToolContext("s"), spec.validate({})).structured == {"n": 2}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ("session_id: str", "session_id"),
        ("sessionId: str", "sessionId"),
        ("assistant_id: str", "assistant_id"),
        ("Thread_ID: str", "Thread_ID"),
        ("ASSISTANTID: str", "ASSISTANTID"),
        ("inner: Nested", "thread_id"),
        ("many: list[Nested]", "thread_id"),
        ("renamed: Dunder", "__x"),
    ],
)
def test_a_field_that_could_carry_the_context_is_refused(params: str, field: str) -> None:
    source = f'''
class Bad(Server):
    @tool
    def leak(self, ctx: ToolContext, {params}) -> dict[str, Any]:
        """Leak."""
        return {{}}
'''
    with pytest.raises(TypeError) as caught:
        exec(source, {**globals(), "Nested": Nested, "Dunder": Dunder})
    assert str(caught.value) == (
        f"Bad.leak: property {field!r} is reserved for the call context; "
        "take the context from the handler's ctx parameter instead"
    )


class Nested(msgspec.Struct):
    thread_id: str


class Dunder(msgspec.Struct):
    x: str = msgspec.field(name="__x")


def test_context_names_are_refused_anywhere_in_a_schema_and_nowhere_else() -> None:
    refuse_context_fields({"properties": {"session": {}, "assistant": {}, "ids": {}}}, "ok")
    refuse_context_fields([{"properties": {"threads": {}}}, "x", 1], "ok")
    deep = {"anyOf": [{"type": "null"}, {"items": [{"properties": {"threadId": {}}}]}]}
    with pytest.raises(TypeError, match=r"^deep: property 'threadId' is reserved"):
        refuse_context_fields(deep, "deep")


def test_bad_handler_signatures_are_refused_clearly() -> None:
    with pytest.raises(TypeError) as caught:

        class NoCtx(Server):
            @tool
            def f(self) -> dict[str, Any]:
                return {}

    assert str(caught.value) == (
        "tool 'f' of NoCtx: its second parameter must be the call context, "
        "`ctx: ToolContext`; write `def f(self, ctx: ToolContext)`"
    )
    with pytest.raises(TypeError) as caught:

        class NotSelf(Server):
            @tool
            def f(me, ctx: ToolContext) -> dict[str, Any]:  # noqa: N805
                return {}

    assert str(caught.value) == "tool 'f' of NotSelf must take (self, ctx, ...arguments)"
    with pytest.raises(TypeError) as caught:

        class Star(Server):
            @tool
            def f(self, ctx: ToolContext, *rest: str) -> dict[str, Any]:
                return {}

    assert str(caught.value) == "tool 'f': parameter 'rest' must be a named one"


def test_a_tool_without_its_context_parameter_is_refused_saying_what_to_write() -> None:
    # Without the refusal, the context would take `x`'s place and every call would fail
    # with "unknown field 'x'".
    with pytest.raises(ServerDefinitionError) as caught:

        class Notes(Server):
            @tool(name="add")
            def add_note(self, x: int, tags: list[str] | None = None, *, why: str = "") -> dict:
                return {}

    assert str(caught.value) == (
        "tool 'add' of Notes: its second parameter must be the call context, "
        "`ctx: ToolContext`; write `def add_note(self, ctx: ToolContext, x: int, "
        "tags: list[str] | None = None, *, why: str = '')`"
    )
    with pytest.raises(ServerDefinitionError) as caught:

        class Typed(Server):
            @tool
            async def ask(self, ctx: dict[str, Any], q: str) -> dict[str, Any]:
                return {}

    assert str(caught.value) == (
        "tool 'ask' of Typed: its second parameter must be the call context, "
        "`ctx: ToolContext`; write `async def ask(self, ctx: ToolContext, q: str)`"
    )

    class Fine(Server):
        @tool
        def unannotated(self, ctx, q: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
            return {"session": ctx.session_id, "q": q}

        @tool
        def renamed(self, context: ToolContext, q: str) -> dict[str, Any]:
            return {"session": context.session_id, "q": q}

    with Runtime([Fine]) as rt:
        for name in ("unannotated", "renamed"):
            result = rt.call(name, ctx_args("s1", q="hi"))
            assert result.structured == {"session": "s1", "q": "hi"}


def test_subclasses_inherit_and_override_tools() -> None:
    base = declare()

    class More(base):  # type: ignore[valid-type, misc]
        name = "more"

        @tool(read_only=True)
        def plain(self, ctx: ToolContext) -> dict[str, Any]:
            """Replaced."""
            return {}

    assert list(More.tools) == ["plain", "renamed", "wipe"]
    assert More.tools["plain"].description == "Replaced."
    assert More.tools["plain"].server is More and More.tools["wipe"].server is More
    assert base.tools["plain"].description == "Say it.\n\nTwice."


def test_collect_tools_refuses_duplicates_and_non_servers() -> None:
    kit = declare()
    other = declare()
    assert list(collect_tools([kit])) == ["plain", "renamed", "wipe"]
    with pytest.raises(ValueError) as caught:
        collect_tools([kit, other])
    assert str(caught.value) == "duplicate tool name 'plain': declared by both Kit and Kit"
    with pytest.raises(TypeError, match=r"^<class 'int'> is not a Server subclass$"):
        collect_tools([int])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="is not a Server subclass"):
        collect_tools([kit.tools["plain"]])  # type: ignore[list-item]


def test_pick_copies_present_fields_under_new_names() -> None:
    extract = pick(made="id", count="n", gone="missing", empty="none")
    result = ToolResult.ok({"id": "g1", "n": 0, "none": None})
    assert extract({}, result) == {"made": "g1", "count": 0}
    assert extract({}, ToolResult.error("failed")) == {}


def test_input_schema_of_a_struct_inlines_its_reference() -> None:
    assert input_schema(Child) == {
        "type": "object",
        "properties": {"label": {"type": "string"}, "weight": {"type": "number", "default": 1.0}},
        "required": ["label"],
    }


def test_the_unified_listing_names_every_action_with_its_arguments() -> None:
    class Extra(Server):
        @tool
        def mix(
            self,
            ctx: ToolContext,
            anything: Any,
            rows: list[Child] = [],  # noqa: B006 - msgspec copies defaults
            grid: list[list[int]] | None = None,
            bag: list[Any] = [],  # noqa: B006 - msgspec copies defaults
        ) -> dict[str, Any]:
            """First line
            goes on.

            Not in the summary."""
            return {}

    with Runtime([declare(), Extra], tools="unified") as rt:
        listed = rt.list_tools()
        assert rt.call("mix", ctx_args("s", anything=1)).structured == {}  # still callable
    assert [t["name"] for t in listed] == ["batch", "save_preset", "list_presets", "run_preset"]
    assert listed[0]["description"].startswith("Run many tool calls in one call.")
    catalog = listed[0]["description"].split(
        "\n\nCategories and actions (category: action{arguments}, ? = optional):\n", 1
    )[1]
    assert catalog.splitlines()[:2] == [
        "- kit: plain{text: string, count?: integer, tags?: string[], note?: string|null} "
        "(Say it.); renamed{} (renamed); wipe{depth: integer, child?: object|null} (Wipe.)",
        "- extra: mix{anything: any, rows?: object[], grid?: integer[][]|null, bag?: any[]} "
        "(First line goes on.)",
    ]
    assert catalog.splitlines()[2].startswith("- history: get_recent_context{limit?: integer, ")
    assert len(catalog.splitlines()) == 3  # the batch and preset tools are not listed


def test_an_explicit_name_is_kept_and_extract_and_compensate_are_carried() -> None:
    def undo(self: Any, ctx: ToolContext, args: Any, result: dict[str, Any]) -> None:
        """Nothing to undo."""

    extract = pick(made="id")

    class Named(Server):
        name = "explicit-name"

        @tool(extract=extract, compensate=undo)
        def make(self, ctx: ToolContext) -> dict[str, Any]:
            """Make."""
            return {"id": "m1"}

    assert Named.name == "explicit-name"
    spec = Named.tools["make"]
    assert spec.extract is extract and spec.compensate is undo
    assert declare().tools["plain"].extract is None
    assert declare().tools["plain"].compensate is None
    with Runtime([Named]) as rt:
        rt.call("make", ctx_args("s"))
        (op,) = rt.call("get_recent_context", ctx_args("s")).structured["operations"]
        assert op["metadata"] == {"made": "m1"}
        assert rt._registry.keys()[0][0] == "explicit-name"


def test_unannotated_keyword_only_and_module_details_of_the_args_type() -> None:
    class Loose(Server):
        @tool
        def take(self, ctx: ToolContext, anything, first: int = 1, *, last: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]  # noqa: ANN001
            """An unannotated argument takes any value; a required one may follow an optional."""
            return {"anything": anything, "first": first, "last": last}

    spec = Loose.tools["take"]
    assert spec.args_type.__module__ == __name__
    assert spec.input_schema["properties"]["anything"] == {}
    assert spec.input_schema["required"] == ["anything", "last"]
    with Runtime([Loose]) as rt:
        done = rt.call("take", ctx_args("s", anything=[1, {"a": None}], last="z"))
    assert done.structured == {"anything": [1, {"a": None}], "first": 1, "last": "z"}


def test_a_spoofed_context_field_is_dropped_with_a_warning_naming_it() -> None:
    from structlog.testing import capture_logs

    from ctxactors import inject_context

    with capture_logs() as logs:
        out = inject_context(
            {"goal": "x", "__sessionId": "victim", "__other": 1}, ToolContext("s1", "a1", "t1")
        )
    assert out == {"goal": "x", "__sessionId": "s1", "__assistantId": "a1", "__threadId": "t1"}
    assert logs == [
        {
            "logger": "ctxactors.context",
            "event": "spoofed_context_dropped",
            "log_level": "warning",
            "fields": ["__other", "__sessionId"],
            "session_id": "s1",
            "assistant_id": "a1",
            "thread_id": "t1",
        }
    ]


def test_two_tools_of_one_name_in_one_server_class_are_refused() -> None:
    with pytest.raises(DuplicateToolError) as caught:

        class Twice(Server):
            @tool(name="save")
            def save_text(self, ctx: ToolContext, text: str) -> str:
                return text

            @tool
            def save(self, ctx: ToolContext, data: int) -> int:
                return data

    assert str(caught.value) == (
        "duplicate tool name 'save' in Twice: declared by both its methods 'save_text' and 'save'"
    )
    # Also a ValueError, as the duplicate across servers always was.
    assert isinstance(caught.value, ValueError)


def test_a_subclass_overriding_a_tools_method_replaces_the_tool() -> None:
    class Base(Server):
        @tool
        def greet(self, ctx: ToolContext) -> str:
            """Hello."""
            return "base"

        @tool
        def other(self, ctx: ToolContext) -> str:
            return "other"

    class Child(Base):
        @tool
        def greet(self, ctx: ToolContext, loud: bool = False) -> str:
            """Hello, louder."""
            return "CHILD" if loud else "child"

    assert list(Child.tools) == ["greet", "other"]
    assert Child.tools["greet"].description == "Hello, louder."
    assert Child.tools["greet"].field_names == ("loud",)


def test_a_server_declared_at_run_time_checks_keys_under_untyped_values() -> None:
    class Loose(Server):
        name = "loose"
        scope = Scope.SESSION

        @tool
        def keep(self, ctx: ToolContext, data: dict[str, Any]) -> dict[str, Any]:
            """Keep an untyped object."""
            return {"data": data}

    with Runtime([Loose]) as rt:
        with pytest.raises(InvalidArgumentsError) as caught:
            rt.call("keep", ctx_args("s", data={"a": {1: "x"}}))
        assert str(caught.value) == (
            "invalid arguments for 'keep': object keys must be strings, got int - at `$.data.a`"
        )
        kept = rt.call("keep", ctx_args("s", data={"a": {"1": "é"}}))
        assert kept.structured == {"data": {"a": {"1": "é"}}}


def test_a_server_without_a_state_type_says_it_is_not_durable() -> None:
    server = declare()()
    with pytest.raises(NotImplementedError) as caught:
        server.snapshot()
    assert str(caught.value) == "Kit is not durable"
    with pytest.raises(NotImplementedError) as caught:
        server.restore(None)
    assert str(caught.value) == "Kit is not durable"


def test_an_async_generator_tool_is_refused_saying_what_to_write() -> None:
    with pytest.raises(ServerDefinitionError) as caught:

        class Streams(Server):
            @tool
            async def chunks(self, ctx: ToolContext) -> Any:
                yield {}

    assert str(caught.value) == (
        "tool 'chunks' of Streams is an async generator: a tool returns one result; make it "
        "an `async def` that returns it"
    )


def test_a_context_parameter_that_is_not_second_and_positional_is_refused() -> None:
    with pytest.raises(ServerDefinitionError) as caught:

        class KeywordOnly(Server):
            @tool
            def f(self, *, ctx: ToolContext, text: str) -> dict[str, Any]:
                return {}

    assert str(caught.value) == (
        "tool 'f' of KeywordOnly: its second parameter must be the call context, "
        "`ctx: ToolContext`; write `def f(self, ctx: ToolContext, *, text: str)`"
    )
    with pytest.raises(ServerDefinitionError) as caught:

        class Mistyped(Server):
            @tool
            def f(self, ctx: int) -> dict[str, Any]:
                return {}

    assert str(caught.value) == (
        "tool 'f' of Mistyped: its second parameter must be the call context, "
        "`ctx: ToolContext`; write `def f(self, ctx: ToolContext)`"
    )
    with pytest.raises(ServerDefinitionError) as caught:

        class Unannotated(Server):
            @tool
            def f(self, text, count: int = 1):  # type: ignore[no-untyped-def]
                return {}

    assert str(caught.value) == (
        "tool 'f' of Unannotated: its second parameter must be the call context, "
        "`ctx: ToolContext`; write `def f(self, ctx: ToolContext, text, count: int = 1)`"
    )


def debug_lines(log: Path) -> list[dict[str, Any]]:
    """The log's tool lines, without what changes from run to run (times, tracebacks but
    their last line)."""
    flush_logs()
    lines = []
    for text in log.read_text().splitlines():
        line = json.loads(text)
        if line["event"] in ("tool_call", "tool_raised"):
            line.pop("timestamp")
            line.pop("duration_ms", None)
            if "exception" in line:
                line["exception"] = line["exception"].splitlines()[-1]
            lines.append(line)
    return lines


def test_async_tools_answer_fail_and_are_cancelled_like_sync_ones(tmp_path: Path) -> None:
    """On the worker pool an async tool's coroutine is started, parked and its value made
    into a result later: each outcome as a sync tool's, and a raise logged at debug."""

    class Waits(Server):
        name = "waits"

        def __init__(self) -> None:
            self.n = 0

        @tool
        async def count(self, ctx: ToolContext, by: int) -> dict[str, Any]:
            await asyncio.sleep(0)
            self.n += by
            return {"n": self.n, "thread": ctx.thread_id}

        @tool
        async def say(self, ctx: ToolContext, text: str) -> str:
            return text + "\ud800"  # a lone surrogate: no JSON encoder can write it

        @tool
        async def odd(self, ctx: ToolContext) -> dict[str, Any]:
            return {"x": object()}

        @tool
        async def fail(self, ctx: ToolContext) -> dict[str, Any]:
            raise ValueError("bad \ud800")

        @tool
        async def refuse(self, ctx: ToolContext) -> dict[str, Any]:
            raise ToolError("not now")

        @tool
        async def hang(self, ctx: ToolContext) -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

    log = tmp_path / "debug.log"
    configure_logging(file=str(log), level="debug", force=True)
    args = {"session": "s1", "assistant": "a1", "thread": "t1"}
    with Runtime([Waits]) as rt:

        def call(tool: str, **more: Any) -> ToolResult:
            return rt.call(tool, ctx_args(**args, **more), principal="p1", timeout=30)

        assert call("count", by=2).structured == {"n": 2, "thread": "t1"}
        assert call("say", text="hi").text == (
            "tool 'say' returned a bad result: the result cannot be encoded as JSON ('utf-8' "
            "codec can't encode character '\\ud800' in position 2: surrogates not allowed)"
        )
        assert call("odd").text == "TypeError: Encoding objects of type object is unsupported"
        assert call("fail").text == "ValueError: bad \\ud800"
        assert call("refuse").text == "not now"
        with pytest.raises(CallTimeoutError):
            rt.call("hang", ctx_args(**args), principal="p1", timeout=0.2)
        assert call("count", by=1).structured == {"n": 3, "thread": "t1"}  # after the unwind
    ctx = {"principal": "p1", "session_id": "s1", "assistant_id": "a1", "thread_id": "t1"}
    call_line = {"logger": "ctxactors", **ctx, "event": "tool_call", "level": "info"}
    assert debug_lines(log) == [
        {**call_line, "tool": "count", "outcome": "ok"},
        {
            **call_line,
            "tool": "say",
            "outcome": "error",
            "error": "tool 'say' returned a bad result: the result cannot be encoded as JSON "
            "('utf-8' codec can't encode character '\\ud800' in position 2: surrogates not "
            "allowed)",
        },
        # The encoder's refusal is the result's, not the handler's: nothing to trace.
        {
            **call_line,
            "tool": "odd",
            "outcome": "error",
            "error": "TypeError: Encoding objects of type object is unsupported",
        },
        {
            "logger": "ctxactors.tools",
            "tool": "fail",
            **ctx,
            "event": "tool_raised",
            "level": "debug",
            "exception": "ValueError: bad \ud800",
        },
        {**call_line, "tool": "fail", "outcome": "error", "error": "ValueError: bad \\ud800"},
        {**call_line, "tool": "refuse", "outcome": "error", "error": "not now"},  # no trace
        {
            **call_line,
            "tool": "hang",
            "outcome": "error",
            "error": "the tool was cancelled: its caller's deadline passed",
        },
        {**call_line, "tool": "count", "outcome": "ok"},
    ]


def test_a_sync_tool_that_raises_is_logged_with_its_whole_context(tmp_path: Path) -> None:
    class Breaks(Server):
        name = "breaks"

        @tool
        def divide(self, ctx: ToolContext, by: int) -> dict[str, Any]:
            return {"half": 1 // by}

    log = tmp_path / "debug.log"
    configure_logging(file=str(log), level="debug", force=True)
    with Runtime([Breaks]) as rt:
        assert rt.call("divide", ctx_args("s1", "a1", "t1", by=0), principal="p1").is_error
    assert debug_lines(log)[0] == {
        "logger": "ctxactors.tools",
        "tool": "divide",
        "principal": "p1",
        "session_id": "s1",
        "assistant_id": "a1",
        "thread_id": "t1",
        "event": "tool_raised",
        "level": "debug",
        "exception": "ZeroDivisionError: integer division or modulo by zero",
    }


def test_a_blocking_tool_holds_none_of_the_workers() -> None:
    """With one worker, a tool declared blocking waits on a gate another key's call opens:
    run on that worker instead, it would keep the opening call from running until the gate
    gave up. Called from an event loop, so both calls go to the workers (a plain sync
    call to an idle key runs on its caller's thread)."""
    entered, gate = threading.Event(), threading.Event()

    class Gated(Server):
        name = "gated"

        @tool(blocking=True)
        def wait(self, ctx: ToolContext) -> dict[str, Any]:
            entered.set()
            return {"opened": gate.wait(20)}

        @tool
        def open(self, ctx: ToolContext) -> dict[str, Any]:
            gate.set()
            return {"opened": True}

    async def both(rt: Runtime) -> list[Any]:
        waiting = asyncio.ensure_future(rt.acall("wait", ctx_args("s1")))
        assert await asyncio.to_thread(entered.wait, 20)  # it runs: now open the gate
        # Generous: a loaded machine's scheduling, not the behaviour, sets this bound.
        opened = await rt.acall("open", ctx_args("s2"), timeout=15)
        return [opened.structured, (await waiting).structured]

    with Runtime([Gated], settings=Settings(actors=ActorSettings(workers=1))) as rt:
        assert asyncio.run(both(rt)) == [{"opened": True}, {"opened": True}]
