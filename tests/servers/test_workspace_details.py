"""Workspace details pinned to exact values with real bubblewrap sandboxes: what
list_processes and kill_process report, and what the sandbox holds besides /workspace."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading

import pytest
from structlog.testing import capture_logs
from workspace_support import (
    Leaks,
    call,
    descendant_names,
    session_dirs,
    start,
    use_sandbox,
    wait_done,
)

from ctxactors import Runtime
from ctxactors.sandbox import SandboxUnavailableError
from ctxactors.servers import workspace
from ctxactors.servers.workspace import Workspace, _Process
from ctxactors.testing import ManualClock
from ctxactors.testing import context_args as ctx_args

pytestmark = pytest.mark.usefixtures("workspace_root")  # each test on a root of its own


def test_list_processes_reports_each_with_its_status_and_exit_code(rt: Runtime) -> None:
    first = start(rt, "s1", "exit 3")
    assert wait_done(rt, "s1", first)["exitCode"] == 3
    second = start(rt, "s1", "echo hi")
    assert wait_done(rt, "s1", second) == {
        "processId": second,
        "status": "exited",
        "exitCode": 0,
        "output": "hi\n",
    }
    assert call(rt, "s1", "list_processes") == {
        "processes": [
            {"processId": first, "command": "exit 3", "status": "exited", "exitCode": 3},
            {"processId": second, "command": "echo hi", "status": "exited", "exitCode": 0},
        ],
        "count": 2,
    }
    assert call(rt, "s2", "list_processes") == {"processes": [], "count": 0}


def test_the_sandbox_holds_its_generated_identity_files(rt: Runtime) -> None:
    pid = start(
        rt, "s1", "hostname; cat /etc/group; test -e /etc/localtime && echo tz; id -un; pwd"
    )
    polled = wait_done(rt, "s1", pid)
    lines = polled["output"].splitlines()
    assert lines[0] == "workspace"
    assert lines[1].startswith("sandbox:x:") and lines[1].endswith(":")
    assert lines[2:] == ["tz", "sandbox", "/workspace"]
    assert polled["exitCode"] == 0


def test_a_rolled_back_batch_kills_its_command_and_forgets_it(rt: Runtime) -> None:
    ops = [
        {"id": "run", "tool": "execute_command", "arguments": {"command": "exec sleep 30"}},
        {"id": "bad", "tool": "poll_process", "arguments": {"processId": "p_none"}},
    ]
    result = rt.call(
        "batch", ctx_args("s1", operations=ops, options={"transactional": True})
    ).structured
    assert result is not None
    assert [(r["id"], r["status"]) for r in result["results"]] == [
        ("run", "rolled_back"),
        ("bad", "failed"),
    ]
    assert call(rt, "s1", "list_processes") == {"processes": [], "count": 0}
    assert "sleep" not in descendant_names()


def test_the_none_mode_says_what_it_gives_away(
    monkeypatch: pytest.MonkeyPatch, leaks: Leaks
) -> None:
    use_sandbox(monkeypatch, mode="none")
    warning = (
        "CTXACTORS_WORKSPACE_SANDBOX=none: commands run unsandboxed, as the server's user, "
        "with its files, processes and network"
    )
    with capture_logs() as logs, Runtime(servers=[Workspace]) as rt:
        pid = start(rt, "s1", "true")
        wait_done(rt, "s1", pid)
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [(e["event"], e["warning"], e.get("process_id")) for e in warnings] == [
        ("workspace_unsandboxed", warning, None),
        ("command_unsandboxed", warning, pid),
    ]
    leaks.assert_none()


def test_closing_waits_for_each_watcher_and_reports_none_stuck(leaks: Leaks) -> None:
    with capture_logs() as logs, Runtime(servers=[Workspace]) as rt:
        start(rt, "s1", "exec sleep 30")
        start(rt, "s1", "echo out; exec sleep 30")
    created = [e["directory"] for e in logs if e["event"] == "workspace_created"]
    removed = [e for e in logs if e["event"] == "workspace_removed"]
    assert [(e["directory"], e["processes"], e["stuck"]) for e in removed] == [(created[0], 2, [])]
    assert not os.path.exists(created[0])
    leaks.assert_none()


def test_a_directory_removed_behind_the_servers_back_still_closes_cleanly(
    workspace_root: str, leaks: Leaks
) -> None:
    with capture_logs() as logs, Runtime(servers=[Workspace]) as rt:
        wait_done(rt, "s1", start(rt, "s1", "true"))
        (directory,) = session_dirs(workspace_root)
        shutil.rmtree(directory)
        assert rt.end_session("s1") == 1
    removed = [(e["directory"], e["processes"]) for e in logs if e["event"] == "workspace_removed"]
    assert removed == [(directory, 1)]
    leaks.assert_none()


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        # Under the cap: as it came, invalid UTF-8 replaced, never an error.
        ([b"ok\xff", b"!"], "ok\ufffd!"),
        ([b"12345678"], "12345678"),  # exactly the cap: nothing dropped
        # Over it: the newest 8 bytes, not starting inside a character.
        (
            [b"x\xe2\x82\xac", b"\xe2\x82\xac\xe2\x82\xac"],
            "[... 4 bytes of earlier output dropped ...]\n€€",
        ),
        ([b"a", b"\xe2\x82\xac" * 2 + b"zz"], "[... 1 bytes of earlier output dropped ...]\n€€zz"),
        ([b"123456789"], "[... 1 bytes of earlier output dropped ...]\n23456789"),
        ([b"ab\xc3\x80" + b"1234567"], "[... 4 bytes of earlier output dropped ...]\n1234567"),
        ([b"ab\xc2\xbf" + b"1234567"], "[... 4 bytes of earlier output dropped ...]\n1234567"),
        # At most 3 bytes are skipped, even of bytes that are not UTF-8.
        ([b"1\x80\x80\x80\x80abcd"], "[... 4 bytes of earlier output dropped ...]\n\ufffdabcd"),
        ([b"12\xc0abcdefg"], "[... 2 bytes of earlier output dropped ...]\n\ufffdabcdefg"),
    ],
)
def test_output_keeps_the_newest_bytes_from_a_character_boundary(
    chunks: list[bytes], expected: str
) -> None:
    with subprocess.Popen(["true"], stdout=subprocess.PIPE) as child:
        proc = _Process("p_x", "true", child, 60.0, 8, lambda: None)
        for chunk in chunks:
            proc._append(chunk)
        assert proc.output() == expected


def test_a_started_process_is_logged_and_watched_by_a_named_daemon_thread(
    leaks: Leaks,
) -> None:
    with capture_logs() as logs, Runtime(servers=[Workspace]) as rt:
        pid = start(rt, "s1", "exec sleep 30", timeout=45)
        assert re.fullmatch(r"p_[A-Za-z0-9_-]{16}", pid)
        watchers = [t for t in threading.enumerate() if t.name.startswith("ctxactors-workspace-")]
        assert [(t.name, t.daemon) for t in watchers] == [(f"ctxactors-workspace-{pid[:10]}", True)]
        started = [e for e in logs if e["event"] == "process_started"]
        assert [(e["process_id"], e["timeout_s"]) for e in started] == [(pid, 45.0)]
        assert isinstance(started[0]["pid"], int) and started[0]["pid"] > 1
    leaks.assert_none()


def test_only_the_newest_finished_records_are_kept(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workspace, "_KEPT_RECORDS", 3)
    pids = []
    for n in range(4):
        pids.append(start(rt, "s1", f"exit {n}"))
        wait_done(rt, "s1", pids[-1])
    listed = call(rt, "s1", "list_processes")["processes"]
    assert [(p["processId"], p["exitCode"]) for p in listed] == [
        (pids[1], 1),
        (pids[2], 2),
        (pids[3], 3),
    ]


def test_the_probe_leaves_nothing_in_the_workspace_root(workspace_root: str) -> None:
    with Runtime(servers=[Workspace]):
        assert os.listdir(workspace_root) == []


def test_a_bwrap_that_cannot_be_executed_is_refused_with_the_systems_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    where = tempfile.mkdtemp(prefix="ctxactors-test-bwrap-")
    try:
        os.chmod(where, 0o755)  # the sandbox users (under root) must reach it
        fake = os.path.join(where, "bwrap")
        with open(fake, "wb") as garbage:
            garbage.write(b"\x00\x01 not a program")
        os.chmod(fake, 0o755)
        use_sandbox(monkeypatch, bwrap=fake)
        with pytest.raises(SandboxUnavailableError) as refused:
            Runtime(servers=[Workspace])
        assert str(refused.value).startswith(
            f"bubblewrap ({fake}) could not start a sandbox: [Errno 8] Exec format error: "
        )
    finally:
        shutil.rmtree(where)


def test_unsandboxed_a_command_runs_in_its_directory_with_a_clean_environment(
    monkeypatch: pytest.MonkeyPatch, workspace_root: str, leaks: Leaks
) -> None:
    use_sandbox(monkeypatch, mode="none")
    monkeypatch.setenv("CTXACTORS_TEST_SECRET", "server-only")
    command = (
        'pwd; echo "$HOME|$PATH|${CTXACTORS_TEST_SECRET:-unset}"; echo err 1>&2; '
        "if read -r line; then echo read; else echo eof; fi; "
        '[ "$(ps -o sid= -p $$ | tr -d " ")" = "$$" ] && echo leader'
    )
    with Runtime(servers=[Workspace]) as rt:
        done = wait_done(rt, "s1", start(rt, "s1", command))
        (directory,) = session_dirs(workspace_root)
    assert done["output"] == (
        f"{directory}\n{directory}|/usr/local/bin:/usr/bin:/bin|unset\nerr\neof\nleader\n"
    )
    leaks.assert_none()


def test_a_workspace_root_the_sandbox_user_cannot_reach_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    private = tempfile.mkdtemp(prefix="ctxactors-test-private-")  # mode 0700
    try:
        root = os.path.join(private, "workspaces")
        monkeypatch.setenv("CTXACTORS_WORKSPACE_ROOT", root)
        with pytest.raises(SandboxUnavailableError) as refused:
            Runtime(servers=[Workspace])
        assert (
            "CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST) must be able to enter every parent "
            f"directory of the workspace root {root}. Otherwise install" in str(refused.value)
        )
        assert os.listdir(root) == []
    finally:
        shutil.rmtree(private)


def test_output_written_after_a_quiet_second_is_kept(rt: Runtime) -> None:
    done = wait_done(rt, "s1", start(rt, "s1", "echo early; sleep 1.2; echo late"))
    assert (done["status"], done["output"]) == ("exited", "early\nlate\n")


def test_a_command_that_closes_its_output_still_times_out(
    monkeypatch: pytest.MonkeyPatch, leaks: Leaks
) -> None:
    # Unsandboxed, the shell is the server's child: closing its output ends the drain, and
    # the timeout must then come from the reaper.
    use_sandbox(monkeypatch, mode="none")
    with Runtime(servers=[Workspace]) as rt:
        pid = start(rt, "s1", "echo bye; exec >&- 2>&-; exec sleep 30", timeout=0.5)
        done = wait_done(rt, "s1", pid)
    assert (done["status"], done["exitCode"], done["output"]) == ("timeout", -9, "bye\n")
    leaks.assert_none()


def test_the_server_stays_busy_while_any_of_its_processes_runs(
    leaks: Leaks, clock: ManualClock
) -> None:
    with Runtime(servers=[Workspace], ttl=10, clock=clock) as rt:
        running = start(rt, "s1", "exec sleep 30")
        wait_done(rt, "s1", start(rt, "s1", "true"))
        clock.advance(100)
        assert rt.reap() == 0
        assert call(rt, "s1", "poll_process", processId=running)["status"] == "running"
        call(rt, "s1", "kill_process", processId=running)
        clock.advance(100)
        assert rt.reap() == 1
    leaks.assert_none()
