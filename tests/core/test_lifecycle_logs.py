"""What the registry tells operators and callers about actors' lives, exactly.

Spawning, eviction, reaping and ending a session each log one line with the key; the counts
in `stats()` follow; the TTL boundary and the cleanup wait of `end_session` are pinned.
"""

from __future__ import annotations

import threading
import time
import types
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from ctxactors import (
    InvalidArgumentsError,
    Runtime,
    RuntimeClosedError,
    Scope,
    Server,
    ToolContext,
    tool,
)
from ctxactors._actors import SyncReply
from ctxactors._call import CallHost, Envelope, ToolCall
from ctxactors.context import SHARED_SESSION_FIX
from ctxactors.testing import ManualClock, wait_until
from ctxactors.testing import context_args as ctx_args
from ctxactors.tools import Key

WAIT = 20.0


def traced(event: dict[str, Any]) -> dict[str, Any]:
    """A captured line with its exception shown as ``repr``: errors are logged with
    ``exc_info`` (the traceback reaches the reader), never as a pre-formatted string."""
    return {**event, "exc_info": repr(event["exc_info"])}


class Counter(Server):
    name = "counter"
    scope = Scope.ASSISTANT

    def __init__(self) -> None:
        self.n = 0

    @tool
    def bump(self, ctx: ToolContext) -> dict[str, Any]:
        """Count calls on this incarnation."""
        self.n += 1
        return {"n": self.n}


LIFECYCLE = {"actor_spawned", "actor_evicted", "actor_reaped", "session_ended"}


def lifecycle(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] in LIFECYCLE]


def test_spawn_evict_reap_and_end_are_logged_with_their_keys(clock: ManualClock) -> None:
    with capture_logs() as logs, Runtime([Counter], clock=clock, ttl=60, max_actors=2) as rt:
        rt.call("bump", ctx_args("s1", "a"))
        clock.advance(1)
        rt.call("bump", ctx_args("s1", "b"))
        clock.advance(1)
        rt.call("bump", ctx_args("s2", "a"))  # over the cap: (s1, a) is evicted
        clock.advance(60)  # (s1, b) idle 61 s, (s2, a) exactly 60 s: both past the TTL
        assert rt.reap() == 2
        rt.call("bump", ctx_args("s3", "a"))
        assert rt.end_session("s3") == 1
        assert rt.end_session("s3") == 0  # nothing left: nothing logged
        stats = rt.stats()
    assert lifecycle(logs) == [
        spawned("s1", "a", 1),
        spawned("s1", "b", 2),
        spawned("s2", "a", 3),
        {**key_fields("s1", "a"), "event": "actor_evicted", "reason": "max_actors"},
        {**key_fields("s1", "b"), "event": "actor_reaped", "reason": "ttl"},
        {**key_fields("s2", "a"), "event": "actor_reaped", "reason": "ttl"},
        spawned("s3", "a", 1),
        {
            "logger": "ctxactors",
            "event": "session_ended",
            "log_level": "info",
            "principal": None,
            "session_id": "s3",
            "actors": 1,
        },
    ]
    assert {k: stats[k] for k in ("spawned", "evicted", "reaped", "ended", "calls")} == {
        "spawned": 4,
        "evicted": 1,
        "reaped": 2,
        "ended": 1,
        "calls": 4,
    }
    assert stats["actors"] == 0 and stats["sessions"] == 0 and stats["peak_actors"] == 3


def key_fields(session: str, assistant: str) -> dict[str, Any]:
    return {
        "logger": "ctxactors",
        "log_level": "info",
        "server": "counter",
        "principal": None,
        "session_id": session,
        "key": ["counter", (None, session), assistant],
    }


def spawned(session: str, assistant: str, actors: int) -> dict[str, Any]:
    return {**key_fields(session, assistant), "event": "actor_spawned", "actors": actors}


def test_the_ttl_counts_from_the_last_use_and_includes_its_boundary(clock: ManualClock) -> None:
    with Runtime([Counter], clock=clock, ttl=10) as rt:
        rt.call("bump", ctx_args("s", "a"))
        clock.advance(9.5)
        assert rt.reap() == 0
        rt.call("bump", ctx_args("s", "a"))  # used again: the TTL starts over
        clock.advance(9.5)
        assert rt.reap() == 0
        clock.advance(0.5)  # idle for exactly the TTL
        assert rt.reap() == 1
        assert rt.call("bump", ctx_args("s", "a")).structured == {"n": 1}


class StuckClose(Server):
    """A server whose cleanup hangs until the test lets it finish."""

    name = "stuck"
    closing = threading.Event()
    finish = threading.Event()

    @tool
    def touch(self, ctx: ToolContext) -> dict[str, Any]:
        """Spawn the key."""
        return {}

    def close(self) -> None:
        StuckClose.closing.set()
        StuckClose.finish.wait(WAIT)


def test_end_session_waits_for_cleanup_at_most_the_call_timeout() -> None:
    StuckClose.closing.clear()
    StuckClose.finish.clear()
    with Runtime([StuckClose], call_timeout=0.2) as rt:
        rt.call("touch", ctx_args("s"))
        ended: list[int] = []
        ender = threading.Thread(target=lambda: ended.append(rt.end_session("s")))
        ender.start()
        assert StuckClose.closing.wait(WAIT)
        ender.join(WAIT / 2)  # returns once its wait runs out, while close() still hangs
        assert not ender.is_alive() and ended == [1]
        assert not StuckClose.finish.is_set()
        StuckClose.finish.set()


class Busy(Server):
    """Busy (like a workspace with processes running) while its flag is set."""

    name = "busy"
    scope = Scope.SESSION
    flag = threading.Event()

    @tool
    def touch(self, ctx: ToolContext) -> dict[str, Any]:
        """Spawn the key."""
        return {}

    def is_busy(self) -> bool:
        return Busy.flag.is_set()


def test_a_busy_server_is_neither_reaped_nor_evicted(clock: ManualClock) -> None:
    Busy.flag.set()
    try:
        with Runtime([Busy, Counter], clock=clock, ttl=10, max_actors=1) as rt:
            rt.call("touch", ctx_args("s"))
            rt.call("bump", ctx_args("t", "a"))  # over the cap, but the busy one stays
            assert [k[0] for k in rt._registry.keys()] == ["busy", "counter"]
            clock.advance(11)
            assert rt.reap() == 1  # only the idle counter
            assert rt._registry.keys() == [("busy", (None, "s"))]
            Busy.flag.clear()
            assert rt.reap() == 1
    finally:
        Busy.flag.clear()


def test_the_background_reaper_stops_idle_actors_by_itself() -> None:
    with Runtime([Counter], ttl=0.05, scan_interval=0.01) as rt:
        rt.call("bump", ctx_args("s", "a"))
        wait_until(lambda: rt.stats()["reaped"] == 1, WAIT)
        assert rt.stats()["reaped"] == 1 and rt.stats()["actors"] == 0


class SlowClose(Server):
    """Cleanup that takes a moment; records when it is done."""

    name = "slowclose"
    done: list[str] = []

    @tool
    def touch(self, ctx: ToolContext) -> dict[str, Any]:
        """Spawn the key."""
        return {}

    def close(self) -> None:
        threading.Event().wait(0.05)
        SlowClose.done.append("closed")


def test_close_returns_once_every_actor_has_cleaned_up() -> None:
    SlowClose.done.clear()
    rt = Runtime([SlowClose])
    rt.call("touch", ctx_args("s1"))
    rt.call("touch", ctx_args("s2"))
    rt.close()
    assert SlowClose.done == ["closed", "closed"]


def test_observers_see_calls_but_not_undos_and_a_failing_one_is_logged(
    clock: ManualClock,
) -> None:
    seen: list[tuple[str, str | None, bool, list[str]]] = []

    def watch(ctx: ToolContext, spec: Any, args: dict[str, Any], result: Any) -> None:
        seen.append((spec.name, ctx.session_id, result.is_error, sorted(args)))

    def broken(ctx: ToolContext, spec: Any, args: dict[str, Any], result: Any) -> None:
        raise ValueError("observer bug")

    with capture_logs() as logs:
        with Runtime(clock=clock) as rt:
            rt.add_observer(watch)
            rt.add_observer(broken, before_reply=True)
            rt.add_observer(broken)
            assert rt.call("create_goal", ctx_args("s", goal="g")).structured == {
                "id": "g1",
                "goal": "g",
            }
            ops = [
                {"tool": "create_goal", "arguments": {"goal": "undone"}},
                {"tool": "mark_todo", "arguments": {"todo_id": "missing"}},
            ]
            options = {"transactional": True}
            rt.call("batch", ctx_args("s", operations=ops, options=options))
    # The undo of the second create_goal is not a call: no observer sees it.
    assert sorted(seen) == sorted(
        [
            ("create_goal", "s", False, ["goal"]),
            ("create_goal", "s", False, ["goal"]),
            ("mark_todo", "s", True, ["todo_id"]),
            ("batch", "s", True, ["operations", "options"]),
        ]
    )
    failures = [traced(e) for e in logs if e["event"] == "observer_failed"]
    assert failures == 8 * [  # before and after the reply, for each of the 4 calls
        {
            "logger": "ctxactors",
            "event": "observer_failed",
            "log_level": "error",
            "exc_info": "ValueError('observer bug')",
        }
    ]


def test_a_call_logs_its_duration_in_milliseconds() -> None:
    class Nap(Server):
        name = "nap"

        @tool
        def nap(self, ctx: ToolContext) -> dict[str, Any]:
            """Take at least 50 ms."""
            threading.Event().wait(0.05)
            return {}

    with capture_logs() as logs:
        with Runtime([Nap]) as rt:
            started = time.perf_counter()
            rt.call("nap", ctx_args("s"))
            elapsed_ms = (time.perf_counter() - started) * 1000
    (line,) = [e for e in logs if e["event"] == "tool_call"]
    assert 50 <= line["duration_ms"] <= elapsed_ms + 1
    assert line["duration_ms"] == round(line["duration_ms"], 3)  # microseconds, no finer


class Unstartable(Server):
    name = "unstartable"

    def __init__(self) -> None:
        raise ValueError("no database")

    @tool
    def use(self, ctx: ToolContext) -> dict[str, Any]:
        """Never runs."""
        return {}


def test_a_server_that_fails_to_start_answers_every_call_with_the_reason() -> None:
    with Runtime([Unstartable, Counter]) as rt:
        for _ in range(2):
            failed = rt.call("use", ctx_args("s"))
            assert failed.is_error
            assert failed.text == "RuntimeError: server failed to start: no database"
        assert rt.call("bump", ctx_args("s", "a")).structured == {"n": 1}  # others unharmed
    with pytest.raises(RuntimeClosedError) as caught:
        rt.call("bump", ctx_args("s", "a"))
    assert str(caught.value) == "the runtime is closed"


def reapers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ctxactors-reaper"]


def test_runtime_defaults_and_when_a_background_reaper_runs(clock: ManualClock) -> None:
    before = len(reapers())
    with Runtime() as rt:
        assert rt.call_timeout == 30.0 and len(rt.list_tools()) == len(rt.tools)
        assert (rt._registry.ttl, rt._registry.max_actors) == (3600.0, 10_000)
        assert rt.stats()["peak_actors"] == 0
        started = reapers()
        assert len(started) == before + 1 and started[-1].daemon
    with Runtime(clock=clock) as rt:  # a test clock: the test reaps by itself
        assert len(reapers()) == before
    with Runtime(scan_interval=0) as rt:  # 0: no background reaper
        assert len(reapers()) == before
    with Runtime(scan_interval=0.5, clock=clock) as rt:
        assert len(reapers()) == before + 1
    assert len(reapers()) == before


def test_bad_settings_are_refused_with_what_is_wrong() -> None:
    for kwargs, message in (
        ({"ttl": 0}, "ttl must be positive"),
        ({"max_actors": 0}, "max_actors must be at least 1"),
        ({"tools": "some"}, "tools must be 'all' or 'unified', got 'some'"),
    ):
        with pytest.raises(ValueError) as caught:
            Runtime(**kwargs)  # type: ignore[arg-type]
        assert str(caught.value) == message


def test_a_call_without_a_session_falls_back_to_default_with_one_warning() -> None:
    with capture_logs() as logs, Runtime() as rt:
        assert rt.call("create_goal", {"goal": "x"}).structured == {"id": "g1", "goal": "x"}
        rt.call("create_goal", {"goal": "y"})
        rt.call("create_goal", {"goal": "z"})
        assert rt.call("get_planning_state", ctx_args("default")).structured["goals"] == [
            {"id": "g1", "goal": "x"},
            {"id": "g2", "goal": "y"},
            {"id": "g3", "goal": "z"},
        ]
    # One line for the runtime, on the first such call: it names the hosts' fix.
    warned = [e for e in logs if e["event"] == "no_session_id"]
    assert warned == [
        {
            "logger": "ctxactors",
            "event": "no_session_id",
            "log_level": "warning",
            "tool": "create_goal",
            "fallback": "default",
            "fix": SHARED_SESSION_FIX,
        }
    ]
    assert "'ctxactors/sessionId'" in SHARED_SESSION_FIX
    assert "--context-meta" in SHARED_SESSION_FIX and "inject_context" in SHARED_SESSION_FIX


def test_an_observer_runs_after_the_reply_unless_asked_to_run_before() -> None:
    release = threading.Event()
    finished: list[str] = []

    def slow(ctx: ToolContext, spec: Any, args: dict[str, Any], result: Any) -> None:
        release.wait(WAIT / 4)
        finished.append(spec.name)

    with Runtime() as rt:
        rt.add_observer(slow)
        rt.call("create_goal", ctx_args("s", goal="g"))
        assert finished == []  # the caller had its reply before the observer finished
        release.set()


def test_arguments_of_any_mapping_and_bad_context_values_are_explained() -> None:
    with Runtime() as rt:
        frozen = types.MappingProxyType({"goal": "x", "__sessionId": "m"})
        assert rt.call("create_goal", frozen).structured == {"id": "g1", "goal": "x"}
        with pytest.raises(InvalidArgumentsError) as caught:
            rt.call("create_goal", {"goal": "x", "__sessionId": 7})
        assert str(caught.value) == "reserved field '__sessionId' must be a string, got int"
        with pytest.raises(InvalidArgumentsError) as caught:
            rt.call("create_goal", {"goal": "x"}, meta={"ctxactors/sessionId": 7})
        assert str(caught.value) == "_meta field 'ctxactors/sessionId' must be a string, got int"
        with pytest.raises(InvalidArgumentsError) as caught:
            rt.call("create_goal", "[" * 100_000 + "]" * 100_000)
        assert str(caught.value) == "arguments are nested too deeply to decode"


class BadClose(Server):
    name = "badclose"

    @tool
    def touch(self, ctx: ToolContext) -> dict[str, Any]:
        """Spawn the key."""
        return {}

    def close(self) -> None:
        raise RuntimeError("disk gone")


def test_start_and_close_failures_are_logged_with_the_error() -> None:
    with capture_logs() as logs:
        with Runtime([Unstartable, BadClose]) as rt:
            rt.call("use", ctx_args("s"))
            rt.call("touch", ctx_args("s"))
    events = ("server_start_failed", "server_close_failed")
    failures = [traced(e) for e in logs if e["event"] in events]
    assert failures == [
        {
            "logger": "ctxactors.actors",
            "event": "server_start_failed",
            "log_level": "error",
            "exc_info": "ValueError('no database')",
        },
        {
            "logger": "ctxactors.actors",
            "event": "server_close_failed",
            "log_level": "error",
            "exc_info": "RuntimeError('disk gone')",
        },
    ]


def test_close_waits_for_a_stuck_cleanup_at_most_the_call_timeout() -> None:
    StuckClose.closing.clear()
    StuckClose.finish.clear()
    rt = Runtime([StuckClose], call_timeout=0.2)
    rt.call("touch", ctx_args("s"))
    closer = threading.Thread(target=rt.close)
    closer.start()
    try:
        assert StuckClose.closing.wait(WAIT)
        closer.join(WAIT / 2)  # returns once its wait runs out, while close() still hangs
        assert not closer.is_alive() and not StuckClose.finish.is_set()
    finally:
        StuckClose.finish.set()


class BadBusy(Server):
    name = "badbusy"

    @tool
    def touch(self, ctx: ToolContext) -> dict[str, Any]:
        """Spawn the key."""
        return {}

    def is_busy(self) -> bool:
        raise RuntimeError("cannot tell")


def test_a_failing_reaper_pass_is_logged_and_the_reaper_goes_on() -> None:
    with capture_logs() as logs, Runtime([BadBusy], ttl=0.01, scan_interval=0.01) as rt:
        rt.call("touch", ctx_args("s"))
        wait_until(lambda: sum(e["event"] == "reap_failed" for e in logs) >= 2, WAIT)  # it retries
    failed = [e for e in logs if e["event"] == "reap_failed"]
    assert len(failed) >= 2
    assert traced(failed[0]) == {
        "logger": "ctxactors",
        "event": "reap_failed",
        "log_level": "error",
        "exc_info": "RuntimeError('cannot tell')",
    }


def test_a_failing_after_hook_is_logged_and_the_actor_keeps_serving() -> None:
    def boom(logger: Any, method: str, event: Any) -> Any:
        raise ValueError("after bug")

    # The first call's host writes its log line with a logger that raises.
    broken = CallHost(structlog.wrap_logger(structlog.PrintLogger(), [boom]), None, [], [])
    spec, ctx = Counter.tools["bump"], ToolContext("s")
    key = Key(("counter-direct", (None, "s")))
    with capture_logs() as logs, Runtime([Counter]) as rt:
        first, second = SyncReply(), SyncReply()
        # Same key, so the second runs after the first message's failed log line.
        for reply, host in ((first, broken), (second, rt._host)):
            envelope = Envelope(
                ToolCall("bump", ctx, {}), spec, spec.validate({}), key, reply, host
            )
            rt._registry.submit(key, Counter, envelope)
        assert first.wait(WAIT) and second.wait(WAIT)
        assert (first.value.structured, second.value.structured) == ({"n": 1}, {"n": 2})
    failed = [traced(e) for e in logs if e["event"] == "after_call_failed"]
    assert failed == [
        {
            "logger": "ctxactors.call",
            "event": "after_call_failed",
            "log_level": "error",
            "exc_info": "ValueError('after bug')",
        }
    ]


def test_ending_a_principals_session_logs_that_principal() -> None:
    with capture_logs() as logs, Runtime([Counter]) as rt:
        rt.call("bump", ctx_args("s", "a"), principal="p1")
        assert rt.end_session("s", principal="p1") == 1
    [call] = [e for e in logs if e["event"] == "tool_call"]
    assert (call["principal"], call["session_id"], call["tool"]) == ("p1", "s", "bump")
    assert [e for e in logs if e["event"] == "session_ended"] == [
        {
            "logger": "ctxactors",
            "event": "session_ended",
            "log_level": "info",
            "principal": "p1",
            "session_id": "s",
            "actors": 1,
        }
    ]


def test_a_message_without_a_reply_slot_runs_and_the_key_keeps_serving() -> None:
    spec, ctx = Counter.tools["bump"], ToolContext("s")
    key = Key(("counter-direct", (None, "s")))
    with Runtime([Counter]) as rt:
        reply = SyncReply()
        for slot in (None, reply):
            envelope = Envelope(
                ToolCall("bump", ctx, {}), spec, spec.validate({}), key, slot, rt._host
            )
            rt._registry.submit(key, Counter, envelope)
        assert reply.wait(WAIT)
        assert reply.value.structured == {"n": 2}
        assert rt.stats()["inflight"] == 0


def test_context_fields_in_the_arguments_beside_meta_are_dropped_with_a_warning() -> None:
    meta = {"ctxactors/sessionId": "s1", "ctxactors/assistantId": "a1", "ctxactors/threadId": "t1"}
    with capture_logs() as logs, Runtime([Counter]) as rt:
        done = rt.call("bump", {"__sessionId": "victim"}, meta=meta, principal="p1")
        assert done.structured == {"n": 1}
        assert rt.has_session("s1", principal="p1") and not rt.has_session("victim")
    assert [e for e in logs if e["event"] == "spoofed_context_dropped"] == [
        {
            "logger": "ctxactors",
            "event": "spoofed_context_dropped",
            "log_level": "warning",
            "tool": "bump",
            "fields": ["__sessionId"],
            "principal": "p1",
            "session_id": "s1",
            "assistant_id": "a1",
            "thread_id": "t1",
        }
    ]
