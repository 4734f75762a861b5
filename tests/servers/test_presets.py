"""Presets: exact refusals, the per-assistant cap, and options kept with the preset."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any, Literal

import msgspec
import pytest

from ctxactors import Runtime
from ctxactors.batch.pending import Placement, pending_problems
from ctxactors.batch.template import PLACEHOLDERS
from ctxactors.settings import BatchSettings, Settings
from ctxactors.testing import context_args as ctx_args


@pytest.fixture
def rt(rt_settings: Settings) -> Iterator[Runtime]:
    with Runtime(call_timeout=20, settings=rt_settings) as runtime:
        yield runtime


def call(rt: Runtime, tool: str, **args: Any) -> Any:
    return rt.call(tool, ctx_args("s", "a1", **args))


GOAL = {"tool": "create_goal", "arguments": {"goal": "{{topic}}"}}
FAIL = {"tool": "mark_todo", "arguments": {"todo_id": "missing"}}


def test_undeclared_and_unknown_params_are_named(rt: Runtime) -> None:
    ops = [GOAL, {"tool": "add_todo", "arguments": {"name": "{{a}} {{b}}"}}]
    refused = call(rt, "save_preset", name="p", operations=ops, params=["topic"])
    assert refused.text == "preset 'p' uses undeclared params: a, b"
    saved = call(rt, "save_preset", name="p", operations=[GOAL], params=["topic", "topic"])
    assert saved.structured == {"name": "p", "params": ["topic"], "replaced": False}
    wrong = call(rt, "run_preset", name="p", params={"topic": "x", "extra": 1})
    assert wrong.text == "preset 'p' takes params ['topic']; missing [], unknown ['extra']"
    missing = call(rt, "run_preset", name="p")
    assert missing.text == "preset 'p' takes params ['topic']; missing ['topic'], unknown []"


def test_placeholders_inside_nested_and_empty_values_are_found(rt: Runtime) -> None:
    ops = [
        {"tool": "create_playbook", "arguments": {"name": "{{n}}", "steps": []}},
        {"tool": "create_playbook", "arguments": {"name": "x", "steps": ["a {{step}}"]}},
        {"tool": "get_planning_state", "arguments": {}},
    ]
    refused = call(rt, "save_preset", name="p", operations=ops)
    assert refused.text == "preset 'p' uses undeclared params: n, step"


@pytest.mark.parametrize("rt_settings", [Settings(batch=BatchSettings(max_presets=2))])
def test_the_cap_counts_new_names_only(rt: Runtime) -> None:
    for name in ("one", "two"):
        assert not call(rt, "save_preset", name=name, operations=[GOAL], params=["topic"]).is_error
    again = call(rt, "save_preset", name="two", operations=[GOAL], params=["topic"])
    assert again.structured == {"name": "two", "params": ["topic"], "replaced": True}
    over = call(rt, "save_preset", name="three", operations=[GOAL], params=["topic"])
    assert over.text == "at most 2 presets per assistant; none saved"
    assert [p["name"] for p in call(rt, "list_presets").structured["presets"]] == ["one", "two"]


def test_a_transactional_preset_stays_transactional(rt: Runtime) -> None:
    # Saved with the transaction option: a failing last step undoes the goal.
    saved = call(
        rt,
        "save_preset",
        name="tx",
        operations=[GOAL, FAIL],
        params=["topic"],
        options={"transactional": True},
    )
    assert not saved.is_error, saved.text
    ran = call(rt, "run_preset", name="tx", params={"topic": "Rust"}).structured
    assert [r["status"] for r in ran["results"]] == ["rolled_back", "failed"]
    assert call(rt, "get_planning_state").structured["goals"] == []


def test_a_preset_without_params_has_its_arguments_checked_when_saved(rt: Runtime) -> None:
    bad = [{"tool": "create_goal", "arguments": {"goal": 3}}]
    refused = call(rt, "save_preset", name="bad", operations=bad)
    assert refused.is_error and "Expected `str`, got `int`" in refused.text
    # With params the arguments are only known when it runs: checked then.
    ops = [{"tool": "create_goal", "arguments": {"goal": "{{g}}"}}]
    assert not call(rt, "save_preset", name="later", operations=ops, params=["g"]).is_error
    ran = call(rt, "run_preset", name="later", params={"g": 3})
    assert ran.is_error and ran.text == (
        "operation 0: invalid arguments for 'create_goal': Expected `str`, got `int` - at `$.goal`"
    )


def test_a_transactional_preset_refuses_an_operation_that_cannot_be_undone(rt: Runtime) -> None:
    select = [{"tool": "select_playbook", "arguments": {"id": "pb1"}}]
    refused = call(rt, "save_preset", name="tx", operations=select, options={"transactional": True})
    assert refused.text == (
        "operation 0: 'select_playbook' has no compensation, so it can't run in a "
        "transactional batch"
    )
    assert not call(rt, "save_preset", name="plain", operations=select).is_error


def test_a_preset_with_params_is_refused_when_saved_for_what_no_param_could_fix(
    rt: Runtime,
) -> None:
    ops = [
        {"id": "t", "tool": "mark_todo", "arguments": {"todo_id": "{{id}}", "done": "{{d}} yes"}},
        {"tool": "create_playbook", "arguments": {"name": "{{n}}", "steps": ["a {{s}}", 3]}},
        {"tool": "search_content", "arguments": {"query": "{{q}}", "limit": "{{n}}0"}},
    ]
    refused = call(rt, "save_preset", name="p", operations=ops, params=["id", "d", "n", "s", "q"])
    assert refused.text == (
        "operation 0 ('t'): invalid arguments for 'mark_todo': `done` will be text "
        "('{{d}} yes' filled in), but it takes bool"
    )
    refused = call(rt, "save_preset", name="p", operations=ops[1:], params=["n", "s", "q"])
    assert refused.text == (
        "operation 0: invalid arguments for 'create_playbook': "
        "Expected `str`, got `int` - in `steps[1]`"
    )
    refused = call(rt, "save_preset", name="p", operations=ops[2:], params=["n", "q"])
    assert refused.text == (
        "operation 0: invalid arguments for 'search_content': `limit` will be text "
        "('{{n}}0' filled in), but it takes int"
    )
    assert call(rt, "list_presets").structured == {"presets": []}  # none was saved


def test_a_whole_string_param_may_become_any_type_so_it_is_checked_when_run(
    rt: Runtime,
) -> None:
    ops = [
        {"tool": "create_goal", "arguments": {"goal": "{{g}}"}},
        {"tool": "create_playbook", "arguments": {"name": "pb {{g}}", "steps": "{{steps}}"}},
        {"tool": "search_content", "arguments": {"query": "{{g}}", "limit": "{{limit}}"}},
    ]
    saved = call(rt, "save_preset", name="p", operations=ops, params=["g", "steps", "limit"])
    assert not saved.is_error, saved.text
    ran = call(rt, "run_preset", name="p", params={"g": "Rust", "steps": ["a", "b"], "limit": 2})
    assert [r["status"] for r in ran.structured["results"]] == ["success"] * 3
    wrong = call(rt, "run_preset", name="p", params={"g": "Rust", "steps": "ab", "limit": 2})
    assert "Expected `array`, got `str` - at `$.steps`" in wrong.text


def placed(text: str) -> Placement:
    if PLACEHOLDERS.whole(text) is not None:
        return "whole"
    return "inside" if PLACEHOLDERS.keys(text) else None


class Shape(msgspec.Struct):
    size: int
    tags: dict[str, int]


@pytest.mark.parametrize(
    ("value", "type_", "problems"),
    [
        ("x {{p}}", int | None, ["`f` will be text ('x {{p}}' filled in), but it takes int"]),
        ("x {{p}}", Literal["a", "b"] | None, []),  # the filled text may be "a"
        ("x {{p}}", datetime.date, []),
        (["{{p}}", "x"], list[int] | None, ["Expected `int`, got `str` - in `f[1]`"]),
        (["{{p}}", 1.5], tuple[int, ...], ["Expected `int`, got `float` - in `f[1]`"]),
        (["{{p}}", "x"], tuple[int, str], []),
        (["{{p}}", "x"], list[int] | dict[str, int], []),  # two containers: left to run time
        (
            {"size": "{{p}}", "tags": {"a": "x{{p}}", "b": "no"}},
            Shape,
            [
                "`f.tags.a` will be text ('x{{p}}' filled in), but it takes int",
                "Expected `int`, got `str` - in `f.tags.b`",
            ],
        ),
        ({"size": "{{p}}", "other": [1]}, Shape, []),  # unknown keys: refused when it runs
    ],
)
def test_what_is_known_before_the_params_are_filled_is_checked(
    value: Any, type_: Any, problems: list[str]
) -> None:
    assert pending_problems(value, type_, "f", placed) == problems
