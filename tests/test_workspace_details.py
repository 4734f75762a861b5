"""Workspace details pinned to exact values with real bubblewrap sandboxes: what
list_processes and kill_process report, and what the sandbox holds besides /workspace."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from conftest import ctx_args
from structlog.testing import capture_logs
from workspace_support import (
    Leaks,
    call,
    closed_runtime,
    descendant_names,
    session_dirs,
    start,
    temporary_root,
    wait_done,
)

from ctxactors import Runtime
from ctxactors.servers.workspace import Workspace, _Process


@pytest.fixture(autouse=True)
def workspace_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from temporary_root(monkeypatch)


@pytest.fixture
def leaks() -> Leaks:
    return Leaks()


@pytest.fixture
def rt(leaks: Leaks) -> Iterator[Runtime]:
    yield from closed_runtime(leaks)


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
    monkeypatch.setattr(Workspace, "sandbox", dataclasses.replace(Workspace.sandbox, mode="none"))
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
