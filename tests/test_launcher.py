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

COMMAND = "sleep 0.5; echo lived"


def _start_on_a_thread_that_ends(workdir: Path, *, via_launcher: bool) -> Popen[bytes]:
    settings = SandboxSettings(bwrap=shutil.which("bwrap") or "bwrap")
    started: list[Any] = []

    def ask() -> None:
        if via_launcher:
            started.append(launch(lambda: sandboxes.start(settings, str(workdir), COMMAND)))
        else:
            started.append(sandboxes.start(settings, str(workdir), COMMAND))

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
    assert (popen.returncode, output) == (0, b"lived\n")
