"""Details of the built-in servers that callers depend on, asserted exactly: what a delete
returns, byte accounting after deletes, each server's undo inside a transactional batch,
the history's timestamps, filters, settings and age limit."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from ctxactors import Runtime, Server, ToolContext, tool
from ctxactors.servers import BUILTIN
from ctxactors.servers.history import (
    MAX_DEPTH,
    MAX_ITEMS,
    MAX_STRING,
    HistoryConfig,
    compact,
    generic_metadata,
)
from ctxactors.settings import (
    ContentSettings,
    HistorySettings,
    PlanningSettings,
    PlaybooksSettings,
    Settings,
)
from ctxactors.state import MemoryStore
from ctxactors.testing import ManualClock
from ctxactors.testing import context_args as ctx_args


@pytest.fixture
def rt(workspace_root: str, rt_settings: Settings) -> Iterator[Runtime]:
    workspace = msgspec.structs.replace(rt_settings.workspace, root=workspace_root)
    with Runtime(settings=msgspec.structs.replace(rt_settings, workspace=workspace)) as runtime:
        yield runtime


def ok(rt: Runtime, tool: str, session: str = "s", **args: Any) -> Any:
    result = rt.call(tool, ctx_args(session, "a1", **args))
    assert not result.is_error, result.text
    return result.structured


def transaction(rt: Runtime, *ops: dict[str, Any]) -> list[str]:
    """Run `ops` then a failing operation as one transaction; the statuses."""
    failing = {"tool": "mark_todo", "arguments": {"todo_id": "missing"}}
    options = {"transactional": True}
    result = rt.call("batch", ctx_args("s", "a1", operations=[*ops, failing], options=options))
    assert result.structured is not None, result.text
    return [r["status"] for r in result.structured["results"]]


@pytest.mark.parametrize("rt_settings", [Settings(content=ContentSettings(max_session_bytes=12))])
def test_delete_says_what_it_deleted_and_frees_its_bytes(rt: Runtime) -> None:
    ok(rt, "add_content", filename="four", content="4444")
    ok(rt, "add_content", filename="eight", content="88888888")
    assert ok(rt, "delete_content", id="c1") == {"id": "c1", "filename": "four", "deleted": True}
    ok(rt, "add_content", filename="four again", content="4444")  # 8 + 4 = 12: fits
    full = rt.call("add_content", ctx_args("s", filename="one", content="1"))
    assert full.is_error and full.text == (
        "content store full: 12 of 12 bytes used, 'one' needs 1 more; delete something first"
    )
    missing = rt.call("delete_content", ctx_args("s", id="c1"))
    assert missing.is_error and missing.text == "content 'c1' not found"


def test_an_undone_delete_puts_the_document_back_in_its_place(rt: Runtime) -> None:
    for i in range(1, 12):
        ok(rt, "add_content", filename=f"f{i}", content=f"text {i}")
    delete = {"tool": "delete_content", "arguments": {"id": "c2"}}
    assert transaction(rt, delete) == ["rolled_back", "failed"]
    listed = ok(rt, "list_content")
    assert [item["id"] for item in listed["items"]] == [f"c{i}" for i in range(1, 12)]
    assert ok(rt, "read_content", id="c2") == {"id": "c2", "filename": "f2", "content": "text 2"}
    assert [r["id"] for r in ok(rt, "search_content", query="text 2")["results"]] == ["c2"]


def test_an_undone_add_removes_the_document_and_its_bytes(rt: Runtime) -> None:
    add = {"tool": "add_content", "arguments": {"filename": "tmp", "content": "scratch"}}
    assert transaction(rt, add) == ["rolled_back", "failed"]
    assert ok(rt, "list_content") == {"items": [], "count": 0}
    assert ok(rt, "search_content", query="scratch") == {"results": [], "count": 0}


def test_undone_planning_and_playbook_writes_leave_no_trace(rt: Runtime) -> None:
    todo = ok(rt, "add_todo", name="done already")["id"]
    ok(rt, "mark_todo", todo_id=todo)
    assert ok(rt, "get_planning_state")["todos"][0]["done"] is True
    undo = [
        {"tool": "mark_todo", "arguments": {"todo_id": todo, "done": False}},
        {"tool": "create_goal", "arguments": {"goal": "g"}},
        {"tool": "add_todo", "arguments": {"name": "t"}},
        {"tool": "create_playbook", "arguments": {"name": "p"}},
    ]
    assert transaction(rt, *undo) == ["rolled_back"] * 4 + ["failed"]
    state = ok(rt, "get_planning_state")
    assert state == {
        "goals": [],
        "todos": [{"id": todo, "name": "done already", "goal_id": None, "done": True}],
    }
    assert ok(rt, "list_playbooks") == {"playbooks": []}
    refused = rt.call("select_playbook", ctx_args("s", "a1", id="pb1"))
    assert refused.is_error and refused.text == "playbook 'pb1' not found"


def test_an_undone_command_is_killed_and_forgotten(rt: Runtime) -> None:
    start = {"tool": "execute_command", "arguments": {"command": "exec sleep 30"}}
    assert transaction(rt, start) == ["rolled_back", "failed"]
    assert ok(rt, "list_processes") == {"processes": [], "count": 0}


def test_history_timestamps_are_utc_milliseconds(rt: Runtime) -> None:
    ok(rt, "create_goal", goal="x")
    (op,) = ok(rt, "get_recent_context")["operations"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", op["timestamp"]), op


def test_history_default_limit_and_a_single_name_filter(rt: Runtime) -> None:
    for i in range(7):
        ok(rt, "create_goal", goal=f"g{i}")
    ok(rt, "add_todo", name="t")
    recent = ok(rt, "get_recent_context")["operations"]
    assert [op["tool"] for op in recent] == ["add_todo"] + ["create_goal"] * 4
    only = ok(rt, "get_recent_context", tool_filter="create_goal", limit=50)["operations"]
    assert [op["arguments"]["goal"] for op in only] == [f"g{i}" for i in reversed(range(7))]


def test_history_bounds_are_settings_aged_by_the_runtimes_clock(clock: ManualClock) -> None:
    limits = Settings(history=HistorySettings(max_operations=3, ttl=10))
    with Runtime(clock=clock, settings=limits) as rt:
        for i in range(4):
            ok(rt, "create_goal", goal=f"g{i}")
            clock.advance(1)
        kept = ok(rt, "get_recent_context", limit=50)["operations"]
        assert [op["arguments"]["goal"] for op in kept] == ["g3", "g2", "g1"]
        clock.advance(7)  # g1 is exactly 10 s old now: gone
        kept = ok(rt, "get_recent_context", limit=50)["operations"]
        assert [op["arguments"]["goal"] for op in kept] == ["g3", "g2"]


def test_planning_state_is_exact_and_a_todo_needs_a_real_goal(rt: Runtime) -> None:
    refused = rt.call("add_todo", ctx_args("s", "a1", name="t", goal_id="g9"))
    assert refused.is_error and refused.text == "goal 'g9' not found"
    goal = ok(rt, "create_goal", goal="ship")
    todo = ok(rt, "add_todo", name="test", goal_id=goal["id"])
    loose = ok(rt, "add_todo", name="loose")
    assert todo == {"id": "t2", "name": "test", "goal_id": "g1", "done": False}
    assert loose == {"id": "t3", "name": "loose", "goal_id": None, "done": False}
    assert ok(rt, "get_planning_state") == {
        "goals": [{"id": "g1", "goal": "ship"}],
        "todos": [todo, loose],
    }


def test_a_snippet_shows_a_nul_character_as_the_replacement_character(rt: Runtime) -> None:
    ok(rt, "add_content", filename="bin", content="a\x00b needle")
    (hit,) = ok(rt, "search_content", query="needle")["results"]
    assert hit["snippet"] == "a\ufffdb [needle]"
    assert ok(rt, "read_content", id=hit["id"])["content"] == "a\x00b needle"


# -- the history's bounded copy of arguments (compact) ------------------------------


def nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"k": [value]}
    return value


def test_strings_are_cut_after_the_limit_with_their_length() -> None:
    assert compact("x" * MAX_STRING) == "x" * MAX_STRING
    assert compact("x" * (MAX_STRING + 1)) == "x" * MAX_STRING + f"… ({MAX_STRING + 1} chars)"
    assert compact({"s": "y" * (MAX_STRING + 1)}) == {
        "s": "y" * MAX_STRING + f"… ({MAX_STRING + 1} chars)"
    }
    assert compact({"s": "y" * MAX_STRING}) == {"s": "y" * MAX_STRING}


def test_lists_and_dicts_keep_their_first_items_and_say_how_many_more() -> None:
    exactly = list(range(MAX_ITEMS))
    assert compact(exactly) == exactly
    assert compact([*exactly, 50, 51]) == [*exactly, "… 2 more items"]
    keys = {f"k{i}": i for i in range(MAX_ITEMS)}
    assert compact(keys) == keys
    over = {**keys, "a": 1, "b": 2, "c": 3}
    assert compact(over) == {**keys, "…": "3 more keys"}
    assert compact((1, "two")) == [1, "two"]


def test_nesting_is_cut_at_the_depth_limit() -> None:
    # Each level is a dict holding a list: two levels of depth.
    levels = MAX_DEPTH // 2
    assert compact(nested(levels, 7)) == nested(levels, 7)
    assert compact(nested(levels + 1, 7)) == nested(levels, "<object of 1 keys>")
    deep_list = [[[[[[["leaf"]]]]]]]
    assert compact(deep_list) == [[[[[["<list of 1 items>"]]]]]]


def test_flat_dicts_are_copied_as_they_are_and_others_normalised() -> None:
    flat = {"a": 1, "b": None, "c": True, "d": 1.5, "e": "text"}
    copied = compact(flat)
    assert copied == flat and copied is not flat
    assert compact({1: "int key"}) == {"1": "int key"}
    assert compact({"inner": {"x": 1}}) == {"inner": {"x": 1}}
    assert compact({"obj": object}) == {"obj": "<class 'object'>"}


def test_scalars_stay_and_other_values_become_their_clipped_repr() -> None:
    for value in (None, True, 0, 2.5):
        assert compact(value) is value
    assert compact(b"bytes") == "b'bytes'"
    assert (
        compact(b"z" * MAX_STRING) == "b'" + "z" * (MAX_STRING - 2) + f"… ({MAX_STRING + 3} chars)"
    )


# -- metadata, filters, bounds ------------------------------------------------------------


def test_generic_metadata_keeps_id_lists_and_records_ids_only_when_scalar() -> None:
    assert generic_metadata({"item_ids": ["a", 2], "mixed_ids": ["a", {"b": 1}]}) == {
        "item_ids": ["a", 2]
    }
    assert generic_metadata({"selected": {"id": ["x"], "name": "n"}}) == {
        "selected": {"id": ["x"], "name": "n"}
    }
    assert generic_metadata({"selected": {"id": {"k": 1}}}) == {"selected": {"id": {"k": 1}}}
    assert generic_metadata({"selected": {"name": "no id"}}) == {"selected": {"name": "no id"}}


class Echo(Server):
    """A tool named like a part of another's name, with an extractor that reads its args."""

    name = "echo"

    @tool(extract=lambda args, result: {"said": args["text"]})
    def goal(self, ctx: ToolContext, text: str) -> dict[str, Any]:
        """Echo."""
        return {}


def test_extractors_get_the_arguments_and_a_name_filter_matches_whole_names() -> None:
    with Runtime([*BUILTIN, Echo]) as rt:
        ok(rt, "goal", text="hi")
        ok(rt, "create_goal", goal="g")
        recent = ok(rt, "get_recent_context")["operations"]
        assert [(op["tool"], op["metadata"]) for op in recent] == [
            ("create_goal", {"created_goal": "g1"}),
            ("goal", {"said": "hi"}),
        ]
        only = ok(rt, "get_recent_context", tool_filter="create_goal")["operations"]
        assert [op["tool"] for op in only] == ["create_goal"]


def test_history_bounds_are_checked() -> None:
    assert HistoryConfig(max_operations=1, ttl=0.5).max_operations == 1
    with pytest.raises(ValueError) as caught:
        HistoryConfig(max_operations=0)
    assert str(caught.value) == "max_operations must be at least 1, got 0"
    with pytest.raises(ValueError) as caught:
        HistoryConfig(ttl=0)
    assert str(caught.value) == "ttl must be positive, got 0"


def test_history_ttl_defaults_to_an_hour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CTXACTORS_HISTORY_TTL", raising=False)
    monkeypatch.delenv("CTXACTORS_HISTORY_MAX_OPERATIONS", raising=False)
    assert Settings.from_env().history == HistorySettings(max_operations=50, ttl=3600.0)


def test_a_query_may_have_sixteen_words_and_short_terms_rank_by_occurrences(rt: Runtime) -> None:
    words = " ".join(f"w{i:02d}" for i in range(16))
    assert ok(rt, "search_content", query=words) == {"results": [], "count": 0}
    refused = rt.call("search_content", ctx_args("s", query=words + " w16"))
    assert refused.text == "query has 17 words; at most 16 are allowed"
    blank = rt.call("search_content", ctx_args("s", query="   "))
    assert blank.text == "query is blank: give at least one word to search for"
    ok(rt, "add_content", filename="once", content="ab here")
    ok(rt, "add_content", filename="thrice", content="ab ab ab")
    ok(rt, "add_content", filename="twice", content="ab and ab")
    found = ok(rt, "search_content", query="ab")["results"]
    assert [r["filename"] for r in found] == ["thrice", "twice", "once"]
    assert [r["score"] for r in found] == [3.0, 2.0, 1.0]


# -- byte caps: exact boundaries, undos, and a key reloaded from a store -------------------
# A reloaded key once started its byte count from zero, so every passivation let a session
# store its whole cap again.


SMALL_CAPS = Settings(
    playbooks=PlaybooksSettings(max_playbooks=2, max_steps=3, max_bytes=12),
    planning=PlanningSettings(max_todos=2, max_bytes=10),
)


@pytest.fixture
def stored_rt(clock: ManualClock) -> Iterator[Runtime]:
    with Runtime(clock=clock, ttl=60, store=MemoryStore(), settings=SMALL_CAPS) as runtime:
        yield runtime


def answer(rt: Runtime, tool: str, **args: Any) -> str | dict[str, Any] | None:
    """The structured answer, or the refusal's text."""
    result = rt.call(tool, ctx_args("s1", **args))
    return result.text if result.is_error else result.structured


PLAYBOOK_BYTES = "this session's playbooks would hold {} bytes: the limit is 12 " + (
    "(CTXACTORS_PLAYBOOKS_MAX_BYTES)"
)
PLANNING_BYTES = "this thread's goals and todos would hold {} bytes: the limit is 10 " + (
    "(CTXACTORS_PLANNING_MAX_BYTES)"
)


def test_each_playbook_cap_admits_exactly_its_value(stored_rt: Runtime) -> None:
    rt = stored_rt
    assert answer(rt, "create_playbook", name="p", steps=["a", "b", "c", "d"]) == (
        "the playbook has 4 steps: the limit is 3 (CTXACTORS_PLAYBOOKS_MAX_STEPS)"
    )
    made = answer(rt, "create_playbook", name="abc", steps=["de", "fg", "hi"])  # 9 bytes
    assert made == {"id": "pb1", "name": "abc", "agent_id": None, "steps": ["de", "fg", "hi"]}
    assert answer(rt, "create_playbook", name="abcd") == PLAYBOOK_BYTES.format(13)
    assert answer(rt, "create_playbook", name="xyz") == {  # 12 of 12 bytes
        "id": "pb2",
        "name": "xyz",
        "agent_id": None,
        "steps": [],
    }
    assert answer(rt, "create_playbook", name="q") == (
        "this session has 2 playbooks: the limit is 2 (CTXACTORS_PLAYBOOKS_MAX_PLAYBOOKS)"
    )


def test_an_undone_goal_gives_its_bytes_back_and_todos_count_theirs(stored_rt: Runtime) -> None:
    rt = stored_rt
    ops = [
        {"tool": "create_goal", "arguments": {"goal": "12345"}},
        {"tool": "add_todo", "arguments": {"name": "x", "goal_id": "nope"}},
    ]
    failed = rt.call("batch", ctx_args("s1", operations=ops, options={"transactional": True}))
    assert failed.is_error
    assert answer(rt, "get_planning_state") == {"goals": [], "todos": []}
    assert answer(rt, "create_goal", goal="123") == {"id": "g2", "goal": "123"}
    assert answer(rt, "create_goal", goal="1234") == {"id": "g3", "goal": "1234"}
    for todo_id, name in (("t4", "12"), ("t5", "1")):  # 9, then 10 of 10 bytes
        made = {"id": todo_id, "name": name, "goal_id": None, "done": False}
        assert answer(rt, "add_todo", name=name) == made
    assert answer(rt, "add_todo", name="x") == (
        "this thread already has 2 todos: the limit is 2 (CTXACTORS_PLANNING_MAX_TODOS)"
    )
    assert answer(rt, "create_goal", goal="1") == PLANNING_BYTES.format(11)


def test_an_undone_playbook_gives_its_bytes_back(stored_rt: Runtime) -> None:
    rt = stored_rt
    kept = answer(rt, "create_playbook", name="ab")  # 2 bytes, kept
    assert kept == {"id": "pb1", "name": "ab", "agent_id": None, "steps": []}
    ops = [
        {"tool": "create_playbook", "arguments": {"name": "abc", "steps": ["defghi"]}},
        {"tool": "add_todo", "arguments": {"name": "x", "goal_id": "nope"}},
    ]
    failed = rt.call("batch", ctx_args("s1", operations=ops, options={"transactional": True}))
    assert failed.is_error
    assert answer(rt, "list_playbooks") == {"playbooks": [kept]}
    assert answer(rt, "create_playbook", name="abcdefghijk") == PLAYBOOK_BYTES.format(13)
    made = answer(rt, "create_playbook", name="abcdefghij")  # 12 of 12 bytes
    assert made == {"id": "pb3", "name": "abcdefghij", "agent_id": None, "steps": []}


def test_a_reloaded_key_counts_the_bytes_it_already_holds(
    stored_rt: Runtime, clock: ManualClock
) -> None:
    rt = stored_rt
    assert answer(rt, "create_playbook", name="abc", steps=["defghi"]) is not None
    assert answer(rt, "create_goal", goal="1234567") == {"id": "g1", "goal": "1234567"}
    made = answer(rt, "add_todo", name="t")  # 8 of 10 bytes with the goal
    assert made == {"id": "t2", "name": "t", "goal_id": None, "done": False}
    clock.advance(61)
    assert rt.reap() == 2  # both keys passivated; their state stays in the store
    assert answer(rt, "create_playbook", name="abc", steps=["defghi"]) == (
        PLAYBOOK_BYTES.format(18)
    )
    assert answer(rt, "create_goal", goal="123") == PLANNING_BYTES.format(11)
    assert answer(rt, "create_goal", goal="12") == {"id": "g3", "goal": "12"}  # 10 of 10
    state = answer(rt, "get_planning_state")
    assert state == {
        "goals": [{"id": "g1", "goal": "1234567"}, {"id": "g3", "goal": "12"}],
        "todos": [made],
    }


@pytest.mark.parametrize("rt_settings", [Settings(max_answer_bytes=300)])
def test_a_list_answer_over_the_bound_says_it_is_cut_and_how_many_there_are(
    rt: Runtime,
) -> None:
    for i in range(6):
        ok(rt, "create_goal", goal=f"goal {i} " + "x" * 40)
        ok(rt, "add_todo", name=f"todo {i} " + "y" * 40)
        ok(rt, "create_playbook", name=f"pb{i}", steps=["z" * 40])
        ok(rt, "add_content", filename=f"f{i}" + "w" * 40, content="c")
    assert ok(rt, "get_planning_state") == {
        "goals": [],
        "todos": [],
        "truncated": True,
        "total_goals": 6,
        "total_todos": 6,
    }
    assert ok(rt, "list_playbooks") == {"playbooks": [], "truncated": True, "total": 6}
    assert ok(rt, "list_content") == {"items": [], "count": 0, "truncated": True, "total": 6}
    recent = ok(rt, "get_recent_context", limit=50)
    assert recent == {"operations": [], "count": 0, "truncated": True, "total": 27}


@pytest.mark.parametrize(
    ("tool", "args", "refusal"),
    [
        ("create_playbook", {"name": "p", "steps": ["a", "é" * 40_000]}, "step 2 is"),
        ("create_goal", {"goal": "é" * 40_000}, "the goal is"),
        ("add_todo", {"name": "é" * 40_000}, "the todo is"),
    ],
)
def test_a_text_over_its_limit_is_refused_naming_it(
    rt: Runtime, tool: str, args: dict[str, Any], refusal: str
) -> None:
    result = rt.call(tool, ctx_args("s", "a1", **args))
    assert result.is_error
    assert result.text == (
        f"{refusal} 80,000 bytes of UTF-8: the limit is 65,536 (CTXACTORS_MAX_TEXT_BYTES)"
    )
