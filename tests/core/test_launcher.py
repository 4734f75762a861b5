"""Sandboxes start on one long-lived thread, so a command outlives the thread that asked.

bubblewrap's ``--die-with-parent`` fires when the *thread* that forked it exits; tool calls
run on pool threads that retire, or on a caller's thread. The first tests show the trap is
real here, for the server's own sandbox and for a principal's (joined to its cgroups by a
shell, switched to its uid by setpriv, capped by prlimit: each execs the next, so bwrap is
still the asking thread's child); the others that the launcher avoids it.

The asking thread ends only once the command has said it started, as a pool thread retires
long after: bwrap sets its parent-death signal as it starts, so a thread that ended sooner
would leave bwrap reparented to a thread that lives, and no trap to show.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from subprocess import Popen
from typing import Any

import pytest
from workspace_support import Leaks, grouped_runtime

from ctxactors import sandbox as sandboxes
from ctxactors._launcher import launch
from ctxactors.servers.workspace import Workspace
from ctxactors.settings import SandboxSettings

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

COMMAND = "echo started; sleep 0.5; echo lived"


def _start_on_a_thread_that_ends(
    settings: SandboxSettings, workdir: str, tenant: sandboxes.Tenant, *, via_launcher: bool
) -> Popen[bytes]:
    started: list[Any] = []

    def ask() -> None:
        def begin() -> Popen[bytes]:
            return sandboxes.start(settings, workdir, COMMAND, tenant)

        popen = launch(begin) if via_launcher else begin()
        assert popen.stdout is not None
        assert popen.stdout.readline() == b"started\n"  # bwrap is set up, the command runs
        started.append(popen)

    thread = threading.Thread(target=ask)
    thread.start()
    thread.join()  # the asking thread is gone before the command is done
    popen: Popen[bytes] = started[0]
    return popen


@pytest.fixture
def principals(leaks: Leaks, workspace_root: str) -> Iterator[tuple[SandboxSettings, str, Any]]:
    """The sandbox settings, a directory of principal alice's and her place in the runtime's
    budgets (her cgroups where the server may make them, her uid on a root server)."""
    with grouped_runtime(leaks) as rt:
        tenants = Workspace.tenants(rt)
        assert tenants is not None
        settings = rt.settings.workspace.sandbox
        ids = tenants.ids("alice")
        workdir = tempfile.mkdtemp(prefix="launcher-", dir=workspace_root)
        sandboxes.prepare_directory(settings, workdir, ids)
        tenant, lease, _ = tenants.enter("alice", ids)
        try:
            yield settings, workdir, tenant
        finally:
            lease.release()


def test_a_command_started_on_a_thread_dies_with_that_thread(tmp_path: os.PathLike[str]) -> None:
    settings = SandboxSettings(bwrap=shutil.which("bwrap") or "bwrap")
    popen = _start_on_a_thread_that_ends(
        settings, str(tmp_path), sandboxes.Tenant(), via_launcher=False
    )
    popen.communicate(timeout=60)
    assert popen.returncode == -signal.SIGKILL  # bwrap got the parent-death signal


def test_a_command_started_by_the_launcher_outlives_the_thread_that_asked(
    tmp_path: os.PathLike[str],
) -> None:
    settings = SandboxSettings(bwrap=shutil.which("bwrap") or "bwrap")
    popen = _start_on_a_thread_that_ends(
        settings, str(tmp_path), sandboxes.Tenant(), via_launcher=True
    )
    output, _ = popen.communicate(timeout=60)
    assert (popen.returncode, output) == (0, b"lived\n")


def test_a_principals_command_started_on_a_thread_dies_with_that_thread(
    principals: tuple[SandboxSettings, str, sandboxes.Tenant],
) -> None:
    popen = _start_on_a_thread_that_ends(*principals, via_launcher=False)
    popen.communicate(timeout=60)
    assert popen.returncode == -signal.SIGKILL


def test_a_principals_command_started_by_the_launcher_outlives_the_thread_that_asked(
    principals: tuple[SandboxSettings, str, sandboxes.Tenant],
) -> None:
    popen = _start_on_a_thread_that_ends(*principals, via_launcher=True)
    output, _ = popen.communicate(timeout=60)
    assert (popen.returncode, output) == (0, b"lived\n")
