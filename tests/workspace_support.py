"""Helpers for the workspace tests (real processes, real bubblewrap), and their fixtures.

Every runtime `closed_runtime` makes is closed, and afterwards no child process (zombie or
not) and no thread may be left over. ``conftest.py`` loads this module as a plugin, so its
fixtures (`workspace_root`, `leaks`, `rt`) are there for every test module; none is autouse:
a module whose every test needs its own root says so with
``pytestmark = pytest.mark.usefixtures("workspace_root")``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import psutil
import pytest

from ctxactors import Runtime
from ctxactors._launcher import launch
from ctxactors.servers.workspace import Workspace
from ctxactors.settings import SandboxSettings, Settings, variables
from ctxactors.testing import context_args as ctx_args
from ctxactors.testing import wait_until

WAIT = 20.0  # generous: the machine is shared and loaded


def temporary_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """For an autouse fixture: the workspace root of one test, removed after it."""
    # Not under tmp_path: pytest makes its parents 0700, and a root server's sandbox runs
    # as the principals' uids, which must be able to enter the root's parents.
    root = tempfile.mkdtemp(prefix="ctxactors-test-ws-")
    monkeypatch.setenv("CTXACTORS_WORKSPACE_ROOT", root)  # read by each runtime made
    yield root
    unmount_under(root)
    shutil.rmtree(root, ignore_errors=True)


def unmount_under(root: str) -> None:
    """Unmount what is still mounted under `root` (a principal's disk image left by a
    server killed in the test, which its next start would have reused): else the mount
    and its loop device outlive the removed root until the machine restarts."""
    prefix = os.path.realpath(root) + os.sep
    with open("/proc/self/mountinfo") as mounts:
        points = [line.split()[4] for line in mounts]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


@pytest.fixture
def workspace_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A workspace root of this test's own, in ``CTXACTORS_WORKSPACE_ROOT``."""
    yield from temporary_root(monkeypatch)


@pytest.fixture
def leaks() -> Leaks:
    return Leaks()


@pytest.fixture
def rt(leaks: Leaks, workspace_root: str) -> Iterator[Runtime]:
    """A workspace runtime on the test's own root, closed after it, leaving nothing."""
    yield from closed_runtime(leaks)


def session_dirs(root: str) -> list[str]:
    """The sessions' working directories on the host (the probe's are gone already)."""
    return sorted(os.path.join(root, d) for d in os.listdir(root) if d.startswith("ws-"))


class Leaks:
    """Threads and child processes of this test process, before and after."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        # The launcher's thread lives as long as the process (see ctxactors._launcher): up
        # before the count, not a leak of the first test that starts a sandbox.
        launch(lambda: None)
        self.threads = threading.active_count()
        self.children = {p.pid for p in self.me.children(recursive=True)}

    def assert_none(self) -> None:
        wait_until(
            lambda: not self._extra_children() and threading.active_count() <= self.threads,
            WAIT,
            describe=lambda: (self._extra_children(), [t.name for t in threading.enumerate()]),
        )
        assert self._extra_children() == []
        assert threading.active_count() <= self.threads, [t.name for t in threading.enumerate()]

    def _extra_children(self) -> list[tuple[int, str]]:
        out = []
        for p in self.me.children(recursive=True):
            if p.pid in self.children:
                continue
            try:
                out.append((p.pid, p.status()))  # a zombie counts as a leak too
            except psutil.NoSuchProcess:
                pass
        return out


def descendant_names() -> list[str]:
    names = []
    for p in psutil.Process().children(recursive=True):
        try:
            names.append(p.name())
        except psutil.NoSuchProcess:
            pass
    return names


def closed_runtime(leaks: Leaks, settings: Settings | None = None) -> Iterator[Runtime]:
    """For the `rt` fixture: a workspace runtime, closed after the test, leaving nothing."""
    runtime = Runtime(servers=[Workspace], settings=settings)
    try:
        yield runtime
    finally:
        runtime.close()
        leaks.assert_none()


@contextlib.contextmanager
def workspace_runtime(leaks: Leaks, **changes: Any) -> Iterator[Runtime]:
    """`closed_runtime` with these workspace settings changed (the rest from the environment)."""
    settings = Settings.from_env()
    workspace = msgspec.structs.replace(settings.workspace, **changes)
    yield from closed_runtime(leaks, msgspec.structs.replace(settings, workspace=workspace))


@contextlib.contextmanager
def grouped_runtime(leaks: Leaks, **groups: dict[str, Any]) -> Iterator[Runtime]:
    """`closed_runtime` with fields of the workspace's groups changed (the rest from the
    environment): ``grouped_runtime(leaks, budget={"cgroups": "off"}, sandbox={...})``."""
    settings = Settings.from_env()
    workspace = settings.workspace
    for group, changes in groups.items():
        changed = msgspec.structs.replace(getattr(workspace, group), **changes)
        workspace = msgspec.structs.replace(workspace, **{group: changed})
    yield from closed_runtime(leaks, msgspec.structs.replace(settings, workspace=workspace))


def use_sandbox(monkeypatch: pytest.MonkeyPatch, **changes: Any) -> None:
    """Change the sandbox settings of the runtimes this test makes, through the variables
    a runtime reads when it is made (`Settings.from_env`)."""
    names = variables(SandboxSettings)
    for field, value in changes.items():
        text = ",".join(value) if isinstance(value, tuple) else str(value)
        monkeypatch.setenv(names[field], text)


def call(rt: Runtime, session: str, tool: str, *, principal: str | None = None, **args: Any) -> Any:
    result = rt.call(tool, ctx_args(session, **args), principal=principal)
    assert not result.is_error, result.text
    return result.structured


def start(
    rt: Runtime, session: str, command: str, *, principal: str | None = None, **args: Any
) -> str:
    started = call(rt, session, "execute_command", command=command, principal=principal, **args)
    assert started["status"] == "running" and started["processId"].startswith("p_")
    return str(started["processId"])


def wait_done(
    rt: Runtime,
    session: str,
    process_id: str,
    wait: float = WAIT,
    *,
    principal: str | None = None,
) -> dict[str, Any]:
    """Poll until the process has ended, or `wait` seconds (then it is still running)."""
    deadline = time.monotonic() + wait
    while True:
        polled = call(rt, session, "poll_process", processId=process_id, principal=principal)
        if polled["status"] != "running" or time.monotonic() > deadline:
            return dict(polled)
        time.sleep(0.02)


def wait_output(
    rt: Runtime, session: str, process_id: str, text: str, *, principal: str | None = None
) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while True:
        polled = call(rt, session, "poll_process", processId=process_id, principal=principal)
        if text in polled["output"] or time.monotonic() > deadline:
            return dict(polled)
        time.sleep(0.02)


def serve_refusal(env: dict[str, str], *extra: str) -> str:
    """`ctxactors serve --transport stdio` with `env` must refuse to start: its last line."""
    proc = subprocess.run(
        [sys.executable, "-m", "ctxactors", "serve", "--transport", "stdio", *extra],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    return proc.stderr.splitlines()[-1]
