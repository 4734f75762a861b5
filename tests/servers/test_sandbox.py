"""The workspace sandbox, attacked from inside with real bubblewrap and real processes.

Each test runs what a hostile model would run and checks what it reached; the unsandboxed
``none`` mode is run beside some of them to show the same command reaches it there.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from mcp_support import pids_of
from structlog.testing import capture_logs
from workspace_support import (
    WAIT,
    Leaks,
    call,
    serve_refusal,
    start,
    use_sandbox,
    wait_done,
    wait_output,
)

from ctxactors import Runtime
from ctxactors.sandbox import SandboxSettings, SandboxUnavailableError
from ctxactors.servers.workspace import Workspace
from ctxactors.settings import FIRST_UID
from ctxactors.testing import wait_until

pytestmark = pytest.mark.usefixtures("workspace_root")  # each test on a root of its own


def configure(monkeypatch: pytest.MonkeyPatch, **changes: Any) -> None:
    """Change the sandbox settings for one test (before its runtime is made)."""
    use_sandbox(monkeypatch, **changes)


def run(rt: Runtime, session: str, command: str, wait: float = WAIT, **args: Any) -> dict[str, Any]:
    return wait_done(rt, session, start(rt, session, command, **args), wait)


# `find /` walks everything the sandbox sees, the host's whole /usr included: 3 s alone
# here, past 20 s on a loaded machine. The test waits for the command to end; the bound
# (and pytest's own timeout above it) only stops a command that hangs.
@pytest.mark.timeout(300)
def test_a_session_reaches_no_other_sessions_files_nor_the_host(
    rt: Runtime, workspace_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANG", "C.UTF-8")  # the quotes in cat's message
    secret = "alice-secret-" + os.urandom(8).hex()
    assert run(rt, "alice", f"echo {secret} > secret.txt; cat secret.txt")["output"] == (
        secret + "\n"
    )
    probe = (
        "cat ../*/secret.txt; echo find:; find / -name secret.txt 2>/dev/null; echo host:; "
        f"ls -d {workspace_root} /root /home /work {os.getcwd()} 2>/dev/null; echo writable:; "
        "for d in / /usr /etc /bin /dev /proc; do touch $d/x 2>/dev/null && echo $d; done; "
        "echo end"
    )
    bob = run(rt, "bob", probe, wait=240)
    assert bob["status"] == "exited", bob
    assert bob["output"] == (
        "cat: '../*/secret.txt': No such file or directory\nfind:\nhost:\nwritable:\nend\n"
    )


def test_unsandboxed_the_same_command_reads_the_other_sessions_file(
    monkeypatch: pytest.MonkeyPatch, leaks: Leaks
) -> None:
    """What the test above guards against: without the sandbox, bob reads alice's file."""
    configure(monkeypatch, mode="none")
    with Runtime(servers=[Workspace]) as rt:
        run(rt, "alice", "echo alice-secret > secret.txt")
        assert run(rt, "bob", "cat ../*/secret.txt")["output"] == "alice-secret\n"
    leaks.assert_none()


def test_the_environment_is_clean_but_for_names_the_operator_lists(
    monkeypatch: pytest.MonkeyPatch, leaks: Leaks
) -> None:
    monkeypatch.setenv("CTXACTORS_MODEL_API_KEY", "sk-server-secret")
    monkeypatch.setenv("PROJECT_TOKEN", "tok-for-commands")
    monkeypatch.setenv("LANG", "C.UTF-8")
    configure(monkeypatch, env=("PROJECT_TOKEN", "NOT_SET_ANYWHERE", "HOME"))
    with Runtime(servers=[Workspace]) as rt:
        assert run(rt, "s1", 'echo "[$CTXACTORS_MODEL_API_KEY]"')["output"] == "[]\n"
        assert run(rt, "s1", "env | sort")["output"] == (
            "HOME=/workspace\nLANG=C.UTF-8\nPATH=/usr/local/bin:/usr/bin:/bin\n"
            "PROJECT_TOKEN=tok-for-commands\nPWD=/workspace\n"
        )
    leaks.assert_none()


def sleepers(marker: str) -> list[int]:
    return pids_of(["sleep", marker])


# Five children in the background, one of them re-parented into its own session (setsid -f)
# the way a daemon escapes its process group.
BACKGROUND = "for i in 1 2 3 4; do sleep {m} & done; setsid -f sleep {m}; echo started; wait"


@pytest.mark.parametrize("ending", ["end_session", "kill_process", "timeout", "close"])
def test_every_backgrounded_child_ends_with_its_sandbox(ending: str, leaks: Leaks) -> None:
    marker = f"1000.{os.getpid()}{len(ending)}"
    rt = Runtime(servers=[Workspace])
    try:
        timeout = {"timeout": 2.0} if ending == "timeout" else {}
        pid = start(rt, "s1", BACKGROUND.format(m=marker), **timeout)
        assert "started" in wait_output(rt, "s1", pid, "started")["output"]
        assert wait_until(lambda: len(sleepers(marker)) == 5, WAIT), sleepers(marker)
        if ending == "end_session":
            assert rt.end_session("s1") == 1
        elif ending == "kill_process":
            assert call(rt, "s1", "kill_process", processId=pid)["status"] == "killed"
        elif ending == "timeout":
            assert wait_done(rt, "s1", pid)["status"] == "timeout"
        else:
            rt.close()
        assert wait_until(lambda: sleepers(marker) == [], WAIT)
        assert sleepers(marker) == []
    finally:
        rt.close()
    leaks.assert_none()


@pytest.fixture
def listener() -> Iterator[int]:
    """A real listening TCP socket on loopback in the test process; yields its port."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def connect_command(port: int) -> str:
    return (
        'exec python3 -c "import errno, socket\n'
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=10); print('connected')\n"
        "except OSError as e:\n"
        '    print(errno.errorcode[e.errno])"'
    )


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, "ECONNREFUSED\n"),  # the sandbox's own, empty, loopback
        ({"network": True}, "connected\n"),
        ({"mode": "none"}, "connected\n"),
    ],
    ids=["default-off", "network-on", "unsandboxed"],
)
def test_network_is_off_unless_the_operator_turns_it_on(
    changes: dict[str, Any],
    expected: str,
    listener: int,
    monkeypatch: pytest.MonkeyPatch,
    leaks: Leaks,
) -> None:
    configure(monkeypatch, **changes)
    with Runtime(servers=[Workspace]) as rt:
        assert run(rt, "s1", connect_command(listener))["output"] == expected
    leaks.assert_none()


SPAWN_300 = """exec python3 -c "
import errno, os, time
for n in range(300):
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError as e:
        print('forked', n, errno.errorcode[e.errno])
        break
else:
    print('forked 300')
" """


def test_the_process_limit_counts_each_sandbox_on_its_own(
    monkeypatch: pytest.MonkeyPatch, leaks: Leaks
) -> None:
    configure(monkeypatch, processes=64)
    with Runtime(servers=[Workspace]) as rt:
        # Two sandboxes at once, each to its own 64 (less bwrap's init and python itself).
        first, second = start(rt, "s1", SPAWN_300), start(rt, "s2", SPAWN_300)
        assert wait_done(rt, "s1", first)["output"] == "forked 62 EAGAIN\n"
        assert wait_done(rt, "s2", second)["output"] == "forked 62 EAGAIN\n"
    leaks.assert_none()


def test_a_fork_bomb_ends_that_command_only(monkeypatch: pytest.MonkeyPatch, leaks: Leaks) -> None:
    configure(monkeypatch, processes=64)
    with Runtime(servers=[Workspace]) as rt:
        other = start(rt, "s2", "echo calm; sleep 30")
        bomb = start(rt, "s1", "bomb() { bomb | bomb & }; bomb; exec sleep 30", timeout=3)
        done = wait_done(rt, "s1", bomb)
        # Contained either way: the timeout kills the sandbox, or the shell itself finds no
        # process left under the limit and exits with sh's "can't fork" status.
        assert (done["status"], done["exitCode"]) in {("timeout", -9), ("exited", 2)}
        # The server still serves, that session and the others.
        assert run(rt, "s1", "echo alive")["output"] == "alive\n"
        assert call(rt, "s2", "poll_process", processId=other)["status"] == "running"
    leaks.assert_none()


MEMORY_BOMB = """exec python3 -c "
chunks = []
try:
    while len(chunks) < 2048:
        chunks.append(bytearray(1 << 20))
    print('survived 2 GiB')
except MemoryError:
    print('MemoryError at', len(chunks) // 64 * 64, 'MiB')
" """


def test_a_memory_bomb_ends_at_the_address_space_limit(
    monkeypatch: pytest.MonkeyPatch, leaks: Leaks
) -> None:
    configure(monkeypatch, memory_bytes=256 << 20)
    with Runtime(servers=[Workspace]) as rt:
        done = run(rt, "s1", MEMORY_BOMB)
        assert (done["status"], done["output"]) == ("exited", "MemoryError at 192 MiB\n")
        assert run(rt, "s1", "echo alive")["output"] == "alive\n"
    leaks.assert_none()


def test_sandboxed_processes_are_the_oom_killers_first_choice(rt: Runtime) -> None:
    # Memory summed over many processes has no limit; if it runs out, the server survives.
    output = run(rt, "s1", "cat /proc/self/oom_score_adj; sleep 1 & cat /proc/$!/oom_score_adj")
    assert output["output"] == "1000\n1000\n"
    with open("/proc/self/oom_score_adj") as server:
        assert int(server.read()) < 1000


def test_cpu_and_file_size_limits(monkeypatch: pytest.MonkeyPatch, leaks: Leaks) -> None:
    configure(monkeypatch, cpu_seconds=1, file_bytes=1 << 20)
    with Runtime(servers=[Workspace]) as rt:
        spin = run(rt, "s1", 'exec python3 -c "while True: pass"')
        assert (spin["status"], spin["exitCode"]) == ("exited", 128 + 9)  # SIGKILL at 1 s
        big = run(rt, "s1", "head -c 2000000 /dev/zero > big; echo $?; wc -c < big")
        assert big["output"] == "File size limit exceeded\n153\n1048576\n"  # 128 + SIGXFSZ
    leaks.assert_none()


def test_commands_run_as_an_unprivileged_user(rt: Runtime) -> None:
    # A root server hands the sandbox to a uid of the principal's own (the first of the
    # range on a new root): RLIMIT_NPROC never binds root.
    expected = f"{FIRST_UID} {FIRST_UID}" if os.getuid() == 0 else f"{os.getuid()} {os.getgid()}"
    assert run(rt, "s1", 'echo "$(id -u) $(id -g)"')["output"] == expected + "\n"


def test_without_bubblewrap_the_workspace_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(monkeypatch, bwrap="/nonexistent/bwrap")
    before = set(threading.enumerate())
    with pytest.raises(SandboxUnavailableError) as refused:
        Runtime(servers=[Workspace], scan_interval=60)  # with its reaper thread
    # The refused runtime closed itself: its reaper thread is gone, nothing is left behind.
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []
    message = str(refused.value)
    assert "'/nonexistent/bwrap'" in message and "CTXACTORS_WORKSPACE_BWRAP" in message
    assert "Debian package `bubblewrap`" in message
    assert "CTXACTORS_WORKSPACE_SANDBOX=none" in message


def test_a_bwrap_that_cannot_sandbox_is_refused_with_its_own_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(monkeypatch, bwrap="/bin/false")
    with pytest.raises(SandboxUnavailableError, match="could not start a sandbox: exit status 1"):
        Runtime(servers=[Workspace], scan_interval=0)


def test_serve_refuses_to_start_without_bubblewrap_in_one_line(workspace_root: str) -> None:
    env = {
        **os.environ,
        "CTXACTORS_WORKSPACE_BWRAP": "/nonexistent/bwrap",
        "CTXACTORS_WORKSPACE_ROOT": workspace_root,
    }
    assert "install the Debian package `bubblewrap`" in serve_refusal(env)


def test_the_none_mode_warns_at_start_and_on_every_command(
    monkeypatch: pytest.MonkeyPatch, leaks: Leaks
) -> None:
    configure(monkeypatch, mode="none")
    with capture_logs() as logs, Runtime(servers=[Workspace]) as rt:
        run(rt, "s1", "true")
        run(rt, "s1", "true")
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert warnings == ["workspace_unsandboxed", "command_unsandboxed", "command_unsandboxed"]
    assert all("unsandboxed" in e["warning"] for e in logs if e["log_level"] == "warning")
    leaks.assert_none()


def test_bad_settings_fail_loudly_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value, words in [
        ("CTXACTORS_WORKSPACE_SANDBOX", "docker", "bwrap or none"),
        ("CTXACTORS_WORKSPACE_NETWORK", "maybe", "on/off"),
        ("CTXACTORS_WORKSPACE_ENV", "GOOD,BAD-NAME", "BAD-NAME"),
        ("CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST", "nobody", "a uid (a number) or none"),
        ("CTXACTORS_WORKSPACE_MAX_PROCESSES", "0", "at least 1"),
    ]:
        with monkeypatch.context() as env:
            env.setenv(name, value)
            with pytest.raises(ValueError, match=name) as bad:
                SandboxSettings.from_env()
            assert words in str(bad.value)


SERVER = """
import sys
from ctxactors import Runtime
from ctxactors.servers.workspace import Workspace

rt = Runtime(servers=[Workspace])
rt.call("execute_command", {"command": sys.argv[1], "__sessionId": "s1"})
print("started", flush=True)
sys.stdin.read()
"""


def test_a_killed_server_takes_its_sandboxes_with_it(workspace_root: str) -> None:
    """kill -9 runs no cleanup: --die-with-parent ends the sandboxes, children included."""
    marker = f"1000.{os.getpid()}9"
    env = {**os.environ, "CTXACTORS_WORKSPACE_ROOT": workspace_root}
    with subprocess.Popen(
        [sys.executable, "-c", SERVER, BACKGROUND.format(m=marker)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as server:
        assert server.stdout is not None and server.stdout.readline() == "started\n"
        assert wait_until(lambda: len(sleepers(marker)) == 5, WAIT), sleepers(marker)
        server.kill()
        server.wait()
    assert wait_until(lambda: sleepers(marker) == [], WAIT)


def test_bubblewrap_is_probed_once_and_the_configured_program_runs_every_command(
    monkeypatch: pytest.MonkeyPatch, leaks: Leaks
) -> None:
    # A wrapper that counts its runs; the sandbox users (under a root server) must
    # run it and append to the count, so not under pytest's private tmp_path.
    where = tempfile.mkdtemp(prefix="ctxactors-test-bwrap-")
    try:
        os.chmod(where, 0o755)
        calls, wrapper = os.path.join(where, "calls"), os.path.join(where, "bwrap")
        with open(wrapper, "w") as script:
            script.write(
                f'#!/bin/sh\necho x >> {calls}\nexec {SandboxSettings.from_env().bwrap} "$@"\n'
            )
        open(calls, "w").close()
        os.chmod(wrapper, 0o755)
        os.chmod(calls, 0o666)
        configure(monkeypatch, bwrap=wrapper)
        with Runtime(servers=[Workspace]) as first, Runtime(servers=[Workspace]) as second:
            # The probe, once for both runtimes: `bwrap --version`, then a sandbox.
            assert open(calls).read() == "x\nx\n"
            run(first, "s1", "true")
            run(second, "s1", "true")
            assert open(calls).read() == "x\nx\nx\nx\n"
        leaks.assert_none()
    finally:
        shutil.rmtree(where)
