"""Saves an actor goes on without: when the store is busy, a key's actor hands its save to
the group commit and runs its next message; the caller is answered by the thread that
writes the save, once the store has it. These tests pin the two promises that window must
keep: no call of the key runs on state the store has not confirmed (it waits for the
outcome, and a refused save is rolled back or reloaded first), and nothing acknowledged is
lost when the process is killed."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ctxactors import Runtime, ToolContext
from ctxactors.history_store import KEY as HISTORY_KEY
from ctxactors.history_store import StoredCall, unpack
from ctxactors.servers import Planning
from ctxactors.servers.planning import Goal, PlanningState
from ctxactors.settings import HistorySettings, Settings
from ctxactors.state import Outcome, SQLiteStore, Write
from ctxactors.testing import context_args as ctx_args
from ctxactors.testing import wait_until

S = "s1"
A = "a1"
KEY = ("planning", A, None)


class HeldStore(SQLiteStore):
    """A real SQLite store whose writes wait at `gate` while `held` is set."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.held = False
        self.inside = threading.Event()
        self.gate = threading.Event()

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        if self.held:
            self.inside.set()
            assert self.gate.wait(30)
        return super().write(writes)


def goals(result: Any) -> list[str]:
    assert not result.is_error, result.text
    return [g["goal"] for g in result.structured["goals"]]


@pytest.mark.parametrize("outcome", ["saved", "store down", "stale"])
def test_a_call_behind_a_save_in_flight_runs_only_once_that_save_is_settled(
    tmp_path: Path, outcome: str
) -> None:
    store = HeldStore(tmp_path / "state.db")
    results: dict[str, Any] = {}

    def send(name: str, rt: Runtime, tool: str, session: str, **args: Any) -> threading.Thread:
        def run() -> None:
            results[name] = rt.call(tool, ctx_args(session, A, **args))

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    with Runtime([Planning], store=store) as rt:
        kept = rt.call("create_goal", ctx_args(S, A, goal="kept"))
        assert kept.structured == {"id": "g1", "goal": "kept"}
        store.held = True
        busy = send("other", rt, "create_goal", "s2", goal="other")
        assert store.inside.wait(30)  # s2's actor is writing: the store is busy
        second = send("second", rt, "create_goal", S, goal="second")
        commit = rt.durability.commit  # type: ignore[union-attr]
        # second's save waits its turn, and s1's actor has gone on without it.
        queue = commit._queue  # noqa: SLF001
        wait_until(lambda: any(p.write.key == KEY for p in list(queue)), 30, interval=0.001)
        if outcome == "saved":  # a write on top of the unconfirmed one
            behind = send("behind", rt, "create_goal", S, goal="third")
        else:
            behind = send("behind", rt, "get_planning_state", S)
        key = Planning.scope.key("planning", ToolContext(S, A))
        slot = rt._registry._entries[key].server._ctxactors_durable  # noqa: SLF001
        # The call behind has either run already (on unconfirmed state: the bug) or waits
        # for second's outcome (it took the save to settle).
        wait_until(lambda: "behind" in results or slot.saving is None, 30, interval=0.001)
        if outcome == "store down":
            SQLiteStore.close(store)  # every write from now on fails
        elif outcome == "stale":
            rival = SQLiteStore(tmp_path / "state.db")  # another process's newer state
            newer = PlanningState([Goal("g1", "kept"), Goal("g2", "rival")], [], 2)
            assert rival.write([Write((None, S), KEY, msgspec.msgpack.encode(newer), 1)]) == [2]
            rival.close()
        store.gate.set()
        for thread in (busy, second, behind):
            thread.join(30)
        if outcome == "saved":
            assert results["second"].structured == {"id": "g2", "goal": "second"}
            assert results["behind"].structured == {"id": "g3", "goal": "third"}
            record = store.load((None, S), KEY)
            assert record is not None and record.revision == 3
            stored = msgspec.msgpack.decode(record.data, type=PlanningState)
            assert [g.goal for g in stored.goals] == ["kept", "second", "third"]
        elif outcome == "store down":
            assert results["second"].is_error
            assert "state store is unavailable" in results["second"].text
            assert goals(results["behind"]) == ["kept"]  # rolled back before it ran
        else:
            assert results["second"].is_error
            assert "loaded revision 1, the store holds 2" in results["second"].text
            assert goals(results["behind"]) == ["kept", "rival"]  # reloaded before it ran
    store.close()


def test_a_save_still_queued_when_the_next_call_stops_waiting_is_never_written(
    tmp_path: Path,
) -> None:
    store = HeldStore(tmp_path / "state.db")
    results: dict[str, Any] = {}

    def send(name: str, rt: Runtime, session: str, goal: str) -> threading.Thread:
        def run() -> None:
            results[name] = rt.call("create_goal", ctx_args(session, A, goal=goal), timeout=30)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    # call_timeout is also how long a key's next call waits for a save it went on without.
    with Runtime([Planning], store=store, call_timeout=0.2) as rt:
        assert rt.call("create_goal", ctx_args(S, A, goal="kept"), timeout=30).structured
        store.held = True
        busy = send("other", rt, "s2", "other")
        assert store.inside.wait(30)
        second = send("second", rt, S, "second")
        queue = rt.durability.commit._queue  # type: ignore[union-attr]  # noqa: SLF001
        wait_until(lambda: any(p.write.key == KEY for p in list(queue)), 30, interval=0.001)
        # The store is still busy when this call's wait for second's save runs out: the
        # save is taken out of the queue, refused, and the key reads its stored state.
        behind = rt.call("get_planning_state", ctx_args(S, A), timeout=30)
        assert goals(behind) == ["kept"]
        second.join(30)
        assert results["second"].is_error
        assert "did not confirm the save in time" in results["second"].text
        store.gate.set()
        busy.join(30)
        record = store.load((None, S), KEY)
        assert record is not None and record.revision == 1  # second was never written
        assert rt.call("create_goal", ctx_args(S, A, goal="later"), timeout=30).structured == {
            "id": "g2",
            "goal": "later",
        }
    store.close()


def test_end_session_deletes_after_the_saves_already_queued_for_the_session(
    tmp_path: Path,
) -> None:
    store = HeldStore(tmp_path / "state.db")
    results: dict[str, Any] = {}

    def send(name: str, run: Callable[[], Any]) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.__setitem__(name, run()))
        thread.start()
        return thread

    def goal(session: str, text: str, thread: str | None = None) -> Any:
        return rt.call("create_goal", ctx_args(session, A, thread, goal=text), timeout=30)

    # The histories are written only when the session ends or the runtime closes (the
    # history's own test covers end_session): the save queued here is the planning one.
    settings = Settings(history=HistorySettings(write_delay=600))
    # call_timeout is how long end_session waits for the session's calls (here, one whose
    # save waits in the store's queue) before it deletes: it gives up on it at once.
    with Runtime([Planning], store=store, settings=settings, call_timeout=0.2) as rt:
        assert rt.durability is not None
        # How long the delete then waits for what is queued before it: long, so this test
        # never has to beat it (a loaded machine must not turn a pass into a failure).
        rt.durability.save_timeout = 30
        assert goal(S, "kept", "t0").structured == {"id": "g1", "goal": "kept"}  # stored
        store.held = True
        busy = send("other", lambda: goal("s2", "other"))
        assert store.inside.wait(30)  # s2's save is being written: the store is busy
        # The first save of another key of the session (a row to insert): it waits its
        # turn in the store's queue while the session ends.
        second = send("second", lambda: goal(S, "second"))
        queue = rt.durability.commit._queue  # noqa: SLF001
        wait_until(lambda: any(p.write.key == KEY for p in list(queue)), 30, interval=0.001)
        ending = send("ended", lambda: rt.end_session(S))
        # end_session either waits behind that save (its barrier is queued after it) or
        # has returned already: either way the store goes on only now.
        wait_until(
            lambda: not ending.is_alive() or any(p.write.key == ("",) for p in list(queue)),
            30,
            interval=0.001,
        )
        store.gate.set()
        for thread in (busy, second, ending):
            thread.join(30)
        assert results["ended"] == 2  # the actors of threads t0 and None
        assert results["second"].structured == {"id": "g1", "goal": "second"}  # then deleted
        # Once every save of the session is answered, nothing of it is in the store...
        with sqlite3.connect(tmp_path / "state.db") as db:
            for table in ("state", "parts", "sessions"):
                rows = db.execute(f"SELECT * FROM {table} WHERE session = ?", ('[null,"s1"]',))
                assert rows.fetchall() == [], table
            kept = db.execute("SELECT key FROM state WHERE session = ?", ('[null,"s2"]',))
            assert kept.fetchall() == [('["planning","a1",null]',)]
        # ...so the session's next calls start from nothing.
        for thread in (None, "t0"):
            state = rt.call("get_planning_state", ctx_args(S, A, thread), timeout=30)
            assert state.structured == {"goals": [], "todos": []}
        assert goal(S, "anew").structured == {"id": "g1", "goal": "anew"}
    # The session's history holds only the calls made after its end: not "second", whose
    # record came after the delete (written then, it would bring the ended session back).
    record = store.load((None, S), HISTORY_KEY)
    assert record is not None
    calls = [r for r, _ in unpack(record.data) if isinstance(r, StoredCall)]
    assert [(c.tool, c.thread_id) for c in calls] == [
        ("get_planning_state", None),
        ("get_planning_state", "t0"),
        ("create_goal", None),
    ]
    store.close()


# A runtime in its own process, no call wrappers (so saves go on without their actors),
# 16 sessions of load; each call is printed before it is sent and once it is answered.
_CHILD = """
import os, sys, threading
from ctxactors import Runtime, ToolContext
from ctxactors.servers import Planning
from ctxactors.state import SQLiteStore
rt = Runtime([Planning], store=SQLiteStore(sys.argv[1]))
assert rt._host.wrappers == ()
out = threading.Lock()
def say(line):
    with out:
        sys.stdout.write(line + "\\n")
        sys.stdout.flush()
def load(session):
    n = 0
    while True:
        n += 1
        goal = f"{session}-goal-{n}"
        say(f"send {session} {goal}")
        r = rt.call("create_goal", {"goal": goal, "__sessionId": session, "__assistantId": "a1"})
        if r.is_error:
            say(f"error {session} {r.text!r}")
            os._exit(1)
        say(f"ack {session} {goal}")
for i in range(16):
    threading.Thread(target=load, args=(f"crash-{i}",), daemon=True).start()
threading.Event().wait()
"""


def test_sigkill_of_an_embedded_runtime_loses_no_acknowledged_call(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    kill_after = random.Random(os.getpid()).randint(300, 1500)  # a random moment
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    acked: dict[str, list[str]] = {}
    in_flight: dict[str, str | None] = {}
    assert child.stdout is not None
    killed = False
    try:
        # Read to the end: lines the child wrote before the kill landed, still in the pipe,
        # are calls it acknowledged too.
        for line in child.stdout:
            verb, session, goal = line.split(maxsplit=2)
            assert verb != "error", line  # a call failed: no crash needed to fail the test
            if verb == "send":
                in_flight[session] = goal.strip()
            else:
                acked.setdefault(session, []).append(goal.strip())
                in_flight[session] = None
                if not killed and sum(len(a) for a in acked.values()) >= kill_after:
                    os.kill(child.pid, signal.SIGKILL)
                    killed = True
    finally:
        if child.poll() is None:
            child.kill()
        child.stdout.close()
    child.wait(30)
    assert child.returncode == -signal.SIGKILL
    assert sum(len(a) for a in acked.values()) >= kill_after

    store = SQLiteStore(path)
    in_doubt_present = 0
    with Runtime([Planning], store=store) as rt:
        for session, acked_goals in acked.items():
            found = goals(rt.call("get_planning_state", ctx_args(session, A)))
            doubt = in_flight.get(session)
            if doubt is not None and found == [*acked_goals, doubt]:
                in_doubt_present += 1  # saved, but killed before its reply was printed
            else:
                assert found == acked_goals, session
    store.close()
    assert 0 <= in_doubt_present <= 16
