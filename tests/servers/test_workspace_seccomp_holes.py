"""The seccomp filter's holes an attacker's pass found (attack27b), closed: blocks taken with
no write (``fallocate`` inside a sparse file's size, a shared writable mapping in
delete-only), a filter that failed open without pyseccomp, a call libseccomp doesn't know,
and ``rm`` stopped by the disk watch past the walk's bound.

Real bubblewrap, real files, a real SQLite store; measured budgets forced with ``disk=off``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from test_workspace_delete_only import chain_past_the_bound
from test_workspace_disk_budget import MIB, disk_runtime, disks_of, run
from workspace_support import Leaks, call, start, wait_done

from ctxactors import sandbox_seccomp
from ctxactors.sandbox_disk import MAX_ENTRIES
from ctxactors.servers.workspace import Workspace
from ctxactors.state import SQLiteStore

pytestmark = pytest.mark.usefixtures("workspace_root")

# Sparse files up to the budget (0 blocks), then fallocate inside them: no size change, so
# no RLIMIT_FSIZE check; on main mode 0 took 3 GiB in 4 ms under a 1 GiB budget.
# posix_fallocate still works: glibc falls back to writing (under the limit, at disk speed).
FALLOCATE = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("s", os.O_CREAT | os.O_RDWR)
os.ftruncate(fd, 32 << 20)
for name, mode in [("mode0", 0), ("zero_range", 0x10), ("unshare", 0x40)]:
    done = libc.fallocate(fd, mode, ctypes.c_long(0), ctypes.c_long(32 << 20))
    print(name, "ok" if done == 0 else errno.errorcode[ctypes.get_errno()])
print("blocks", os.fstat(fd).st_blocks)
os.posix_fallocate(fd, 0, 1 << 20)
print("posix blocks", os.fstat(fd).st_blocks)
done = libc.fallocate(fd, 3, ctypes.c_long(0), ctypes.c_long(1 << 20))  # punch a hole
print("punch", "ok" if done == 0 else errno.errorcode[ctypes.get_errno()], os.fstat(fd).st_blocks)
"""


def test_fallocate_inside_a_sparse_file_takes_no_blocks(store: SQLiteStore, leaks: Leaks) -> None:
    with disk_runtime(leaks, store, disk="off", principal_disk_bytes=64 * MIB) as rt:
        script = "cat > f.py <<'EOF'\n" + FALLOCATE + "EOF\npython3 f.py"
        assert run(rt, "m1", script, "mallory")["output"] == (
            "mode0 ENOTSUP\nzero_range ENOTSUP\nunshare ENOTSUP\nblocks 0\n"
            "posix blocks 2048\npunch ok 0\n"
        )
        assert disks_of(rt).measure("mallory")[0] < MIB


# A delete-only command's attempts to write into an earlier command's sparse file: opened
# for writing (then a shared mapping's page faults take blocks, never checked against
# RLIMIT_FSIZE 0: 512 MiB under a 64 MiB budget on main), or mapped shared and writable
# from a read-only descriptor (the kernel refuses that one). It still reads, lists, deletes
# and runs with the OOM killer's highest score (choom runs outside the sandbox).
MMAP = r"""
import errno, mmap, os, sys
for name, flags in [("wronly", os.O_WRONLY), ("rdwr", os.O_RDWR), ("ioctl_only", 3)]:
    try:
        fd = os.open(sys.argv[1], flags)
    except OSError as exc:
        print(name, errno.errorcode[exc.errno])
        continue
    with mmap.mmap(fd, 32 << 20) as m:
        for off in range(0, 32 << 20, 4096):
            m[off] = 1
    print(name, "filled")
fd = os.open(sys.argv[1], os.O_RDONLY)
try:
    mmap.mmap(fd, 32 << 20, access=mmap.ACCESS_WRITE)
except OSError as exc:
    print("shared_from_read_only", errno.errorcode[exc.errno])
"""


def test_delete_only_opens_nothing_for_writing(store: SQLiteStore, leaks: Leaks) -> None:
    with disk_runtime(leaks, store, disk="off", principal_disk_bytes=4 * MIB) as rt:
        disks = disks_of(rt)
        assert run(rt, "m1", "cat > m.py <<'EOF'\n" + MMAP + "EOF\n", "mallory")["output"] == ""
        # Past the walk's bound, as an earlier command could have made it (made here: the
        # watch may stop a command making it part way), with a sparse file at the bottom.
        top, deep = chain_past_the_bound(rt, "mallory", "m1")
        hole = os.path.join(top, deep, "hole")
        with open(hole, "wb") as f:
            f.truncate(32 * MIB)
        owner = os.stat(os.path.join(top, deep))  # the principal's uid, as the chain's
        os.chown(hole, owner.st_uid, owner.st_gid)
        wait_done(rt, "m1", start(rt, "m1", "true", principal="mallory"), principal="mallory")
        assert disks.measure("mallory")[1] == MAX_ENTRIES + 1
        command = f"python3 m.py {deep}/hole; cat /proc/self/oom_score_adj; cat m.py | wc -l"
        answer = call(rt, "m1", "execute_command", command=command, principal="mallory")
        assert answer["warning"] == disks.too_many()
        done = wait_done(rt, "m1", answer["processId"], principal="mallory")
        assert done["status"] == "exited", done
        assert done["output"] == (
            f"[ctxactors: {disks.too_many()}]\nwronly EDQUOT\nrdwr EDQUOT\nioctl_only EDQUOT\n"
            f"shared_from_read_only EACCES\n1000\n{MMAP.count(chr(10))}\n"
        )
        assert os.stat(hole).st_blocks == 0
        # rm works, and then the principal writes again.
        rm = call(rt, "m1", "execute_command", command="rm -rf n; ls", principal="mallory")
        assert wait_done(rt, "m1", rm["processId"], principal="mallory")["output"] == (
            f"[ctxactors: {disks.too_many()}]\nm.py\n"
        )
        assert run(rt, "m1", "echo x > y; cat y", "mallory")["output"] == "x\n"


def test_rm_past_the_walks_bound_is_never_stopped(store: SQLiteStore, leaks: Leaks) -> None:
    """Deleting lets the partial walk reach files it never counted (their bytes 'grew'): a
    delete-only command is never stopped. On main rm was stopped as 'killed'."""
    with disk_runtime(leaks, store, disk="off", principal_disk_bytes=64 * MIB) as rt:
        run(rt, "m1", "true", "mallory")
        top = Workspace._kept[rt].path(("mallory", "m1"))  # noqa: SLF001
        uid, gid = Workspace.tenants(rt).ids("mallory")  # type: ignore[union-attr]
        os.mkdir(os.path.join(top, "d"))
        for i in range(MAX_ENTRIES + 2000):
            os.close(os.open(os.path.join(top, "d", f"{i:x}"), os.O_CREAT | os.O_WRONLY))
        for name in ("b0", "b1", "b2", "b3", "b4", "b5"):  # ones the walk reaches after d
            with open(os.path.join(top, name), "wb") as f:
                f.write(b"x" * (100 * MIB // 6))
        subprocess.run(["chown", "-R", f"{uid}:{gid}", top], check=True)
        wait_done(rt, "m1", start(rt, "m1", "true", principal="mallory"), principal="mallory")
        assert disks_of(rt).measure("mallory")[1] == MAX_ENTRIES + 1
        p = start(rt, "m1", "rm -rf d; echo rc=$?", principal="mallory")
        done = wait_done(rt, "m1", p, principal="mallory")
        assert (done["status"], done["output"][-5:]) == ("exited", "rc=0\n"), done
        assert not os.path.exists(os.path.join(top, "d"))


# A call libseccomp 2.5 can't name (open_tree_attr, Linux 6.15: it clones mounts), denied by
# its number: without the filter it opens "." (an O_PATH descriptor).
OPEN_TREE_ATTR = (
    "python3 -c 'import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
    'print(libc.syscall(467, -100, b".", 0, None, 0), ctypes.get_errno())\''
)


def test_calls_libseccomp_cant_name_are_denied_by_number(store: SQLiteStore, leaks: Leaks) -> None:
    with disk_runtime(leaks, store, disk="off") as rt:
        assert run(rt, "s1", OPEN_TREE_ATTR, "alice")["output"] == "-1 1\n"  # EPERM


def test_a_call_nobody_can_name_builds_no_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sandbox_seccomp.DENIED, "no_such_call", "test")
    sandbox_seccomp.program.cache_clear()
    try:
        assert sandbox_seccomp.program() == (
            "libseccomp doesn't know the system call no_such_call (nor this server): update both"
        )
    finally:
        monkeypatch.undo()
        sandbox_seccomp.program.cache_clear()
    assert isinstance(sandbox_seccomp.program(), bytes)


# An embedded runtime without pyseccomp (as with a core install on main, where it was in the
# serve extra): its sandboxes ran with no filter at all.
WITHOUT_PYSECCOMP = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "pyseccomp":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())

from ctxactors import Runtime
from ctxactors.errors import SandboxUnavailableError
from ctxactors.servers.workspace import Workspace
from ctxactors.testing import context_args

try:
    with Runtime([Workspace]) as rt:
        print("started:", Workspace.tenants(rt).describe()["seccomp"])
except SandboxUnavailableError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize(
    ("seccomp", "printed"),
    [
        (
            None,
            "refused: the workspace sandbox's seccomp filter can't be built: pyseccomp is not "
            "installed: install pyseccomp (a dependency of ctxactors) and the Debian package "
            "libseccomp2; or set CTXACTORS_WORKSPACE_SECCOMP=auto to run sandboxes without it",
        ),
        (
            "auto",
            "started: none: pyseccomp is not installed: install pyseccomp (a dependency of "
            "ctxactors) and the Debian package libseccomp2",
        ),
    ],
)
def test_no_sandbox_runs_unfiltered_unless_the_operator_says_so(
    seccomp: str | None, printed: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CTXACTORS_WORKSPACE_SECCOMP"}
    if seccomp is not None:
        env["CTXACTORS_WORKSPACE_SECCOMP"] = seccomp
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WITHOUT_PYSECCOMP)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == printed
