"""A process is found by its exact processId only: a prefix of a real id is "not found"."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from ctxactors import Runtime
from ctxactors.servers.workspace import Workspace
from ctxactors.testing import context_args as ctx_args


@pytest.fixture
def rt(workspace_root: str) -> Iterator[Runtime]:
    with Runtime(servers=[Workspace]) as runtime:
        yield runtime


def test_a_prefix_of_a_process_id_finds_nothing(rt: Runtime) -> None:
    started = rt.call("execute_command", ctx_args("s1", command="exec sleep 30")).structured
    assert started is not None and started["status"] == "running"
    process_id = started["processId"]

    for guess in (process_id[:-1], process_id[:3], process_id + "0", process_id.upper()):
        for tool in ("poll_process", "kill_process"):
            result = rt.call(tool, ctx_args("s1", processId=guess))
            assert result.is_error, (tool, guess)
            assert result.text == f"process {guess!r} not found in this session"

    # Nothing was killed by the guesses; the exact id still reaches the process.
    polled = rt.call("poll_process", ctx_args("s1", processId=process_id)).structured
    assert polled is not None and polled["status"] == "running"
    killed = rt.call("kill_process", ctx_args("s1", processId=process_id)).structured
    assert killed is not None and killed["processId"] == process_id
    assert killed["status"] == "killed"


def test_a_kill_is_logged_with_the_process_and_its_status(rt: Runtime) -> None:
    with capture_logs() as logs:
        started = rt.call("execute_command", ctx_args("k", command="exec sleep 30")).structured
        assert started is not None
        rt.call("kill_process", ctx_args("k", processId=started["processId"]))
    killed = [e for e in logs if e["event"] == "process_killed"]
    assert killed == [
        {
            "logger": "ctxactors.workspace",
            "event": "process_killed",
            "log_level": "info",
            "session_id": "k",
            "process_id": started["processId"],
            "status": "killed",
        }
    ]
