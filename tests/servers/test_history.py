"""Operation history: recording, extraction, bounds, isolation, and the follow-up scenario."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.errors import InvalidArgumentsError, RuntimeClosedError, ToolError
from ctxactors.logs import configure_logging
from ctxactors.results import ToolResult
from ctxactors.servers import BUILTIN
from ctxactors.servers.history import compact, generic_metadata, pick
from ctxactors.settings import HistorySettings, Settings
from ctxactors.testing import ManualClock, wait_until
from ctxactors.testing import context_args as ctx_args


class Survey(Server):
    """A host app's survey: choosing some answers deselects the ones they conflict with."""

    name = "survey"
    scope = Scope.SESSION

    ANSWERS = {
        "a1": ("No compiled languages", {"a4"}),
        "a2": ("JavaScript only", {"a4", "a5"}),
        "a3": ("Python 2 only", {"a5"}),
        "a4": ("C++", set()),
        "a5": ("Python", set()),
        "a6": ("Likes tabs", set()),
    }

    def __init__(self) -> None:
        self.selected: dict[str, set[str]] = {"123": {"a1", "a2", "a3", "a6"}}

    @tool
    def add_survey_answers(
        self, ctx: ToolContext, project_id: str, answers: list[str]
    ) -> dict[str, Any]:
        """Select answers in a project's survey; conflicting answers are deselected."""
        chosen = self.selected.get(project_id)
        if chosen is None:
            raise ToolError(f"project {project_id!r} not found")
        deselected = sorted(
            a for a in chosen if self.ANSWERS[a][1] & set(answers) and a not in answers
        )
        chosen.difference_update(deselected)
        chosen.update(answers)
        return {"project_id": project_id, "selected": sorted(answers), "deselected": deselected}

    @tool(extract=lambda args, result: 1 / 0)
    def flaky_extract(self, ctx: ToolContext) -> dict[str, Any]:
        """A tool whose extractor fails: the call and the record must survive it."""
        return {"id": "x1"}

    @tool(extract=pick(made="id", missing="nope"))
    def picked(self, ctx: ToolContext) -> dict[str, Any]:
        """A tool with a declarative extractor."""
        return {"id": "p1", "other": 2}


SERVERS = [*BUILTIN, Survey]  # the history is part of every runtime


@pytest.fixture
def rt() -> Iterator[Runtime]:
    with Runtime(servers=SERVERS) as runtime:
        yield runtime


def recent(
    rt: Runtime, session: str, assistant: str | None = None, thread: str | None = None, **args: Any
) -> list[dict[str, Any]]:
    result = rt.call("get_recent_context", ctx_args(session, assistant, thread, **args))
    assert not result.is_error, result.text
    assert result.structured is not None
    ops: list[dict[str, Any]] = result.structured["operations"]
    assert result.structured["count"] == len(ops)
    return ops


def test_follow_up_question_finds_the_deselected_answers(rt: Runtime) -> None:
    """ "Add C++ and Python" -> 3 answers deselected -> "which ones?" is answerable."""
    s = ctx_args("s1", "a1", project_id="123", answers=["a4", "a5"])
    first = rt.call("add_survey_answers", s)
    assert first.structured == {
        "project_id": "123",
        "selected": ["a4", "a5"],
        "deselected": ["a1", "a2", "a3"],
    }
    for i in range(8):  # later, unrelated work pushes it out of the default window
        rt.call("create_goal", ctx_args("s1", "a1", goal=f"goal {i}"))
    assert all(op["tool"] == "create_goal" for op in recent(rt, "s1", assistant="a1"))

    ops = recent(rt, "s1", assistant="a1", tool_filter="add_survey_answers")
    assert len(ops) == 1
    assert ops[0]["arguments"] == {"project_id": "123", "answers": ["a4", "a5"]}
    assert ops[0]["metadata"]["deselected"] == ["a1", "a2", "a3"]
    assert ops[0]["metadata"]["selected"] == ["a4", "a5"]
    assert ops[0]["metadata"]["project_id"] == "123"
    assert ops[0]["is_error"] is False and ops[0]["assistant_id"] == "a1"


def test_newest_first_default_five_and_limit_clamped_to_what_is_kept(rt: Runtime) -> None:
    for i in range(60):
        rt.call("create_goal", ctx_args("s1", goal=f"g{i}"))
    ops = recent(rt, "s1")
    assert [op["arguments"]["goal"] for op in ops] == ["g59", "g58", "g57", "g56", "g55"]
    everything = recent(rt, "s1", limit=1_000_000)
    assert len(everything) == 50  # the default bound, not an error
    assert everything[-1]["arguments"]["goal"] == "g10"
    assert [op["metadata"] for op in ops[:2]] == [{"created_goal": "g60"}, {"created_goal": "g59"}]


def test_asking_is_never_recorded_and_never_pushes_operations_out(rt: Runtime) -> None:
    rt.call("create_goal", ctx_args("s1", goal="keep me"))
    for _ in range(60):
        recent(rt, "s1", limit=50)
    ops = recent(rt, "s1", limit=50)
    assert [op["tool"] for op in ops] == ["create_goal"]


def test_every_call_is_visible_to_the_callers_next_call(rt: Runtime) -> None:
    """The hand-off happens before the reply: no window where a returned call is missing."""
    for i in range(150):
        rt.call("add_todo", ctx_args("s1", name=f"t{i}"))
        ops = recent(rt, "s1", limit=1)
        assert ops[0]["arguments"]["name"] == f"t{i}"


def test_acall_is_recorded_before_its_reply_too(rt: Runtime) -> None:
    async def main() -> None:
        for i in range(50):
            await rt.acall("add_todo", ctx_args("s1", name=f"t{i}"))
            result = await rt.acall("get_recent_context", ctx_args("s1", limit=1))
            assert result.structured is not None
            assert result.structured["operations"][0]["arguments"]["name"] == f"t{i}"

    asyncio.run(main())


def test_tool_filter_by_name_or_names_and_errors_are_recorded(rt: Runtime) -> None:
    rt.call("create_goal", ctx_args("s1", "a", goal="g"))
    rt.call("add_todo", ctx_args("s1", "a", name="t", goal_id="g1"))
    rt.call("mark_todo", ctx_args("s1", "a", todo_id="t2"))
    rt.call("mark_todo", ctx_args("s1", "a", todo_id="t2", done=False))
    rt.call("mark_todo", ctx_args("s1", "a", todo_id="nope"))
    rt.call("create_playbook", ctx_args("s1", "a", name="deploy"))
    rt.call("select_playbook", ctx_args("s1", "a", id="pb1"))

    marks = recent(rt, "s1", assistant="a", tool_filter="mark_todo")
    assert [op["metadata"] for op in marks] == [
        {"error": "todo 'nope' not found"},
        {"reopened_todo": "t2"},
        {"completed_todo": "t2"},
    ]
    assert [op["is_error"] for op in marks] == [True, False, False]
    both = recent(rt, "s1", assistant="a", tool_filter=["create_goal", "select_playbook"], limit=10)
    assert [(op["tool"], op["metadata"]) for op in both] == [
        ("select_playbook", {"selected_playbook": "pb1"}),
        ("create_goal", {"created_goal": "g1"}),
    ]
    todo = recent(rt, "s1", assistant="a", tool_filter="add_todo")[0]["metadata"]
    assert todo == {"created_todo": "t2", "goal_id": "g1"}
    playbook = recent(rt, "s1", assistant="a", tool_filter="create_playbook")[0]["metadata"]
    assert playbook == {"created_playbook": "pb1", "name": "deploy"}
    assert recent(rt, "s1", assistant="a", tool_filter="no_such_tool") == []


def test_every_runtime_records_without_being_asked_to() -> None:
    with Runtime(servers=[Survey]) as rt:
        assert "get_recent_context" in {t["name"] for t in rt.list_tools()}
        rt.call("add_survey_answers", ctx_args("s1", project_id="123", answers=["a5"]))
        assert [op["metadata"]["deselected"] for op in recent(rt, "s1")] == [["a2", "a3"]]


def test_content_and_workspace_calls_record_ids_and_outcomes_not_payloads() -> None:
    # Room for every poll: a loaded machine polls many times before the command ends, and
    # 50 records (the default) then no longer reach back to add_content.
    settings = Settings(history=HistorySettings(max_operations=100_000))
    with Runtime(servers=SERVERS, settings=settings) as rt:
        calls_record_ids_and_outcomes(rt)


def calls_record_ids_and_outcomes(rt: Runtime) -> None:
    added = rt.call("add_content", ctx_args("s1", filename="notes.md", content="x" * 10_000))
    content_id = added.structured["id"]
    rt.call("delete_content", ctx_args("s1", id=content_id))
    started = rt.call("execute_command", ctx_args("s1", command="echo hello; exit 3"))
    pid = started.structured["processId"]

    def finished() -> ToolResult | None:
        polled = rt.call("poll_process", ctx_args("s1", processId=pid))
        return None if polled.structured["status"] == "running" else polled

    polled = wait_until(finished)
    assert polled.structured["output"] == "hello\n"
    # Each tool's newest record (an answer of every poll might not fit its byte budget).
    tools = ("add_content", "delete_content", "execute_command", "poll_process")
    ops = {tool: recent(rt, "s1", tool_filter=tool)[0] for tool in tools}
    assert ops["add_content"]["metadata"] == {"created_content": content_id, "filename": "notes.md"}
    assert ops["add_content"]["arguments"]["content"].endswith("(10000 chars)")
    assert ops["delete_content"]["metadata"] == {
        "deleted_content": content_id,
        "filename": "notes.md",
    }
    assert ops["execute_command"]["metadata"] == {"process_id": pid, "status": "running"}
    assert ops["poll_process"]["metadata"] == {
        "process_id": pid,
        "status": "exited",
        "exit_code": 3,
    }


def test_sessions_never_see_each_others_history(rt: Runtime) -> None:
    rt.call("create_goal", ctx_args("s1", "a1", goal="secret of s1"))
    rt.call("create_goal", ctx_args("s2", "a1", goal="secret of s2"))
    assert [op["arguments"]["goal"] for op in recent(rt, "s1", "a1")] == ["secret of s1"]
    assert [op["arguments"]["goal"] for op in recent(rt, "s2", "a1")] == ["secret of s2"]
    assert recent(rt, "s3", "a1") == []
    # A spoofed context field in the model's arguments can't pick another session's history.
    with pytest.raises(InvalidArgumentsError):
        rt.call("get_recent_context", {"__sessionId": "s3", "session_id": "s1"})


def seen(rt: Runtime, assistant: str | None, thread: str | None = None) -> list[tuple[Any, ...]]:
    """(tool, first argument, assistant, thread) of what this caller's history shows."""
    return [
        (
            op["tool"],
            next(iter(op["arguments"].values())),
            op.get("assistant_id"),
            op.get("thread_id"),
        )
        for op in recent(rt, "s1", assistant, thread, limit=50)
    ]


def test_another_assistant_never_sees_an_assistants_playbook_steps(rt: Runtime) -> None:
    rt.call("create_playbook", ctx_args("s1", "A", name="secret", steps=["rotate the key"]))
    rt.call("create_goal", ctx_args("s1", "A", goal="A's goal"))
    assert seen(rt, "B") == []
    assert rt.call("list_playbooks", ctx_args("s1", "B")).structured == {"playbooks": []}
    # The owner keeps its full follow-up context.
    assert seen(rt, "A") == [
        ("create_goal", "A's goal", "A", None),
        ("create_playbook", "secret", "A", None),
    ]
    ops = recent(rt, "s1", "A", tool_filter="create_playbook")
    assert ops[0]["arguments"] == {"name": "secret", "steps": ["rotate the key"]}


def test_thread_scoped_calls_stay_in_their_thread(rt: Runtime) -> None:
    rt.call("create_goal", ctx_args("s1", "A", "t1", goal="t1's goal"))
    rt.call("create_playbook", ctx_args("s1", "A", "t1", name="shared"))
    # Planning is per thread: t2 can't see t1's goal. Playbooks are the session's (per
    # assistant), so A sees its playbook from any thread.
    assert seen(rt, "A", "t2") == [("create_playbook", "shared", "A", "t1")]
    assert seen(rt, "A", "t1") == [
        ("create_playbook", "shared", "A", "t1"),
        ("create_goal", "t1's goal", "A", "t1"),
    ]
    assert rt.call("get_planning_state", ctx_args("s1", "A", "t2")).structured == {
        "goals": [],
        "todos": [],
    }


def test_calls_without_an_assistant_are_the_sessions_and_see_only_their_own(
    rt: Runtime,
) -> None:
    rt.call("add_content", ctx_args("s1", filename="shared.txt", content="for everyone"))
    rt.call("create_goal", ctx_args("s1", goal="no one's goal"))
    rt.call("add_content", ctx_args("s1", "A", filename="a.txt", content="A's upload"))
    rt.call("create_goal", ctx_args("s1", "A", goal="A's goal"))
    assert seen(rt, None) == [
        ("create_goal", "no one's goal", None, None),
        ("add_content", "shared.txt", None, None),
    ]
    # An assistant sees the session's own calls of session-wide tools, never another key's
    # planning (the key of a call without an assistant is not A's).
    assert seen(rt, "A") == [
        ("create_goal", "A's goal", "A", None),
        ("add_content", "a.txt", "A", None),
        ("add_content", "shared.txt", None, None),
    ]
    assert seen(rt, "B") == [("add_content", "shared.txt", None, None)]


def test_batch_and_preset_calls_are_seen_only_by_their_own_context(rt: Runtime) -> None:
    ops = [{"id": "g", "tool": "create_goal", "arguments": {"goal": "batched"}}]
    assert not rt.call("batch", ctx_args("s1", "A", "t1", operations=ops)).is_error
    assert not rt.call("save_preset", ctx_args("s1", "A", "t1", name="p", operations=ops)).is_error
    assert [op[0] for op in seen(rt, "A", "t1")] == ["save_preset", "batch", "create_goal"]
    assert seen(rt, "A", "t2") == [("save_preset", "p", "A", "t1")]  # presets: per assistant
    assert seen(rt, "B", "t1") == []
    assert seen(rt, None) == []


def test_bounds_are_configurable_and_old_operations_expire(clock: ManualClock) -> None:
    limits = Settings(history=HistorySettings(max_operations=3, ttl=60))
    with Runtime(servers=SERVERS, clock=clock, settings=limits) as rt:
        for i in range(5):
            rt.call("create_goal", ctx_args("s1", goal=f"g{i}"))
        assert [op["arguments"]["goal"] for op in recent(rt, "s1")] == ["g4", "g3", "g2"]
        clock.advance(30)
        rt.call("create_goal", ctx_args("s1", goal="late"))
        clock.advance(31)  # the first ones are 61 s old, "late" 31 s
        assert [op["arguments"]["goal"] for op in recent(rt, "s1")] == ["late"]
        clock.advance(30)
        assert recent(rt, "s1") == []


def test_bad_bounds_and_bad_arguments_are_refused_clearly(rt: Runtime) -> None:
    with pytest.raises(ValueError) as bad:
        Runtime(servers=SERVERS, settings=Settings(history=HistorySettings(max_operations=0)))
    assert str(bad.value) == (
        "history.max_operations (CTXACTORS_HISTORY_MAX_OPERATIONS) must be at least 1"
    )
    with pytest.raises(InvalidArgumentsError, match="limit"):
        rt.call("get_recent_context", ctx_args("s1", limit=0))
    with pytest.raises(InvalidArgumentsError, match="tool_filter"):
        rt.call("get_recent_context", ctx_args("s1", tool_filter=5))


def test_env_sets_the_default_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXACTORS_HISTORY_MAX_OPERATIONS", "2")
    with Runtime(servers=SERVERS) as rt:
        for i in range(4):
            rt.call("create_goal", ctx_args("s1", goal=f"g{i}"))
        assert len(recent(rt, "s1", limit=10)) == 2
    monkeypatch.setenv("CTXACTORS_HISTORY_TTL", "soon")
    with pytest.raises(ValueError, match="CTXACTORS_HISTORY_TTL"):
        Runtime(servers=SERVERS)


def test_ending_the_session_removes_its_history(rt: Runtime) -> None:
    rt.call("create_goal", ctx_args("s1", goal="g"))
    rt.call("create_goal", ctx_args("s2", goal="g"))
    assert len(recent(rt, "s1")) == 1
    rt.end_session("s1")
    assert recent(rt, "s1") == []
    assert len(recent(rt, "s2")) == 1
    assert ("history", (None, "s1")) in rt._registry.keys()  # the fresh, empty one just asked


def test_the_history_lives_as_long_as_any_actor_of_its_session(clock: ManualClock) -> None:
    with Runtime(servers=SERVERS, clock=clock, ttl=60) as rt:
        rt.call("create_goal", ctx_args("s1", "a1", goal="early"))
        assert rt._registry.keys() == [("planning", (None, "s1"), "a1", None)]  # no history actor
        clock.advance(40)
        rt.call("create_goal", ctx_args("s1", "a2", goal="later"))
        clock.advance(30)
        assert rt.reap() == 1  # a1's planning actor; a2's keeps the session alive
        assert [op["arguments"]["goal"] for op in recent(rt, "s1", "a1")] == ["early"]
        assert [op["arguments"]["goal"] for op in recent(rt, "s1", "a2")] == ["later"]
        clock.advance(61)
        assert rt.reap() == 2  # a2's planning actor and the history actor that answered
        assert rt.stats()["sessions"] == 0
        assert recent(rt, "s1", "a2") == []  # a new session: nothing kept from the old one


def test_a_failing_extractor_keeps_the_call_and_the_record(rt: Runtime) -> None:
    with capture_logs() as logs:
        result = rt.call("flaky_extract", ctx_args("s1"))
        assert result.structured == {"id": "x1"} and not result.is_error
        assert recent(rt, "s1")[0]["metadata"] == {"id": "x1"}  # the generic one instead
    # The extractor runs when the history is read, in the history's actor.
    [failed] = [e for e in logs if e["event"] == "extract_failed"]
    assert isinstance(failed.pop("exc_info"), ZeroDivisionError)
    assert failed == {
        "logger": "ctxactors.history",
        "event": "extract_failed",
        "tool": "flaky_extract",
        "log_level": "warning",
    }
    assert recent(rt, "s1")[0]["metadata"] == {"id": "x1"}  # made once, not again
    rt.call("picked", ctx_args("s1"))
    assert recent(rt, "s1", limit=1)[0]["metadata"] == {"made": "p1"}


def test_batch_operations_are_recorded_one_by_one(rt: Runtime) -> None:
    ops = [
        {"id": "g", "tool": "create_goal", "arguments": {"goal": "ship"}},
        {"id": "t", "tool": "add_todo", "arguments": {"name": "test", "goal_id": "${g.id}"}},
    ]
    result = rt.call("batch", ctx_args("s1", operations=ops))
    assert not result.is_error, result.text
    assert result.structured is not None
    assert [r["status"] for r in result.structured["results"]] == ["success", "success"]
    recorded = [
        {k: v for k, v in op.items() if k != "timestamp"} for op in recent(rt, "s1", limit=10)
    ]
    # Newest first: the batch answers after its operations, each recorded with the
    # arguments it really ran with (the reference resolved) and what it made.
    assert recorded == [
        {"tool": "batch", "arguments": {"operations": ops}, "is_error": False, "metadata": {}},
        {
            "tool": "add_todo",
            "arguments": {"name": "test", "goal_id": "g1"},
            "is_error": False,
            "metadata": {"created_todo": "t2", "goal_id": "g1"},
        },
        {
            "tool": "create_goal",
            "arguments": {"goal": "ship"},
            "is_error": False,
            "metadata": {"created_goal": "g1"},
        },
    ]


def test_concurrent_calls_are_all_recorded_exactly_once_per_session() -> None:
    with Runtime(
        servers=SERVERS, settings=Settings(history=HistorySettings(max_operations=500))
    ) as rt:
        errors: list[BaseException] = []

        def worker(n: int) -> None:
            try:
                for i in range(25):
                    rt.call("add_todo", ctx_args(f"s{n % 2}", f"a{n}", name=f"w{n}-{i}"))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        writing = threading.Event()
        writing.set()

        def reader(s: int) -> None:
            # Reads keep messages queued at the history actor, so records take both paths
            # (appended directly, or queued behind a read): none may be lost or reordered.
            try:
                while writing.is_set():
                    recent(rt, f"s{s}", limit=500)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        readers = [threading.Thread(target=reader, args=(s,)) for s in (0, 1)]
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in [*readers, *threads]:
            t.start()
        for t in threads:
            t.join(30)
        writing.clear()
        for t in readers:
            t.join(30)
        assert not errors
        for n in range(8):  # each worker's own calls in the order it made them
            ops = recent(rt, f"s{n % 2}", f"a{n}", limit=500)
            assert [op["arguments"]["name"] for op in reversed(ops)] == [
                f"w{n}-{i}" for i in range(25)
            ]
            assert {op["assistant_id"] for op in ops} == {f"a{n}"}


class Held(Server):
    """A call that stays in flight until the test lets it go."""

    name = "held"
    scope = Scope.SESSION
    running = threading.Event()
    release = threading.Event()

    @tool
    def held(self, ctx: ToolContext) -> dict[str, Any]:
        """Signal that the call runs, then wait to be released."""
        Held.running.set()
        assert Held.release.wait(20)
        return {"id": "h1"}


def test_recording_after_close_is_dropped_quietly() -> None:
    """A call still running when the runtime closes answers normally; its record has no
    history left to go to and is dropped without an error (nothing logged as failed)."""
    Held.running.clear()
    Held.release.clear()
    with capture_logs() as logs:
        rt = Runtime(servers=[*SERVERS, Held])
        assert not rt.call("create_goal", ctx_args("s1", goal="g")).is_error
        answers: list[ToolResult] = []
        caller = threading.Thread(target=lambda: answers.append(rt.call("held", ctx_args("s1"))))
        caller.start()
        assert Held.running.wait(20)
        closer = threading.Thread(target=rt.close)
        closer.start()
        while not rt._registry.closed:
            closer.join(0.005)  # until close() has retired every actor, the held one too
        assert rt.stats()["actors"] == 0 and rt._registry.session_state("s1", "x", dict) is None
        Held.release.set()
        caller.join(20)
        closer.join(20)
        assert not closer.is_alive()
        assert [a.structured for a in answers] == [{"id": "h1"}]
        rt.close()  # idempotent
    assert [e for e in logs if e["log_level"] in ("error", "warning")] == []
    assert [e["tool"] for e in logs if e["event"] == "tool_call"] == ["create_goal", "held"]
    with pytest.raises(RuntimeClosedError):
        rt.call("get_recent_context", ctx_args("s1"))


def test_generic_extractor_keeps_ids_counts_and_selection_lists() -> None:
    structured = {
        "id": "c7",
        "processId": "p1",
        "goal_id": None,
        "count": 3,
        "total_count": 9,
        "deselected_answers": [{"id": "a1", "text": "x"}, {"id": "a2"}],
        "selected": {"id": "pb1", "name": "deploy"},
        "createdIds": ["x", "y"],
        "affected_rows": 4,
        "note": "not metadata",
        "done": True,
    }
    assert generic_metadata(structured) == {
        "id": "c7",
        "processId": "p1",
        "count": 3,
        "total_count": 9,
        "deselected_answers": ["a1", "a2"],
        "selected": "pb1",
        "createdIds": ["x", "y"],
    }
    assert generic_metadata(None) == {}


def test_compaction_bounds_what_a_record_keeps() -> None:
    big = {"content": "x" * 1_000_000, "items": list(range(1000)), "deep": [[[[[[["bottom"]]]]]]]}
    small = compact(big)
    assert len(small["content"]) < 600 and small["content"].endswith("(1000000 chars)")
    assert len(small["items"]) == 51 and small["items"][-1] == "… 950 more items"
    assert "bottom" not in str(small["deep"])


def test_extract_metadata_of_an_error_is_its_message() -> None:
    from ctxactors.servers.history import extract_metadata

    spec = Survey.tools["picked"]
    error = ToolResult.error("E" * 2000)
    assert extract_metadata(spec, {}, error)["error"].endswith("(2000 chars)")


def test_a_rolled_back_batch_shows_what_ran_but_never_the_undo(rt: Runtime) -> None:
    ops = [
        {"id": "g", "tool": "create_goal", "arguments": {"goal": "ship"}},
        {"id": "bad", "tool": "mark_todo", "arguments": {"todo_id": "nope"}, "dependsOn": ["g"]},
    ]
    result = rt.call("batch", ctx_args("s1", operations=ops, options={"transactional": True}))
    assert result.is_error
    assert rt.call("get_planning_state", ctx_args("s1")).structured == {"goals": [], "todos": []}
    tools = [(op["tool"], op["is_error"]) for op in recent(rt, "s1", limit=10)]
    assert tools == [
        ("get_planning_state", False),
        ("batch", True),
        ("mark_todo", True),
        ("create_goal", False),
    ]


class Tally(Server):
    """Returns its own dict, which its next call changes (a server that shares its state)."""

    name = "tally"
    scope = Scope.SESSION

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"selected_ids": [], "count": 0}

    @tool
    def bump(self, ctx: ToolContext, item_id: str) -> dict[str, Any]:
        """Select one more item."""
        self.state["selected_ids"].append(item_id)
        self.state["count"] += 1
        return self.state


class OwnResult(Server):
    """Returns its own ToolResult: plain text beside a dict its next call changes."""

    name = "own"
    scope = Scope.SESSION

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"selected": []}

    @tool
    def pick(self, ctx: ToolContext, item: str) -> ToolResult:
        """Select one more item."""
        self.state["selected"].append(item)
        return ToolResult(content=[{"type": "text", "text": "ok"}], structured=self.state)


def test_a_record_of_a_handlers_own_result_shows_what_it_returned_then() -> None:
    with Runtime([OwnResult]) as rt:
        for item in ("a", "b", "c"):
            assert not rt.call("pick", ctx_args("s1", item=item)).is_error
        ops = rt.call("get_recent_context", ctx_args("s1", limit=3)).structured
    assert ops is not None
    assert [op["metadata"] for op in ops["operations"]] == [
        {"selected": ["a", "b", "c"]},
        {"selected": ["a", "b"]},
        {"selected": ["a"]},
    ]


def test_a_record_keeps_what_the_call_returned_then_not_the_servers_dict_now() -> None:
    with Runtime([Tally]) as rt:
        for item in ("i1", "i2", "i3"):
            assert not rt.call("bump", ctx_args("s1", item_id=item)).is_error
        ops = rt.call("get_recent_context", ctx_args("s1", limit=3)).structured
    assert ops is not None
    assert [(op["arguments"], op["metadata"]) for op in ops["operations"]] == [
        ({"item_id": "i3"}, {"selected_ids": ["i1", "i2", "i3"], "count": 3}),
        ({"item_id": "i2"}, {"selected_ids": ["i1", "i2"], "count": 2}),
        ({"item_id": "i1"}, {"selected_ids": ["i1"], "count": 1}),
    ]


class Counted(Server):
    """A tool whose extractor counts its runs, and one that returns its own result."""

    name = "counted"
    scope = Scope.SESSION
    runs: list[dict[str, Any]] = []

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"made": []}

    @tool(extract=lambda args, result: Counted.runs.append(result.structured) or {"n": 1})
    def make(self, ctx: ToolContext, item: str) -> dict[str, Any]:
        """Make one more item; the result is the whole, growing state."""
        self.state["made"].append(item)
        return self.state

    @tool(extract=lambda args, result: {"seen": list(result.structured["made"])})
    def own(self, ctx: ToolContext, item: str) -> ToolResult:
        """A handler's own result: JSON-looking text that is not its structured part."""
        self.state["made"].append(item)
        return ToolResult(content=[{"type": "text", "text": "{}"}], structured=self.state)


def test_an_extractor_runs_when_the_history_is_read_on_what_the_call_returned_then() -> None:
    Counted.runs.clear()
    with Runtime([Counted]) as rt:
        for item in ("a", "b"):
            assert not rt.call("make", ctx_args("s1", item=item)).is_error
        assert Counted.runs == []  # nothing extracted on the calls' path
        assert [op["metadata"] for op in recent(rt, "s1")] == [{"n": 1}, {"n": 1}]
        assert Counted.runs == [{"made": ["a"]}, {"made": ["a", "b"]}]  # then, not now
        recent(rt, "s1")
        assert len(Counted.runs) == 2  # made into records once
        # A handler's own result is extracted at once: its text is not its structured part.
        rt.call("own", ctx_args("s1", item="c"))
        rt.call("own", ctx_args("s1", item="d"))
        assert [op["metadata"] for op in recent(rt, "s1", limit=2)] == [
            {"seen": ["a", "b", "c", "d"]},
            {"seen": ["a", "b", "c"]},
        ]


class Echo(Server):
    """Keeps nothing: whatever a call leaves behind is the history's."""

    name = "echo"
    scope = Scope.SESSION

    @tool
    def echo(self, ctx: ToolContext, n: int) -> dict[str, Any]:
        """Echo n."""
        return {"id": f"e{n}"}


def test_a_busy_historys_records_leave_nothing_for_the_cyclic_collector_to_walk() -> None:
    # Each kept record lives for 50 calls: tracked, it outlived the young collections and
    # made the collector's full passes (a pause of every thread) come every few thousand
    # calls, each walking every session's 50 records.
    sessions, calls = 4, 60
    # No log lines: those wait in the writer's queue until its thread renders them.
    configure_logging(level="warning", force=True)
    with Runtime(servers=[Echo]) as rt:
        for s in range(sessions):  # the sessions' actors and histories exist from here
            rt.call("echo", ctx_args(f"s{s}", n=-1))
        gc.collect()
        before = len(gc.get_objects())
        for i in range(calls):
            for s in range(sessions):
                rt.call("echo", ctx_args(f"s{s}", n=i))
        gc.collect()
        grown = len(gc.get_objects()) - before
        ops = recent(rt, "s3", limit=60)
    assert grown < sessions  # 200 records kept (50 a session), none of them tracked
    assert len(ops) == 50
    assert [op["arguments"] for op in ops[:2]] == [{"n": 59}, {"n": 58}]
    assert [op["metadata"] for op in ops[:2]] == [{"id": "e59"}, {"id": "e58"}]
    assert ops[-1]["arguments"] == {"n": 10} and ops[-1]["tool"] == "echo"
