"""Playbook ownership holds for a caller with no assistant id too.

The session is the key, so every assistant's playbooks sit in one actor: only the handler's
ownership check keeps them apart. A caller that gives no assistant id is not a wildcard.
"""

from __future__ import annotations

from ctxactors import Runtime
from ctxactors.testing import context_args as ctx_args


def test_a_caller_without_an_assistant_cannot_select_an_assistants_playbook(
    runtime: Runtime,
) -> None:
    made = runtime.call("create_playbook", ctx_args("s1", "a1", name="deploy", steps=["build"]))
    assert made.structured == {"id": "pb1", "name": "deploy", "agent_id": "a1", "steps": ["build"]}

    refused = runtime.call("select_playbook", ctx_args("s1", id="pb1"))
    assert refused.is_error
    assert refused.text == "playbook 'pb1' does not belong to assistant None"
    # The owner still can, and the refusal selected nothing for anyone.
    chosen = runtime.call("select_playbook", ctx_args("s1", "a1", id="pb1"))
    assert not chosen.is_error and chosen.structured["selected"]["id"] == "pb1"


def test_an_unowned_playbook_is_selectable_only_by_callers_without_an_assistant(
    runtime: Runtime,
) -> None:
    made = runtime.call("create_playbook", ctx_args("s1", name="shared"))
    assert made.structured is not None and made.structured["agent_id"] is None
    assert not runtime.call("select_playbook", ctx_args("s1", id="pb1")).is_error
    other = runtime.call("select_playbook", ctx_args("s1", "a1", id="pb1"))
    assert other.is_error and other.text == "playbook 'pb1' does not belong to assistant 'a1'"


def test_a_caller_without_an_assistant_sees_no_assistants_playbook(runtime: Runtime) -> None:
    runtime.call("create_playbook", ctx_args("s1", "a1", name="a1's"))
    runtime.call("create_playbook", ctx_args("s1", name="unowned"))
    listed = runtime.call("list_playbooks", ctx_args("s1")).structured
    assert listed == {
        "playbooks": [{"id": "pb2", "name": "unowned", "agent_id": None, "steps": []}]
    }
