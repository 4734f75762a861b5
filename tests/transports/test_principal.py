"""The principal namespaces every key: principal A's session "s1" and B's "s1" share nothing.

The principal comes only from the transport that authenticated it (`Runtime.call(...,
principal=...)`); nothing in the arguments or ``_meta`` names or changes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxactors import InvalidArgumentsError, Runtime, Scope, ToolContext
from ctxactors.results import ToolResult
from ctxactors.testing import context_args as ctx_args
from ctxactors.testing import wait_until

WAIT = 20.0  # generous: the machine is shared and loaded


@pytest.fixture
def rt(workspace_root: str) -> Iterator[Runtime]:
    with Runtime(call_timeout=WAIT) as runtime:
        yield runtime


def goals(rt: Runtime, principal: str | None, session: str = "s1", **kw: Any) -> list[str]:
    state = rt.call("get_planning_state", ctx_args(session, "a1"), principal=principal, **kw)
    return [g["goal"] for g in state.structured["goals"]]


def test_tool_context_keeps_positional_use_and_takes_the_principal_last() -> None:
    assert ToolContext("s", "a", "t") == ToolContext(
        session_id="s", assistant_id="a", thread_id="t", principal=None
    )
    ctx = ToolContext("s", "a", "t", "alice")
    assert ctx.principal == "alice"
    assert ctx.session_key == ("alice", "s")
    with pytest.raises(AttributeError):
        ctx.principal = "bob"  # type: ignore[misc]


principals = st.none() | st.text(max_size=6)
texts = st.none() | st.text(max_size=6)


@given(st.text(max_size=6), texts, texts, principals, principals, st.sampled_from(list(Scope)))
def test_property_keys_of_different_principals_never_meet(
    session: str,
    assistant: str | None,
    thread: str | None,
    a: str | None,
    b: str | None,
    scope: Scope,
) -> None:
    key_a = scope.key("srv", ToolContext(session, assistant, thread, a))
    key_b = scope.key("srv", ToolContext(session, assistant, thread, b))
    assert (key_a == key_b) is (a == b)
    assert key_a[1] == (a, session)  # the session item of every key: (principal, session)


def test_keys_are_tuples_so_principal_and_session_never_run_together() -> None:
    # As joined strings, "a:" + "b" and "a" + ":b" would be one key.
    one = Scope.SESSION.key("planning", ToolContext("b", principal="a:"))
    two = Scope.SESSION.key("planning", ToolContext(":b", principal="a"))
    assert one != two
    assert Scope.SESSION.key("planning", ToolContext("s1")) != Scope.SESSION.key(
        "planning", ToolContext("s1", principal="")
    )


def test_two_principals_with_the_same_session_share_no_state(rt: Runtime) -> None:
    a = {"principal": "alice"}
    b = {"principal": "bob"}
    rt.call("create_goal", ctx_args("s1", "a1", goal="alice's goal"), **a)
    pb = rt.call("create_playbook", ctx_args("s1", "a1", name="alice's plan"), **a).structured
    item = rt.call("add_content", ctx_args("s1", filename="a.txt", content="secret"), **a)
    saved = rt.call(
        "save_preset",
        ctx_args("s1", "a1", name="p", operations=[{"tool": "list_content", "arguments": {}}]),
        **a,
    )
    assert not saved.is_error, saved.text

    assert goals(rt, "bob") == []
    assert rt.call("list_playbooks", ctx_args("s1", "a1"), **b).structured == {"playbooks": []}
    refused = rt.call("select_playbook", ctx_args("s1", "a1", id=pb["id"]), **b)
    assert refused.is_error
    assert rt.call("list_content", ctx_args("s1"), **b).structured == {"items": [], "count": 0}
    assert rt.call("read_content", ctx_args("s1", id=item.structured["id"]), **b).is_error
    assert rt.call("list_presets", ctx_args("s1", "a1"), **b).structured == {"presets": []}
    bobs = rt.call("get_recent_context", ctx_args("s1", "a1", limit=50), **b).structured
    assert [op["tool"] for op in bobs["operations"]] == [  # bob's own calls only
        "list_presets",
        "read_content",
        "list_content",
        "select_playbook",
        "list_playbooks",
        "get_planning_state",
    ]
    # The unauthenticated namespace (no principal) is a third one.
    assert goals(rt, None) == []

    # Alice still sees all of hers, and her history lists her own calls only.
    assert goals(rt, "alice") == ["alice's goal"]
    history = rt.call("get_recent_context", ctx_args("s1", "a1", limit=50), **a).structured
    assert [op["tool"] for op in history["operations"]] == [
        "get_planning_state",
        "save_preset",
        "add_content",
        "create_playbook",
        "create_goal",
    ]
    assert rt.has_session("s1", principal="alice") and rt.has_session("s1", principal="bob")
    assert not rt.has_session("s1", principal="carol")


def test_a_batch_runs_in_the_callers_principal(rt: Runtime) -> None:
    ops = [{"tool": "create_goal", "arguments": {"goal": "batched"}}]
    result = rt.call("batch", ctx_args("s1", "a1", "t1", operations=ops), principal="alice")
    assert not result.is_error, result.text
    thread_t1 = {"__sessionId": "s1", "__assistantId": "a1", "__threadId": "t1"}
    state = rt.call("get_planning_state", thread_t1, principal="alice").structured
    assert [g["goal"] for g in state["goals"]] == ["batched"]
    assert rt.call("get_planning_state", thread_t1).structured["goals"] == []


def test_workspaces_of_two_principals_with_the_same_session_are_apart(rt: Runtime) -> None:
    def run(principal: str, command: str) -> str:
        started = rt.call("execute_command", ctx_args("s1", command=command), principal=principal)
        pid = started.structured["processId"]

        def finished() -> ToolResult | None:
            polled = rt.call("poll_process", ctx_args("s1", processId=pid), principal=principal)
            return None if polled.structured["status"] == "running" else polled

        output: str = wait_until(finished, WAIT, describe=lambda: command).structured["output"]
        return output

    run("alice", "echo alice-secret > note.txt")
    assert "alice-secret" in run("alice", "cat note.txt")
    assert "alice-secret" not in run("bob", "cat note.txt 2>&1; ls")
    alice_procs = rt.call("list_processes", ctx_args("s1"), principal="alice").structured
    bob_procs = rt.call("list_processes", ctx_args("s1"), principal="bob").structured
    alice_ids = {p["processId"] for p in alice_procs["processes"]}
    bob_ids = {p["processId"] for p in bob_procs["processes"]}
    assert len(alice_ids) == 2 and len(bob_ids) == 1
    foreign = rt.call("poll_process", ctx_args("s1", processId=min(alice_ids)), principal="bob")
    assert foreign.is_error and "not found" in foreign.text


@pytest.mark.parametrize(
    "smuggled",
    [
        {"arguments": {"__principal": "alice"}},
        {"arguments": {"__Principal": "alice", "__principal_id": "alice"}},
        {"meta": {"ctxactors/principal": "alice"}},
        {
            "meta": {
                "ctxactors/principal": "alice",
                "ctxactors/sessionId": "s1",
                "ctxactors/assistantId": "a1",
            }
        },
    ],
    ids=["arg", "arg-spellings", "meta", "meta-with-session"],
)
def test_nothing_in_arguments_or_meta_sets_or_changes_the_principal(
    rt: Runtime, smuggled: dict[str, Any]
) -> None:
    rt.call("create_goal", ctx_args("s1", "a1", goal="alice only"), principal="alice")
    args = {**ctx_args("s1", "a1"), **smuggled.get("arguments", {})}
    meta = smuggled.get("meta")
    for principal in (None, "bob"):
        state = rt.call("get_planning_state", args, meta=meta, principal=principal)
        assert state.structured["goals"] == []
    theirs = rt.call("get_planning_state", args, meta=meta, principal="alice")
    assert [g["goal"] for g in theirs.structured["goals"]] == ["alice only"]


def test_end_session_ends_only_that_principals_session(rt: Runtime) -> None:
    for principal in ("alice", "bob", None):
        rt.call("create_goal", ctx_args("s1", "a1", goal=f"{principal}"), principal=principal)
    assert rt.end_session("s1", principal="bob") == 1  # its planning actor
    assert goals(rt, "alice") == ["alice"]
    assert goals(rt, None) == ["None"]
    assert goals(rt, "bob") == []
    assert rt.end_session("s1") == 1
    assert goals(rt, "alice") == ["alice"]
    assert goals(rt, None) == []
    assert rt.end_session("s1", principal="nobody") == 0


def test_session_fallback_names_the_session_when_no_source_does(rt: Runtime) -> None:
    rt.call("create_goal", {"goal": "g", "__assistantId": "a1"}, session_fallback="mcp-7")
    assert goals(rt, None, "mcp-7") == ["g"]
    assert goals(rt, None, "default") == []
    # A session from the arguments or _meta wins over the fallback.
    rt.call("create_goal", ctx_args("s2", "a1", goal="h"), session_fallback="mcp-7")
    rt.call(
        "create_goal",
        {"goal": "i"},
        meta={"ctxactors/sessionId": "s3", "ctxactors/assistantId": "a1"},
        session_fallback="mcp-7",
    )
    assert goals(rt, None, "mcp-7") == ["g"]
    assert goals(rt, None, "s2") == ["h"]
    assert goals(rt, None, "s3") == ["i"]


def test_no_session_from_any_source_is_refused_when_there_is_no_fallback(
    rt: Runtime,
) -> None:
    async def acall() -> None:
        await rt.acall("create_goal", {"goal": "g"}, session_fallback=None, principal="alice")

    for attempt in (
        lambda: rt.call("create_goal", {"goal": "g"}, session_fallback=None, principal="alice"),
        lambda: asyncio.run(acall()),
    ):
        with pytest.raises(InvalidArgumentsError) as refused:
            attempt()
        message = str(refused.value)
        assert "_meta" in message and "ctxactors/sessionId" in message
        assert "__sessionId" in message
    assert rt.stats()["calls"] == 0  # nothing ran
