"""Sandboxes that share nothing with their neighbours: a uid per principal, a seccomp filter.

Real bubblewrap and real kernel state: the keyring calls a command makes, the inotify
instances a uid holds. Switching uids needs a root server; those tests skip otherwise.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import psutil
import pytest
from mcp_support import pids_of
from workspace_support import WAIT, Leaks, grouped_runtime, start, wait_done, wait_output

from ctxactors import Runtime
from ctxactors.servers.workspace_dirs import SessionDirs
from ctxactors.settings import FIRST_UID, SandboxSettings
from ctxactors.testing import context_args, wait_until

pytestmark = pytest.mark.usefixtures("workspace_root")
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only a root server switches uids")

# One system call from inside the sandbox: its result, or the error it failed with.
SYSCALL = """python3 -c '
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
got = libc.syscall(*[int(a) for a in sys.argv[1:]])
print(got if got >= 0 else os.strerror(ctypes.get_errno()))
' """
KEYCTL_GET_USER_KEYRING = "250 0 -4 0"  # keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING)
ADD_KEY = "248 0 0 0 0 -4"  # add_key(NULL type...): EPERM before the kernel reads it
# Opens inotify instances until the kernel refuses one, says how many, and holds them.
HOLD_INOTIFY = """python3 -c '
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
held = 0
while libc.inotify_init() >= 0:
    held += 1
print(held, os.strerror(ctypes.get_errno()), flush=True)
time.sleep(1000)
'"""
ONE_INOTIFY = """python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("ok" if libc.inotify_init() >= 0 else os.strerror(ctypes.get_errno()))
'"""


def runtime(leaks: Leaks, **sandbox: Any) -> contextlib.AbstractContextManager[Runtime]:
    return grouped_runtime(leaks, sandbox=sandbox)


def run(rt: Runtime, session: str, command: str, principal: str | None) -> str:
    done = wait_done(
        rt, session, start(rt, session, command, principal=principal), principal=principal
    )
    assert done["status"] == "exited", done
    return str(done["output"])


@root_only
def test_each_principal_runs_as_a_uid_of_its_own_kept_across_restarts(
    leaks: Leaks, workspace_root: str
) -> None:
    who = 'echo "$(id -u) $(id -g) $(stat -c %u /workspace)"'
    with runtime(leaks) as rt:
        assert run(rt, "a1", who, "alice") == f"{FIRST_UID} {FIRST_UID} {FIRST_UID}\n"
        assert run(rt, "b1", who, "bob") == f"{FIRST_UID + 1} {FIRST_UID + 1} {FIRST_UID + 1}\n"
        assert run(rt, "a2", who, "alice") == f"{FIRST_UID} {FIRST_UID} {FIRST_UID}\n"
        assert run(rt, "n1", who, None) == f"{FIRST_UID + 2} {FIRST_UID + 2} {FIRST_UID + 2}\n"
    with runtime(leaks) as again:  # a restart on the same root: bob asks first this time
        assert run(again, "b2", "id -u", "bob") == f"{FIRST_UID + 1}\n"
        assert run(again, "a3", "id -u", "alice") == f"{FIRST_UID}\n"
        assert run(again, "c1", "id -u", "carol") == f"{FIRST_UID + 3}\n"


@root_only
def test_an_exhausted_uid_range_refuses_new_principals_only(leaks: Leaks) -> None:
    with runtime(leaks, uid_first=FIRST_UID + 500, uid_count=2) as rt:
        assert run(rt, "a1", "id -u", "alice") == f"{FIRST_UID + 500}\n"
        assert run(rt, "b1", "id -u", "bob") == f"{FIRST_UID + 501}\n"
        refused = rt.call("execute_command", context_args("c1", command="id -u"), principal="carol")
        assert refused.is_error and refused.text == (
            f"no sandbox uid is left for a new principal: all 2 from {FIRST_UID + 500} "
            "(CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST, CTXACTORS_WORKSPACE_SANDBOX_UID_COUNT) are "
            "taken; the operator must widen the range"
        )
        assert run(rt, "a2", "id -u", "alice") == f"{FIRST_UID + 500}\n"


def test_the_kernel_keyrings_are_out_of_reach(leaks: Leaks) -> None:
    with runtime(leaks) as rt:
        assert run(rt, "s1", SYSCALL + KEYCTL_GET_USER_KEYRING, "alice") == (
            "Operation not permitted\n"
        )
        assert run(rt, "s1", SYSCALL + ADD_KEY, "alice") == "Operation not permitted\n"
        listed = run(rt, "s1", "cat /proc/keys /proc/key-users; echo $?", "alice")
        assert listed.endswith("1\n") and "keyring" not in listed


@root_only
def test_one_tenants_inotify_instances_leave_anothers_alone(leaks: Leaks) -> None:
    with open("/proc/sys/fs/inotify/max_user_instances") as f:
        per_uid = int(f.read())
    # Uids of this test's own: the kernel counts instances per uid across the machine, so a
    # test beside this one (another pytest-xdist worker) must not run as mallory's uid.
    with runtime(leaks, uid_first=FIRST_UID + 1500) as rt:
        holder = start(rt, "m1", HOLD_INOTIFY, principal="mallory")
        held = wait_output(rt, "m1", holder, "Too many", principal="mallory")["output"]
        assert held == f"{per_uid} Too many open files\n"
        assert run(rt, "a1", ONE_INOTIFY, "alice") == "ok\n"
        # Within one tenant the instances are shared: the kernel counts them per uid.
        assert run(rt, "m2", ONE_INOTIFY, "mallory") == "Too many open files\n"


def uid_processes(uid: int) -> list[int]:
    """Processes of `uid`, zombies included (they count against RLIMIT_NPROC until this
    machine's init reaps them, a second or two after a sandbox's init is orphaned)."""
    out = []
    for p in psutil.process_iter(["uids"]):
        uids = p.info["uids"]
        if uids is not None and uids.real == uid:
            out.append(p.pid)
    return out


@root_only
def test_without_cgroups_the_uids_process_limit_holds_across_its_sandboxes(
    leaks: Leaks,
) -> None:
    """The fallback measured: RLIMIT_NPROC set on bwrap (outside its user namespace) caps
    the principal's uid in every sandbox together."""
    marker = f"1000.{os.getpid()}9"
    uid = FIRST_UID + 1000  # this test's own: no other test's sandbox ends as this uid
    with grouped_runtime(
        leaks, budget={"cgroups": "off", "principal_processes": 64}, sandbox={"uid_first": uid}
    ) as rt:
        assert wait_until(lambda: not uid_processes(uid), WAIT)  # the probe's, reaped
        # 60 sleepers: with the outer bwrap, its init and the shell, 63 of mallory's 64.
        command = f"for i in $(seq 60); do sleep {marker} & done; echo started; wait"
        first = start(rt, "m1", command, principal="mallory")
        assert "started" in wait_output(rt, "m1", first, "started", principal="mallory")["output"]
        assert wait_until(lambda: len(pids_of(["sleep", marker])) == 60, WAIT)
        # Settled: a shell may hold a 64th for a moment (a fork not yet reaped), within the limit.
        assert wait_until(
            lambda: len(uid_processes(uid)) == 63, WAIT, describe=lambda: uid_processes(uid)
        )
        # Another session's sandbox of hers can't even be made; alice's can.
        assert run(rt, "m2", "echo never", "mallory") == (
            "bwrap: Creating new namespace failed: Resource temporarily unavailable\n"
        )
        assert run(rt, "a1", "echo ok", "alice") == "ok\n"
        assert rt.end_session("m1", principal="mallory") == 1
        assert wait_until(lambda: not uid_processes(uid), WAIT)
        assert run(rt, "m2", "echo back", "mallory") == "back\n"


@root_only
def test_a_kept_directory_of_the_old_shared_user_is_handed_to_its_principal(
    tmp_path: Path,
) -> None:
    """Directories kept by a version that ran every sandbox as nobody: on their next use
    everything in them goes to the principal's uid, and a link planted inside can't point
    the chown at anything outside."""
    root = tmp_path / "root"
    root.mkdir(mode=0o711)
    dirs = SessionDirs(str(root), SandboxSettings(uid_first=FIRST_UID))
    kept = Path(dirs.path(("alice", "s1")))
    (kept / "sub").mkdir(parents=True)
    (kept / "sub" / "file").write_text("x")
    outside = tmp_path / "outside"
    outside.write_text("the host's")
    (kept / "link").symlink_to(outside)
    for path in (kept, kept / "sub", kept / "sub" / "file", kept / "link"):
        os.chown(path, 65534, 65534, follow_symlinks=False)
    ids = (FIRST_UID + 7, FIRST_UID + 7)
    assert dirs.open(("alice", "s1"), ids) == str(kept)
    owners = {
        p.relative_to(kept).as_posix(): (p.lstat().st_uid, p.lstat().st_gid)
        for p in (kept, kept / "sub", kept / "sub" / "file", kept / "link")
    }
    assert owners == dict.fromkeys([".", "sub", "sub/file", "link"], ids)
    assert (outside.stat().st_uid, outside.read_text()) == (0, "the host's")
