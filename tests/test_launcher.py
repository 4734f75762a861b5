"""Sandboxes start on one long-lived thread, so a command outlives the thread that asked.

bubblewrap's ``--die-with-parent`` fires when the *thread* that forked it exits; tool calls
run on pool threads that retire, or on a caller's thread. The first test shows the trap is
real here; the second that the launcher avoids it.
"""

from __future__ import annotations

import shutil
import signal
import threading
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest

from ctxactors import sandbox as sandboxes
from ctxactors._launcher import launch
from ctxactors.settings import SandboxSettings

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

COMMAND = "echo started; sleep 0.5; echo lived"


def _start_on_a_thread_that_ends(workdir: Path, *, via_launcher: bool) -> Popen[bytes]:
    settings = SandboxSettings(bwrap=shutil.which("bwrap") or "bwrap")
    started: list[Any] = []

    def ask() -> None:
        if via_launcher:
            popen = launch(lambda: sandboxes.start(settings, str(workdir), COMMAND))
        else:
            popen = sandboxes.start(settings, str(workdir), COMMAND)
        # The command's first line: bubblewrap has armed its parent-death signal by then
        # (before it ran the command), so this thread's end can't slip in ahead of it.
        assert popen.stdout is not None and popen.stdout.readline() == b"started\n"
        started.append(popen)

    thread = threading.Thread(target=ask)
    thread.start()
    thread.join()  # the asking thread is gone before the command is done
    popen: Popen[bytes] = started[0]
    return popen


def test_a_command_started_on_a_thread_dies_with_that_thread(tmp_path: Path) -> None:
    popen = _start_on_a_thread_that_ends(tmp_path, via_launcher=False)
    popen.communicate(timeout=60)
    assert popen.returncode == -signal.SIGKILL  # bwrap got the parent-death signal


def test_a_command_started_by_the_launcher_outlives_the_thread_that_asked(
    tmp_path: Path,
) -> None:
    popen = _start_on_a_thread_that_ends(tmp_path, via_launcher=True)
    output, _ = popen.communicate(timeout=60)
    assert (popen.returncode, output) == (0, b"lived\n")  # "started" was read above
