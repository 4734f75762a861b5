"""The byte caps of planning and playbooks: each admits exactly its value, an undo gives its
bytes back, and a key reloaded from a store counts the bytes it already holds (it once
started from zero, so every passivation let a session store its cap again)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import ManualClock, ctx_args

from ctxactors import Runtime
from ctxactors.servers.planning import Planning
from ctxactors.servers.playbooks import Playbooks
from ctxactors.settings import Cap
from ctxactors.state import MemoryStore


@pytest.fixture(autouse=True)
def small_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Playbooks, "max_playbooks", Cap("CTXACTORS_PLAYBOOKS_MAX_PLAYBOOKS", 2))
    monkeypatch.setattr(Playbooks, "max_steps", Cap("CTXACTORS_PLAYBOOKS_MAX_STEPS", 3))
    monkeypatch.setattr(Playbooks, "max_bytes", Cap("CTXACTORS_PLAYBOOKS_MAX_BYTES", 12))
    monkeypatch.setattr(Planning, "max_bytes", Cap("CTXACTORS_PLANNING_MAX_BYTES", 10))


@pytest.fixture
def rt(clock: ManualClock) -> Iterator[Runtime]:
    with Runtime(clock=clock, ttl=60, store=MemoryStore()) as runtime:
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


def test_each_playbook_cap_admits_exactly_its_value(rt: Runtime) -> None:
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


def test_an_undone_goal_gives_its_bytes_back(rt: Runtime) -> None:
    ops = [
        {"tool": "create_goal", "arguments": {"goal": "12345"}},
        {"tool": "add_todo", "arguments": {"name": "x", "goal_id": "nope"}},
    ]
    failed = rt.call("batch", ctx_args("s1", operations=ops, options={"transactional": True}))
    assert failed.is_error
    assert answer(rt, "get_planning_state") == {"goals": [], "todos": []}
    assert answer(rt, "create_goal", goal="1234567890") == {"id": "g2", "goal": "1234567890"}
    assert answer(rt, "add_todo", name="1") == PLANNING_BYTES.format(11)


def test_a_reloaded_key_counts_the_bytes_it_already_holds(rt: Runtime, clock: ManualClock) -> None:
    assert answer(rt, "create_playbook", name="abc", steps=["defghi"]) is not None
    assert answer(rt, "create_goal", goal="12345678") == {"id": "g1", "goal": "12345678"}
    clock.advance(61)
    assert rt.reap() == 2  # both keys passivated; their state stays in the store
    assert answer(rt, "create_playbook", name="abc", steps=["defghi"]) == (
        PLAYBOOK_BYTES.format(18)
    )
    assert answer(rt, "create_goal", goal="123") == PLANNING_BYTES.format(11)
    assert answer(rt, "create_goal", goal="12") == {"id": "g2", "goal": "12"}  # 10 of 10
    state = answer(rt, "get_planning_state")
    assert state == {
        "goals": [{"id": "g1", "goal": "12345678"}, {"id": "g2", "goal": "12"}],
        "todos": [],
    }
