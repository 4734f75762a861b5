"""Per-key caps (count and size) and bounded list answers.

Unbounded, 100 playbooks of 2 MB added 200 MB to a session and one `list_playbooks` answer
was 400 MB. Every cap refuses with a message naming the limit and its setting, and keeps
what is already stored; every list answer stops at ``CTXACTORS_MAX_ANSWER_BYTES`` and says
so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from test_http_api import WAIT

from ctxactors import Runtime
from ctxactors.servers.planning import Planning
from ctxactors.servers.playbooks import Playbooks
from ctxactors.settings import Cap, PlanningSettings, PlaybooksSettings, Settings, fields
from ctxactors.testing import context_args as ctx_args
from ctxactors.testing import serve_app
from ctxactors.transports.http import create_app


@pytest.fixture
def rt(rt_settings: Settings) -> Iterator[Runtime]:
    with Runtime(settings=rt_settings) as runtime:
        yield runtime


def ok(rt: Runtime, tool: str, *context: str | None, **args: Any) -> dict[str, Any]:
    result = rt.call(tool, ctx_args("s1", *context, **args))
    assert not result.is_error, result.text
    assert result.structured is not None
    return result.structured


def error(rt: Runtime, tool: str, *context: str | None, **args: Any) -> str:
    result = rt.call(tool, ctx_args("s1", *context, **args))
    assert result.is_error, result.structured
    return result.text


@pytest.mark.parametrize("rt_settings", [Settings(playbooks=PlaybooksSettings(max_playbooks=100))])
def test_the_101st_playbook_over_a_cap_of_100_is_refused_and_the_100_stay(rt: Runtime) -> None:
    for i in range(100):
        ok(rt, "create_playbook", "A", name=f"p{i}", steps=[f"step {i}"])
    assert error(rt, "create_playbook", "B", name="p100") == (
        "this session has 100 playbooks: the limit is 100 (CTXACTORS_PLAYBOOKS_MAX_PLAYBOOKS)"
    )
    listed = ok(rt, "list_playbooks", "A")["playbooks"]
    assert [p["name"] for p in listed] == [f"p{i}" for i in range(100)]
    assert ok(rt, "list_playbooks", "B") == {"playbooks": []}


def test_a_2_mb_step_is_refused_over_rest_and_nothing_is_kept(rt: Runtime) -> None:
    step = "x" * 2_000_000
    with serve_app(create_app(rt)) as url, httpx.Client(base_url=url, timeout=WAIT) as http:
        sent = http.post(
            "/api/v1/tools/create_playbook",
            json={"name": "big", "steps": ["fine", step]},
            headers={"X-Session-Id": "s1", "X-Assistant-Id": "A"},
        )
        assert sent.status_code == 200
        assert sent.json()["isError"] is True
        assert sent.json()["content"][0]["text"] == (
            "step 2 is 2,000,000 bytes of UTF-8: the limit is 65,536 (CTXACTORS_MAX_TEXT_BYTES)"
        )
    assert ok(rt, "list_playbooks", "A") == {"playbooks": []}
    korean = "가" * 21_846  # 3 bytes each: 65,538 bytes in 21,846 characters
    assert "65,538 bytes of UTF-8" in error(rt, "create_goal", "A", goal=korean)
    assert ok(rt, "create_goal", "A", goal=korean[:-1])["id"] == "g1"


@pytest.mark.parametrize(
    "rt_settings",
    [
        Settings(
            playbooks=PlaybooksSettings(max_steps=3),
            planning=PlanningSettings(max_goals=2, max_todos=1, max_bytes=10),
        )
    ],
)
def test_steps_goals_todos_and_bytes_per_key_are_capped(rt: Runtime) -> None:
    assert error(rt, "create_playbook", name="p", steps=["a", "b", "c", "d"]) == (
        "the playbook has 4 steps: the limit is 3 (CTXACTORS_PLAYBOOKS_MAX_STEPS)"
    )
    ok(rt, "create_goal", goal="12345")
    assert error(rt, "create_goal", goal="123456") == (
        "this thread's goals and todos would hold 11 bytes: the limit is 10 "
        "(CTXACTORS_PLANNING_MAX_BYTES)"
    )
    ok(rt, "create_goal", goal="1234")
    assert error(rt, "create_goal", goal="1") == (
        "this thread already has 2 goals: the limit is 2 (CTXACTORS_PLANNING_MAX_GOALS)"
    )
    ok(rt, "add_todo", name="1")
    assert "(CTXACTORS_PLANNING_MAX_TODOS)" in error(rt, "add_todo", name="2")
    # Another thread is another key, with limits of its own.
    ok(rt, "create_goal", None, "t2", goal="12345")
    assert [g["goal"] for g in ok(rt, "get_planning_state")["goals"]] == ["12345", "1234"]


@pytest.mark.parametrize("rt_settings", [Settings(playbooks=PlaybooksSettings(max_bytes=12))])
def test_a_rolled_back_batch_gives_its_bytes_back(rt: Runtime) -> None:
    ops = [
        {"id": "p", "tool": "create_playbook", "arguments": {"name": "abc", "steps": ["defghi"]}},
        {"id": "bad", "tool": "select_playbook", "arguments": {"id": "nope"}},
    ]
    result = rt.call("batch", ctx_args("s1", operations=ops, options={"transactional": True}))
    assert result.is_error
    assert ok(rt, "list_playbooks") == {"playbooks": []}
    ok(rt, "create_playbook", name="abc", steps=["defghi"])  # 9 of 12 bytes: fits again
    assert "(CTXACTORS_PLAYBOOKS_MAX_BYTES)" in error(rt, "create_playbook", name="abcd")


BOUND = 20_000


@pytest.mark.parametrize("rt_settings", [Settings(max_answer_bytes=BOUND)])
def test_no_list_answer_exceeds_the_bound(rt: Runtime) -> None:
    text = "é" * 500  # 1,000 bytes of UTF-8, escaped nowhere
    for i in range(60):
        ok(rt, "create_playbook", "A", name=f"p{i}", steps=[text])
        ok(rt, "create_goal", "A", goal=f"{i}{text}")
        ok(rt, "add_todo", "A", name=f"{i}{text}")
        ok(rt, "add_content", "A", filename=f"{i}{'f' * 1000}", content="c")

    answers = {
        tool: rt.call(tool, ctx_args("s1", "A", **({"limit": 50} if "recent" in tool else {})))
        for tool in ("list_playbooks", "get_planning_state", "list_content", "get_recent_context")
    }
    for tool, result in answers.items():
        assert not result.is_error, result.text
        size = len(msgspec.json.encode(result.structured))
        assert 0.8 * BOUND < size <= BOUND, (tool, size)
        assert result.structured is not None and result.structured["truncated"] is True

    playbooks = answers["list_playbooks"].structured
    assert playbooks is not None and playbooks["total"] == 60
    assert [p["name"] for p in playbooks["playbooks"]] == [
        f"p{i}" for i in range(len(playbooks["playbooks"]))
    ]
    state = answers["get_planning_state"].structured
    assert state is not None and (state["total_goals"], state["total_todos"]) == (60, 60)
    assert len(state["goals"]) < 60 and state["todos"] == []  # goals first, in order
    items = answers["list_content"].structured
    assert items is not None and items["total"] == 60 and items["count"] == len(items["items"])
    recent = answers["get_recent_context"].structured
    assert recent is not None and recent["total"] == 50 and recent["count"] < 50
    # Under the bound, nothing changes: no `truncated`, no totals.
    assert set(ok(rt, "list_playbooks", "B")) == {"playbooks"}


def test_caps_come_from_the_environment_when_a_runtime_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CTXACTORS_PLANNING_MAX_GOALS", "7")
    monkeypatch.setenv("CTXACTORS_PLAYBOOKS_MAX_STEPS", "9")
    monkeypatch.setenv("CTXACTORS_MAX_TEXT_BYTES", "1024")
    with Runtime(servers=[Planning, Playbooks]) as rt:
        limits = rt.settings
        assert (limits.planning.max_goals, limits.playbooks.max_steps) == (7, 9)
        assert (limits.max_text_bytes, limits.playbooks.max_playbooks) == (1024, 1000)
        assert error(rt, "create_goal", goal="x" * 1025) == (
            "the goal is 1,025 bytes of UTF-8: the limit is 1,024 (CTXACTORS_MAX_TEXT_BYTES)"
        )


def test_a_bad_value_fails_the_runtime_not_the_import_and_names_its_variable() -> None:
    env = {**os.environ, "CTXACTORS_PLAYBOOKS_MAX_PLAYBOOKS": "lots"}
    code = (
        "import ctxactors.servers\n"
        "print('imported', flush=True)\n"
        "from ctxactors import Runtime\n"
        "Runtime()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout == "imported\n"
    last = out.stderr.strip().splitlines()[-1]
    assert last == "ValueError: CTXACTORS_PLAYBOOKS_MAX_PLAYBOOKS must be an integer, got 'lots'"


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for _, name, _ in fields(Settings):
        if name is not None:
            monkeypatch.delenv(name, raising=False)
    defaults = Settings.from_env()
    assert defaults.planning == PlanningSettings(max_goals=1000, max_todos=1000, max_bytes=8 << 20)
    assert defaults.playbooks == PlaybooksSettings(
        max_playbooks=1000, max_steps=200, max_bytes=8 << 20
    )
    assert (defaults.max_text_bytes, defaults.max_answer_bytes) == (64 << 10, 16 << 20)
    assert Planning().max_text_bytes == Cap("CTXACTORS_MAX_TEXT_BYTES", 64 << 10)
