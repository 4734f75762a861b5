"""The workspace: real processes per session, their output, timeouts, kills and cleanup.

Every test that starts processes checks afterwards that no child process (zombie or not)
and no thread is left over.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
import pytest
from workspace_support import (
    WAIT,
    Leaks,
    call,
    descendant_names,
    session_dirs,
    start,
    wait_done,
    wait_output,
    workspace_runtime,
)

from ctxactors import InvalidArgumentsError, Runtime
from ctxactors.servers.workspace import Workspace
from ctxactors.testing import ManualClock, wait_until
from ctxactors.testing import context_args as ctx_args

pytestmark = pytest.mark.usefixtures("workspace_root")  # each test on a root of its own


def test_command_runs_in_the_sessions_directory_and_reports_exit_and_output(
    rt: Runtime, workspace_root: str
) -> None:
    pid = start(rt, "s1", "pwd; echo out; echo err >&2; touch made-here; exit 3")
    done = wait_done(rt, "s1", pid)
    assert done["status"] == "exited" and done["exitCode"] == 3
    assert done["output"].splitlines() == ["/workspace", "out", "err"]
    [host_dir] = session_dirs(workspace_root)
    assert os.listdir(host_dir) == ["made-here"]
    # A second command sees the same directory; another session gets its own.
    assert wait_done(rt, "s1", start(rt, "s1", "ls"))["output"] == "made-here\n"
    assert wait_done(rt, "s2", start(rt, "s2", "pwd; ls"))["output"] == "/workspace\n"
    assert len(session_dirs(workspace_root)) == 2
    listed = call(rt, "s1", "list_processes")
    assert listed["count"] == 2
    assert [p["processId"] for p in listed["processes"]][0] == pid
    assert listed["processes"][0]["command"].startswith("pwd;")
    assert listed["processes"][0]["exitCode"] == 3


def test_fifty_sessions_concurrently_each_see_only_their_own_marker(
    rt: Runtime, leaks: Leaks
) -> None:
    sessions = [f"sess-{i:02d}" for i in range(50)]

    def one(session: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
        pid = start(rt, session, f"sleep 0.2; echo marker-{session}")
        return session, wait_done(rt, session, pid), call(rt, session, "list_processes")

    with ThreadPoolExecutor(max_workers=50) as pool:
        outcomes = list(pool.map(one, sessions))
    for session, done, listed in outcomes:
        assert done["status"] == "exited" and done["exitCode"] == 0
        assert done["output"] == f"marker-{session}\n"
        assert listed["count"] == 1
    assert rt.stats()["actors"] == 50


def test_timeout_kills_the_whole_group(rt: Runtime) -> None:
    pid = start(rt, "s1", "echo started; sleep 30 & sleep 30; wait", timeout=0.5)
    done = wait_done(rt, "s1", pid)
    assert done["status"] == "timeout" and done["exitCode"] == -9
    assert done["output"] == "started\n"
    # The background sleep was in the group and is gone too (checked by the leaks fixture
    # after close; here: no sleep left among our descendants).
    assert "sleep" not in descendant_names()


def test_kill_process_kills_the_group_and_reports_killed(rt: Runtime) -> None:
    pid = start(rt, "s1", "echo up; sleep 30 & sleep 30; wait")
    assert "up" in wait_output(rt, "s1", pid, "up")["output"]
    grandchildren = [p for p in psutil.Process().children(recursive=True) if p.name() == "sleep"]
    killed = call(rt, "s1", "kill_process", processId=pid)
    assert killed == {"processId": pid, "status": "killed", "exitCode": -9}
    assert wait_done(rt, "s1", pid)["status"] == "killed"
    _, alive = psutil.wait_procs(grandchildren, timeout=WAIT)
    assert alive == []
    # Killing again is harmless and says the same.
    assert call(rt, "s1", "kill_process", processId=pid)["status"] == "killed"


def test_kill_after_exit_keeps_exited(rt: Runtime) -> None:
    pid = start(rt, "s1", "true")
    assert wait_done(rt, "s1", pid)["status"] == "exited"
    assert call(rt, "s1", "kill_process", processId=pid)["status"] == "exited"


def test_output_cap_keeps_the_newest_bytes_of_megabytes(leaks: Leaks) -> None:
    with workspace_runtime(leaks, max_output_bytes=64 * 1024) as rt:
        _newest_bytes_are_kept(rt)


def _newest_bytes_are_kept(rt: Runtime) -> None:
    # 4 MB of 'a', then a marker; then multibyte text so the cut may land mid-character.
    cmd = "head -c 4000000 /dev/zero | tr '\\0' a; printf '리포트%.0s' $(seq 30000); echo END"
    done = wait_done(rt, "s1", start(rt, "s1", cmd))
    assert done["status"] == "exited"
    output = done["output"]
    note, _, kept = output.partition("\n")
    assert note.startswith("[... ") and note.endswith(" bytes of earlier output dropped ...]")
    dropped = int(note.split()[1])
    assert len(kept.encode()) + dropped == 4_000_000 + 30000 * len("리포트".encode()) + 4
    assert len(kept.encode()) <= 64 * 1024 and kept.endswith("리포트END\n")
    assert "\ufffd" not in kept  # the cut never splits a character


def test_another_sessions_process_is_invisible(rt: Runtime) -> None:
    pid = start(rt, "alice", "echo alice-secret; sleep 30")
    wait_output(rt, "alice", pid, "alice-secret")
    made_up = "p_" + "A" * 16
    for tool in ("poll_process", "kill_process"):
        theirs = rt.call(tool, ctx_args("bob", processId=pid))
        nobody = rt.call(tool, ctx_args("bob", processId=made_up))
        assert theirs.is_error and nobody.is_error and theirs.structured is None
        # The same words as for an id that never existed: nothing about the process.
        assert theirs.text == nobody.text.replace(made_up, pid)
        assert "alice" not in theirs.text and "sleep" not in theirs.text
    assert call(rt, "bob", "list_processes") == {"processes": [], "count": 0}
    # Bob's kill attempt did nothing.
    assert call(rt, "alice", "poll_process", processId=pid)["status"] == "running"


def test_running_processes_keep_the_actor_from_being_reaped(
    leaks: Leaks, clock: ManualClock, workspace_root: str
) -> None:
    with Runtime(servers=[Workspace], ttl=10, clock=clock) as rt:
        pid = start(rt, "s1", "echo up; sleep 30")
        wait_output(rt, "s1", pid, "up")
        [cwd] = session_dirs(workspace_root)
        clock.advance(100)
        assert rt.reap() == 0  # busy
        assert call(rt, "s1", "poll_process", processId=pid)["status"] == "running"
        call(rt, "s1", "kill_process", processId=pid)
        clock.advance(100)
        assert rt.reap() == 1
        wait_until(lambda: not os.path.exists(cwd), WAIT)
        assert not os.path.exists(cwd)
        # The next call is a fresh incarnation: no memory of the old process.
        gone = rt.call("poll_process", ctx_args("s1", processId=pid))
        assert gone.is_error and "not found" in gone.text
    leaks.assert_none()


def test_end_session_kills_processes_and_removes_the_directory(
    rt: Runtime, workspace_root: str
) -> None:
    pid = start(rt, "s1", "echo up; sleep 30 & sleep 30; wait")
    wait_output(rt, "s1", pid, "up")
    [cwd] = session_dirs(workspace_root)
    other = start(rt, "s2", "sleep 30")
    deadline = time.monotonic() + WAIT
    while descendant_names().count("sleep") < 3 and time.monotonic() < deadline:
        time.sleep(0.02)  # both of s1's sleeps and s2's have started
    assert rt.end_session("s1") == 1
    assert not os.path.exists(cwd)  # end_session waits for the cleanup
    assert descendant_names().count("sleep") == 1  # only s2's is left
    assert call(rt, "s2", "poll_process", processId=other)["status"] == "running"
    # A new incarnation of s1 works in a new directory.
    assert wait_done(rt, "s1", start(rt, "s1", "touch again"))["status"] == "exited"
    again = [d for d in session_dirs(workspace_root) if os.listdir(d) == ["again"]]
    assert len(again) == 1 and again[0] != cwd


def test_close_with_running_and_chatty_processes_leaves_nothing(leaks: Leaks) -> None:
    rt = Runtime(servers=[Workspace])
    for i in range(5):
        start(rt, f"s{i}", "yes chatty")
        start(rt, f"s{i}", "sleep 30 & exec sleep 30")
    rt.close()
    leaks.assert_none()


def test_limits_and_bad_input(leaks: Leaks) -> None:
    with workspace_runtime(leaks, max_running=2, max_timeout=1.0) as rt:
        _limits_and_bad_input(rt)


def _limits_and_bad_input(rt: Runtime) -> None:
    first = start(rt, "s1", "sleep 30", timeout=999)  # clamped to 1 s
    start(rt, "s1", "sleep 30")
    refused = rt.call("execute_command", ctx_args("s1", command="true"))
    assert refused.is_error and "limit is 2" in refused.text
    assert wait_done(rt, "s1", first)["status"] == "timeout"
    start(rt, "s1", "true")  # a slot is free again
    with pytest.raises(InvalidArgumentsError, match="timeout"):
        rt.call("execute_command", ctx_args("s1", command="true", timeout=-1))
    with pytest.raises(InvalidArgumentsError, match="command"):
        rt.call("execute_command", ctx_args("s1", command=""))
